"""Traversal verification (ALGORITHMS.md §12; Weng et al., arXiv 2505.12398).

Leaf-to-root, sequence-level acceptance over a sampled tree. Each node u holds a target vector
P_u, the draft vector Q_u its children were drawn from, and a weight a_u (a_root = 1,
a_c = min(1, a_u P_u(c)/Q_u(c))). Repeatedly take the first live node in post-order v:
accept it with probability a_v (emit root->v and y ~ P_v), else remove it and update its parent u:
    S = sum_z [a_u P_u - Q_u]_+ ;  P_u <- norm([a_u P_u - Q_u]_+) ;  a_u <- S / (S + 1 - a_u)
    scheme (a) (children without replacement, or distinct first appearances of i.i.d. draws):
        Q_u <- norm(Q_u with the rejected token zeroed)
    scheme (b) (i.i.d. children, duplicates kept): Q_u unchanged
then re-weight u's live subtree. On a chain this is exactly BV (§3). Lossless per iteration.
"""

from __future__ import annotations

import numpy as np

from verispec.core.rng import Rng
from verispec.core.rows import draw_from
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at

_WITHOUT_REPLACEMENT_SCHEMES = frozenset({DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT, DraftScheme.CHAIN})


class TraversalVerification(Verifier):
    name = "traversal"
    section = "§12"
    lossless = True
    supported_schemes = frozenset(
        {DraftScheme.CHAIN, DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT, DraftScheme.IID_TREE}
    )

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        update_draft = tree.scheme in _WITHOUT_REPLACEMENT_SCHEMES
        target_rows, draft_rows = tree.target, tree.draft
        target = {}  # node -> mutated P_u (copy on write); absent: the tree's row
        draft = {}  # node -> mutated Q_u
        live_children = [list(kids) for kids in tree.children]
        # a_u, computed when first needed: a_c = min(1, a_u P_u(c)/Q_u(c)) depends on the root
        # path only, so the first post-order leaf needs one row entry per ancestor, not the tree
        weight: dict[int, float] = {ROOT: 1.0}

        def entry(rows, mutated, node, token):
            row = mutated.get(node)
            return float(row[token]) if row is not None else rows.prob(node, token)

        def weight_of(node):
            missing = []
            while node not in weight:
                missing.append(node)
                node = int(tree.parents[node])
            for child in reversed(missing):
                parent, token = int(tree.parents[child]), int(tree.tokens[child])
                q_c = entry(draft_rows, draft, parent, token)
                p_c = entry(target_rows, target, parent, token)
                weight[child] = min(1.0, weight[parent] * p_c / q_c) if q_c > 0 else 0.0
            return weight[missing[0]] if missing else weight[node]

        def forget_below(node):
            # P_u, Q_u or a_u changed: the weights of u's live subtree are recomputed on demand
            stack = list(live_children[node])
            while stack:
                child = stack.pop()
                weight.pop(child, None)
                stack.extend(live_children[child])

        def law_at(node):
            return lambda: (target[node], False) if node in target else (target_rows.row(node), False)

        while True:
            node = ROOT
            while live_children[node]:
                node = live_children[node][0]
            if node == ROOT:
                return result_at(tree, ROOT, draw_from(rng, target_rows, ROOT, law_at(ROOT))[0], False)
            if rng.bernoulli(weight_of(node)):
                is_bonus = not tree.children[node]
                return result_at(tree, node, draw_from(rng, target_rows, node, law_at(node))[0], is_bonus)
            parent = int(tree.parents[node])
            token = int(tree.tokens[node])
            live_children[parent].remove(node)
            parent_weight = weight_of(parent)
            if parent_weight == 0.0:
                # S = 0, a_u stays 0 and every remaining child has weight 0: nothing to update
                continue
            if target_rows.greedy:
                # P_u is a point mass at its argmax a: [a_u P_u - Q_u]_+ lives on {a}, so P_u is
                # unchanged (or kept when S = 0) and S = [a_u - Q_u(a)]_+ needs one entry per row
                top = target_rows.argmax(parent)
                mass = max(parent_weight * entry(target_rows, target, parent, top) - entry(draft_rows, draft, parent, top), 0.0)
            else:
                p_row = target.get(parent, target_rows.row(parent))
                surplus = parent_weight * p_row
                surplus -= draft.get(parent, draft_rows.row(parent))
                np.maximum(surplus, 0.0, out=surplus)
                mass = float(surplus.sum())
                if mass > 0.0:  # S = 0 is legitimate (a_u P_u <= Q_u everywhere): P_u is then kept
                    surplus /= mass
                    target[parent] = surplus
            # denominator = sum [Q_u - a_u P_u]_+ > 0 in exact arithmetic; it can round to 0 only on a
            # branch of probability ~1e-16 (a child rejected with weight 1 - eps)
            denominator = mass + 1.0 - parent_weight
            weight[parent] = min(1.0, mass / denominator) if denominator > 0.0 else 1.0
            if update_draft:
                q_row = draft.get(parent, draft_rows.row(parent))
                remaining = 1.0 - float(q_row[token])  # Q_u sums to 1: no pass over V needed
                reduced = q_row / remaining if remaining > 0 else q_row.copy()
                reduced[token] = 0.0
                draft[parent] = reduced
            forget_below(parent)

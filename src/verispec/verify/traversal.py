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
from verispec.core.rows import draw_on_support
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at
from verispec.verify.support import positions_of, realigned, value_at

_WITHOUT_REPLACEMENT_SCHEMES = frozenset({DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT, DraftScheme.CHAIN})


class TraversalVerification(Verifier):
    """§12 on the row providers (core.rows), P_u kept on the target's support.

    Where each quantity lives, S_u = supp(p(.|u)), ids, p_S = target.support(u):
      P_u   starts as p(.|u) and is replaced by norm([a_u P_u - Q_u]_+), which is 0 wherever P_u
            is (a positive part of a non-positive number): P_u vanishes outside S_u, is kept over
            ids, and P_u(c) of a child token c outside S_u is 0.
      S     sum_z [a_u P_u(z) - Q_u(z)]_+ has no term outside S_u (P_u = 0 there): a sum over ids.
      Q_u   q(.|u) with the rejected tokens x_1..x_k zeroed and renormalised one at a time,
            Q <- Q / (1 - Q(x)) (Q sums to 1, so the normaliser is one entry): kept as a scalar
            scale, Q_u(z) = q(z) * scale for z not removed, so Q_u's mass outside S_u (which the
            renormalisation covers) costs nothing; over ids it is draft.gather(u, ids) * scale.
    A node's target is read through entries until one of its children is rejected; no step reads
    all V entries of a row. Greedy target rows keep P_u = p (see below).
    """

    name = "traversal"
    section = "§12"
    lossless = True
    supported_schemes = frozenset(
        {DraftScheme.CHAIN, DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT, DraftScheme.IID_TREE}
    )

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        update_draft = tree.scheme in _WITHOUT_REPLACEMENT_SCHEMES
        target_rows, draft_rows = tree.target, tree.draft
        support = {}  # node -> (ids, p over ids, q over ids), read at the first rejection below it
        target = {}  # node -> mutated P_u over its support's ids; absent: the tree's row
        draft_scale = {}  # node -> scale of Q_u = q * scale off the removed tokens; absent: 1
        removed = {}  # node -> tokens zeroed in Q_u (scheme (a))
        live_children = [list(kids) for kids in tree.children]
        # a_u, computed when first needed: a_c = min(1, a_u P_u(c)/Q_u(c)) depends on the root
        # path only, so the first post-order leaf needs one row entry per ancestor, not the tree
        weight: dict[int, float] = {ROOT: 1.0}

        def target_entry(node, token):
            mutated = target.get(node)
            return value_at(support[node][0], mutated, token) if mutated is not None else target_rows.prob(node, token)

        def draft_entry(node, token):
            if token in removed.get(node, ()):
                return 0.0
            return draft_rows.prob(node, token) * draft_scale.get(node, 1.0)

        def weight_of(node):
            missing = []
            while node not in weight:
                missing.append(node)
                node = int(tree.parents[node])
            if not missing:
                return weight[node]
            chain = missing[::-1]  # top-down from the first ancestor with a known weight
            parents = [int(tree.parents[child]) for child in chain]
            tokens = [int(tree.tokens[child]) for child in chain]
            # the entries of untouched rows in one batched read (LogitRows prepares those rows
            # together); rows updated by a rejection are read from their kept P_u / Q_u scale
            fresh = [i for i, parent in enumerate(parents) if parent not in target]
            p_fresh = target_rows.probs_of([parents[i] for i in fresh], [tokens[i] for i in fresh]) if fresh else ()
            p_of = dict(zip(fresh, p_fresh))
            q_raw = draft_rows.probs_of(parents, tokens)
            for i, child in enumerate(chain):
                parent, token = parents[i], tokens[i]
                p_c = float(p_of[i]) if i in p_of else target_entry(parent, token)
                q_c = 0.0 if token in removed.get(parent, ()) else float(q_raw[i]) * draft_scale.get(parent, 1.0)
                weight[child] = min(1.0, weight[parent] * p_c / q_c) if q_c > 0 else 0.0
            return weight[missing[0]]

        def forget_below(node):
            # P_u, Q_u or a_u changed: the weights of u's live subtree are recomputed on demand
            stack = list(live_children[node])
            while stack:
                child = stack.pop()
                weight.pop(child, None)
                stack.extend(live_children[child])

        def draw_at(node):
            """y ~ P_node, on the target's support (P_u vanishes outside it)."""
            mutated = target.get(node)
            if mutated is None:
                return draw_on_support(rng, target_rows, node)[0]
            kept_ids = support[node][0]
            return draw_on_support(rng, target_rows, node, lambda ids, _p: (realigned(kept_ids, mutated, ids), 0))[0]

        while True:
            node = ROOT
            while live_children[node]:
                node = live_children[node][0]
            if node == ROOT:
                return result_at(tree, ROOT, draw_at(ROOT), False)
            if rng.bernoulli(weight_of(node)):
                is_bonus = not tree.children[node]
                return result_at(tree, node, draw_at(node), is_bonus)
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
                mass = max(parent_weight * target_entry(parent, top) - draft_entry(parent, top), 0.0)
            else:
                if parent not in support:
                    ids, p_support = target_rows.support(parent)
                    support[parent] = (ids, p_support, draft_rows.gather(parent, ids))
                ids, p_support, q_support = support[parent]
                q_now = q_support * draft_scale.get(parent, 1.0)  # Q_u over ids (a new array)
                # Q_u as §12 defines it; the law would not change without this line: a rejected
                # child x had a_u P_u(x) < Q_u(x), so P_u(x) = 0 since, and the surplus at x is 0
                q_now[positions_of(ids, removed.get(parent, ()))] = 0.0
                surplus = parent_weight * target.get(parent, p_support)
                surplus -= q_now
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
                remaining = 1.0 - draft_entry(parent, token)  # Q_u sums to 1: no pass over V needed
                if remaining > 0:
                    draft_scale[parent] = draft_scale.get(parent, 1.0) / remaining
                removed.setdefault(parent, set()).add(token)
            forget_below(parent)

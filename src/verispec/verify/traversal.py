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
        target = {}  # node -> mutated P_u (copy on write)
        draft = {}  # node -> mutated Q_u
        live_children = [list(kids) for kids in tree.children]
        weight = np.ones(tree.num_nodes)

        def target_of(node):
            return target.get(node, tree.target_probs[node])

        def draft_of(node):
            return draft.get(node, tree.draft_probs[node])

        def reweight(node):
            # a_c = min(1, a_u P_u(c)/Q_u(c)) for the live subtree below ``node``
            stack = [node]
            while stack:
                parent = stack.pop()
                p_row, q_row = target_of(parent), draft_of(parent)
                for child in live_children[parent]:
                    token = tree.tokens[child]
                    weight[child] = min(1.0, weight[parent] * p_row[token] / q_row[token]) if q_row[token] > 0 else 0.0
                    stack.append(child)

        reweight(ROOT)
        while True:
            node = ROOT
            while live_children[node]:
                node = live_children[node][0]
            if node == ROOT:
                return result_at(tree, ROOT, rng.categorical(target_of(ROOT)), False)
            if rng.bernoulli(weight[node]):
                is_bonus = not tree.children[node]
                return result_at(tree, node, rng.categorical(target_of(node)), is_bonus)
            parent = int(tree.parents[node])
            token = int(tree.tokens[node])
            live_children[parent].remove(node)
            if weight[parent] == 0.0:
                # S = 0, a_u stays 0 and every remaining child has weight 0: nothing to update
                continue
            p_row, q_row = target_of(parent), draft_of(parent)
            surplus = weight[parent] * p_row
            surplus -= q_row
            np.maximum(surplus, 0.0, out=surplus)
            mass = float(surplus.sum())
            if mass > 0.0:  # S = 0 is legitimate (a_u P_u <= Q_u everywhere): P_u is then kept
                surplus /= mass
                target[parent] = surplus
            # denominator = sum [Q_u - a_u P_u]_+ > 0 in exact arithmetic; it can round to 0 only on a
            # branch of probability ~1e-16 (a child rejected with weight 1 - eps)
            denominator = mass + 1.0 - weight[parent]
            weight[parent] = min(1.0, mass / denominator) if denominator > 0.0 else 1.0
            if update_draft:
                remaining = 1.0 - float(q_row[token])  # Q_u sums to 1: no pass over V needed
                reduced = q_row / remaining if remaining > 0 else q_row.copy()
                reduced[token] = 0.0
                draft[parent] = reduced
            reweight(parent)

"""SpecInfer naive speculative sampling, NSS (ALGORITHMS.md §13).

At node u draw y ~ p(.|u). If y is the token of a child of u, move to that child (the first one
in sampling order when children repeat) and repeat; otherwise emit y and stop. At a leaf the draw
is the bonus token. Every emitted token is an exact draw from the target, so the rule is lossless
for any tree, whatever its sampling scheme (DETERMINISTIC top-k trees included); the acceptance
at u is the sum of p(c|u) over the distinct child tokens c.

The draw y ~ p(.|u) at an internal node is made in two exact stages so that no O(V) sampling
happens while children are hit: first a categorical over {each distinct child token c: p(c)} ∪
{miss: the remaining mass}; only on a miss is y drawn from p restricted to the non-child tokens
(shape (V,), one O(V) draw). The output law is the same as one draw from p(.|u).
"""

from __future__ import annotations

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD
from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at


class NaiveSpecInfer(Verifier):
    name = "nss"
    section = "§13"
    lossless = True
    supported_schemes = frozenset(DraftScheme)

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        node = ROOT
        while True:
            target = tree.target_probs[node]
            children = tree.children[node]
            if not children:
                return result_at(tree, node, rng.categorical(target), True)
            child_of: dict[int, int] = {}
            for child in children:
                child_of.setdefault(int(tree.tokens[child]), child)
            tokens = list(child_of)
            hit = target[tokens]
            total = float(target.sum())
            miss = max(total - float(hit.sum()), 0.0)
            choice = rng.categorical(np.append(hit, miss) / (float(hit.sum()) + miss))
            if choice < len(tokens):
                node = child_of[tokens[choice]]
                continue
            rest = target.copy()
            rest[tokens] = 0.0
            mass = rest.sum()
            if not mass > RESIDUAL_MASS_GUARD:  # a miss of probability ~0 (rounding only)
                return result_at(tree, node, rng.categorical(target), False, diagnostics={"residual_guard_hits": 1})
            rest /= mass
            return result_at(tree, node, rng.categorical(rest), False)

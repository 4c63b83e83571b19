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
from verispec.core.rows import draw_from
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
            children = tree.children[node]
            if not children:
                return result_at(tree, node, draw_from(rng, tree.target, node)[0], True)
            child_of: dict[int, int] = {}
            for child in children:
                child_of.setdefault(int(tree.tokens[child]), child)
            tokens = list(child_of)
            hit = tree.target.probs_of([node] * len(tokens), tokens)  # one gather, no full row
            # rows sum to 1 (within 1e-6, checked where they are built), so the miss mass needs
            # no pass over V; the categorical renormalises by the total
            miss = max(1.0 - float(hit.sum()), 0.0)
            choice = rng.categorical(np.append(hit, miss) / (float(hit.sum()) + miss))
            if choice < len(tokens):
                node = child_of[tokens[choice]]
                continue
            token, guard = draw_from(rng, tree.target, node, lambda: _miss_law(tree.target.row(node), tokens))
            return result_at(tree, node, token, False, diagnostics={"residual_guard_hits": guard} if guard else {})


def _miss_law(target: np.ndarray, tokens: list[int]) -> tuple[np.ndarray, bool]:
    """p restricted to the non-child tokens, normalised (V,); (p, True) if that has no mass."""
    rest = target.copy()
    rest[tokens] = 0.0
    mass = rest.sum()
    if not mass > RESIDUAL_MASS_GUARD:  # a miss of probability ~0 (rounding only)
        return target, True
    rest /= mass
    return rest, False

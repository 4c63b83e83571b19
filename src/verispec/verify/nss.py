"""SpecInfer naive speculative sampling, NSS (ALGORITHMS.md §13).

At node u draw y ~ p(.|u). If y is the token of a child of u, move to that child (the first one
in sampling order when children repeat) and repeat; otherwise emit y and stop. At a leaf the draw
is the bonus token. Every emitted token is an exact draw from the target, so the rule is lossless
for any tree, whatever its sampling scheme (DETERMINISTIC top-k trees included); the acceptance
at u is the sum of p(c|u) over the distinct child tokens c.

This is the walk of the q-free rule (``verify.qfree.qfree_walk``, one definition for both): the
draw y ~ p(.|u) at an internal node is made in two exact stages, so that nothing O(V) is read
while children are hit: first a categorical over {each distinct child token c: p(c)} U {miss:
the remaining mass} from one gather of the children's entries; only on a miss is y drawn from p
restricted to the non-child tokens, on the support of p(.|u) (a top-p nucleus, not V).
The output law is the same as one draw from p(.|u).
"""

from __future__ import annotations

from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at
from verispec.verify.qfree import first_child_of_token, qfree_walk


class NaiveSpecInfer(Verifier):
    name = "nss"
    section = "§13"
    lossless = True
    supported_schemes = frozenset(DraftScheme)

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        visited, token, is_bonus, guard = qfree_walk(lambda node: first_child_of_token(tree, node), tree.target, rng)
        return result_at(tree, visited[-1], token, is_bonus, diagnostics={"residual_guard_hits": guard} if guard else {})

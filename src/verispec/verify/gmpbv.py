"""Greedy multi-path block verification, GMPBV (ALGORITHMS.md §7; [GMPBV paper], arXiv 2602.16961).

§7.1 Select, among K i.i.d. drafted paths, the one with the lexicographically largest key of
local ranks, the local order at each prefix sorting tokens by p/q ascending (q = 0 counts as
+inf; ties by token id). Equivalently walk the trie, taking the child with the largest p/q.
§7.2 The selected path has the skewed law Q̃(z) = (C(z) + Q(z))^K - C(z)^K, C(z) being the draft
mass of full paths ranked below the paths through z, with conditionals q̃(x|z) = Q̃(z,x)/Q̃(z).
§7.3 Run BV on the selected path with draft vectors q̃. Lossless per iteration; K = 1 is BV.

The order, the selection and the skewed law live in ``verify.greedy_selection`` (one definition
of the order for all of them, shared with SpecTr-GBV★ and the target modification).
"""

from __future__ import annotations

from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at
from verispec.verify.bv import block_verify_draw
from verispec.verify.greedy_selection import SkewedPathLaw, num_iid_drafts, select_greedy_path
from verispec.verify.path_rows import path_rows


class GreedyMultiPathBV(Verifier):
    name = "gmpbv"
    section = "§7"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        num_drafts = num_iid_drafts(tree)
        path = select_greedy_path(tree)
        rows, target_rows, draft_rows = path_rows(tree, path)
        tokens = tree.tokens[list(path)]
        law = SkewedPathLaw(target_rows, draft_rows, tokens, num_drafts)
        tau, token, guard = block_verify_draw(rng, tree, rows, law, tokens, law.token_probs)
        return result_at(tree, rows[tau], token, tau == len(path), diagnostics={"residual_guard_hits": guard})

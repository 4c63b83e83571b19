"""SpecTr-GBV★: the lossless repair of SpecTr-GBV (ALGORITHMS.md §6.3).

1. select a path s among the K i.i.d. drafts by the greedy multi-path ranking (§7.1);
2. take its skewed draft law q̃ (§7.2);
3. run greedy block verification with modification (§4.2) on s with target p and draft q̃;
4. leave the modification p̂(.|z) = norm([P(z,.) - Q̃(z,.)]_+) for continuations z of (s_{1:tau}, y)
   inside the window.
Lossless with the modification; K = 1 is GBV-mod.
"""

from __future__ import annotations

from verispec.core.probs import safe_log
from verispec.core.rng import Rng
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at
from verispec.verify.gbv_mod import greedy_block_draw
from verispec.verify.greedy_selection import SkewedPathLaw, num_iid_drafts, select_greedy_path
from verispec.verify.modification import ModificationWindow, SkewedDraftJoint
from verispec.verify.path_rows import path_rows


class SpecTrGBVStar(Verifier):
    name = "spectr-gbv-star"
    section = "§6.3"
    lossless = True
    needs_target_modification = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        num_drafts = num_iid_drafts(tree)
        path = select_greedy_path(tree)
        rows, target_rows, draft_rows = path_rows(tree, path)
        tokens = tree.tokens[list(path)]
        law = SkewedPathLaw(target_rows, draft_rows, tokens, num_drafts)
        tau, next_token, guard = greedy_block_draw(rng, tree, rows, law, tokens, law.token_probs)
        window = None
        remaining = len(path) - 1 - tau
        if remaining > 0:
            state = SkewedDraftJoint(float(law.below[tau]), float(law.mass[tau]), num_drafts)
            log_p = sum(safe_log(tree.target.prob(rows[j], tokens[j])) for j in range(tau))
            window = ModificationWindow(
                log_p + safe_log(tree.target.prob(rows[tau], next_token)),
                state.advance_on_supports(next_token, *target_rows.support(tau), *draft_rows.support(tau)),
                remaining,
            )
        return result_at(
            tree, rows[tau], next_token, tau == len(path), modification=window, diagnostics={"residual_guard_hits": guard}
        )

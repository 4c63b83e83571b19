"""GBV-mod: greedy block verification with target modification (ALGORITHMS.md §4; the
[SpecTr-GBV paper] §3.3, attributed there to Sun et al.).

Uncapped weight nu_i = P(x_{1:i})/Q(x_{1:i}); stop probabilities
h_i = min(1, S_i/D_i) with S_i = sum_x [nu_i p_{i+1} - q_{i+1}]_+, D_i = sum_x [q_{i+1} - nu_i p_{i+1}]_+
(h_i = 1 if D_i = 0) for i < L, h_L = min(1, nu_L); residual norm([nu_tau p_{tau+1} - q_{tau+1}]_+).
Lossless only together with the modification of later target laws (§4.3), which the result
carries as a ``ModificationWindow``. ``GBVModWithoutModification`` is the non-lossless variant
kept as a negative control (§4.4, §14.2).
"""

from __future__ import annotations

import math

import numpy as np

from verispec.core.probs import normalized_positive_part, safe_log
from verispec.core.rng import Rng
from verispec.core.rows import draw_on_support
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at
from verispec.verify.modification import ModificationWindow, PlainDraftJoint
from verispec.verify.path_rows import PathRows, path_rows, row_gather, row_support


def _scaled_parts(target: np.ndarray, draft: np.ndarray, log_nu: float) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) rescaled by a common positive factor so that nu*target - draft never
    overflows: returns (nu p, q) if nu <= 1 else (p, q/nu)."""
    if log_nu <= 0.0:
        return math.exp(log_nu) * target, draft
    return target, math.exp(-log_nu) * draft


def greedy_block_stop(
    rng: Rng, target_rows, draft_rows, target_token_probs: np.ndarray, draft_token_probs: np.ndarray
) -> tuple[int, float]:
    """§4.2 on one path: (tau, log nu_tau).

    target_rows: p_1..p_{L+1} and draft_rows: the law the path was drawn from (q, or q̃ for
    SpecTr-GBV★), both indexable by position (arrays or lazy providers, read through
    ``row_support`` / ``row_gather``); target_token_probs / draft_token_probs: (L,) p_i(x_i),
    q_i(x_i). S_i = sum_x [nu_i p_{i+1}(x) - q_{i+1}(x)]_+ is summed over supp(p_{i+1}) only: the
    positive part vanishes where p = 0 (a top-p nucleus instead of V)."""
    length = len(target_token_probs)
    with np.errstate(divide="ignore"):
        log_ratios = np.log(np.asarray(target_token_probs, dtype=np.float64)) - np.log(draft_token_probs)
    log_nu = np.concatenate([[0.0], np.cumsum(log_ratios)])
    for i in range(length, 0, -1):
        if i == length:
            stop = 1.0 if log_nu[i] >= 0.0 else math.exp(log_nu[i])
        elif log_nu[i] == -math.inf:
            stop = 0.0  # P(x_{1:i}) = 0: S_i = 0 < D_i
        else:
            ids, target = row_support(target_rows, i)
            scaled_p, scaled_q = _scaled_parts(target, row_gather(draft_rows, i, ids), log_nu[i])
            difference = scaled_p - scaled_q
            surplus = float(np.maximum(difference, 0.0, out=difference).sum())
            # sum [q - nu p]_+ = sum [nu p - q]_+ - (sum nu p - sum q): both vectors sum to 1, so in
            # the common scaling of _scaled_parts the bracket is nu - 1 (nu <= 1) or 1 - 1/nu
            excess = math.expm1(log_nu[i]) if log_nu[i] <= 0.0 else -math.expm1(-log_nu[i])
            deficit = max(surplus - excess, 0.0)
            stop = 1.0 if deficit <= 0.0 else min(1.0, surplus / deficit)
        if rng.bernoulli(stop):
            return i, float(log_nu[i])
    return 0, 0.0


def greedy_block_residual(draft_rows, position: int, log_nu: float):
    """The builder for ``draw_on_support`` of norm([nu p - q]_+) at ``position`` (§4.2), on the
    target's support (ids, p) with q read at those ids only."""
    def build(ids: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, bool]:
        scaled_p, scaled_q = _scaled_parts(target, row_gather(draft_rows, position, ids), log_nu)
        return normalized_positive_part(scaled_p - scaled_q, target)
    return build


def greedy_block_draw(
    rng: Rng, tree: DraftTree, rows, draft_rows, tokens, draft_token_probs: np.ndarray
) -> tuple[int, int, int]:
    """§4.2 on the path ``rows`` (root first, node indices) of ``tree``: (tau, next token, guard
    hits). ``draft_rows`` is the path's draft law by position (q's ``PathRows`` or q̃)."""
    target_rows = PathRows(tree.target, rows)
    tokens = [int(t) for t in tokens]
    tau, log_nu = greedy_block_stop(
        rng, target_rows, draft_rows, tree.target.probs_of(rows[:-1], tokens), draft_token_probs
    )
    node = rows[tau]
    if tau == len(tokens):
        return tau, draw_on_support(rng, tree.target, node)[0], 0
    token, guard = draw_on_support(rng, tree.target, node, greedy_block_residual(draft_rows, tau, log_nu))
    return tau, token, guard


class GBVMod(Verifier):
    name = "gbv-mod"
    section = "§4"
    lossless = True
    needs_target_modification = True
    supported_schemes = frozenset({DraftScheme.CHAIN})
    modify_target = True

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = chain_nodes(tree)
        rows, _, draft_rows = path_rows(tree, path)
        tokens = tree.tokens[list(path)]
        draft_token_probs = tree.draft.probs_of(rows[:-1], [int(t) for t in tokens])
        tau, next_token, guard = greedy_block_draw(rng, tree, rows, draft_rows, tokens, draft_token_probs)
        window = None
        remaining = len(path) - 1 - tau
        if self.modify_target and remaining > 0:
            log_p = sum(safe_log(tree.target.prob(rows[j], tokens[j])) for j in range(tau))
            log_q = sum(safe_log(tree.draft.prob(rows[j], tokens[j])) for j in range(tau))
            window = ModificationWindow(
                log_p + safe_log(tree.target.prob(rows[tau], next_token)),
                PlainDraftJoint(log_q + safe_log(tree.draft.prob(rows[tau], next_token))),
                remaining,
            )
        return result_at(
            tree, rows[tau], next_token, tau == len(path), modification=window, diagnostics={"residual_guard_hits": guard}
        )


class GBVModWithoutModification(GBVMod):
    """§4.4 negative control: GBV-mod with the modification dropped. NOT lossless."""

    name = "gbv-mod-nomod"
    lossless = False
    needs_target_modification = False
    modify_target = False

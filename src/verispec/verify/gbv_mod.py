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
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, path_rows, result_at
from verispec.verify.modification import ModificationWindow, PlainDraftJoint


def _scaled_parts(target: np.ndarray, draft: np.ndarray, log_nu: float) -> tuple[np.ndarray, np.ndarray]:
    """(target, draft) rescaled by a common positive factor so that nu*target - draft never
    overflows: returns (nu p, q) if nu <= 1 else (p, q/nu)."""
    if log_nu <= 0.0:
        return math.exp(log_nu) * target, draft
    return target, math.exp(-log_nu) * draft


def greedy_block_verify_path(
    rng: Rng, target_probs: np.ndarray, draft_rows, tokens: np.ndarray, draft_token_probs: np.ndarray | None = None
) -> tuple[int, np.ndarray, bool]:
    """§4.2 on one path. target_probs: (L+1, V) = p_1..p_{L+1}; draft_rows: the draft law the
    path was drawn from (q, or q̃ for SpecTr-GBV★), indexable by position 0..L-1 (array or lazy
    provider); draft_token_probs: (L,) draft probabilities of the path's tokens.
    Returns (tau, extra-token law, guard)."""
    length = len(tokens)
    positions = np.arange(length)
    if draft_token_probs is None:
        draft_token_probs = np.array([draft_rows[i][tokens[i]] for i in range(length)])
    with np.errstate(divide="ignore"):
        log_ratios = np.log(np.array([target_probs[i][tokens[i]] for i in positions])) - np.log(draft_token_probs)
    log_nu = np.concatenate([[0.0], np.cumsum(log_ratios)])
    for i in range(length, 0, -1):
        if i == length:
            stop = 1.0 if log_nu[i] >= 0.0 else math.exp(log_nu[i])
        elif log_nu[i] == -math.inf:
            stop = 0.0  # P(x_{1:i}) = 0: S_i = 0 < D_i
        else:
            scaled_p, scaled_q = _scaled_parts(target_probs[i], draft_rows[i], log_nu[i])
            difference = scaled_p - scaled_q
            surplus = float(np.maximum(difference, 0.0, out=difference).sum())
            # sum [q - nu p]_+ = sum [nu p - q]_+ - (sum nu p - sum q): both vectors sum to 1, so in
            # the common scaling of _scaled_parts the bracket is nu - 1 (nu <= 1) or 1 - 1/nu
            excess = math.expm1(log_nu[i]) if log_nu[i] <= 0.0 else -math.expm1(-log_nu[i])
            deficit = max(surplus - excess, 0.0)
            stop = 1.0 if deficit <= 0.0 else min(1.0, surplus / deficit)
        if rng.bernoulli(stop):
            if i == length:
                return length, target_probs[length], False
            return (i, *_residual_at(target_probs[i], draft_rows[i], log_nu[i]))
    return (0, *_residual_at(target_probs[0], draft_rows[0], 0.0))


def _residual_at(target: np.ndarray, draft: np.ndarray, log_nu: float) -> tuple[np.ndarray, bool]:
    scaled_p, scaled_q = _scaled_parts(target, draft, log_nu)
    return normalized_positive_part(scaled_p - scaled_q, target)


class GBVMod(Verifier):
    name = "gbv-mod"
    section = "§4"
    lossless = True
    needs_target_modification = True
    supported_schemes = frozenset({DraftScheme.CHAIN})
    modify_target = True

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = chain_nodes(tree)
        rows, target_rows, draft_rows = path_rows(tree, path)
        tokens = tree.tokens[list(path)]
        tau, dist, guard = greedy_block_verify_path(rng, target_rows, draft_rows, tokens)
        next_token = rng.categorical(dist)
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

"""Block verification, BV (ALGORITHMS.md §3; Sun et al., arXiv 2403.10444, ICLR 2025).

Capped running weight w_i = min(1, w_{i-1} p_i(x_i)/q_i(x_i)); stop probabilities
h_i = rho_i / (rho_i + 1 - w_i) with rho_i = sum_x [w_i p_{i+1}(x) - q_{i+1}(x)]_+ for i < L and
h_L = w_L; tau = max{i : U_i < h_i}; residual norm([w_tau p_{tau+1} - q_{tau+1}]_+).
Lossless per iteration, no target modification.
"""

from __future__ import annotations

import numpy as np

from verispec.core.probs import residual
from verispec.core.rng import Rng
from verispec.core.rows import draw_from
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, path_rows, result_at


def capped_weights(target_token_probs: np.ndarray, draft_token_probs: np.ndarray) -> np.ndarray:
    """w_0..w_L for a path from p_i(x_i) and q_i(x_i), both shape (L,)."""
    ratios = target_token_probs / draft_token_probs
    weights = np.ones(len(ratios) + 1)
    for i, ratio in enumerate(ratios, start=1):
        weights[i] = min(1.0, weights[i - 1] * ratio)
    return weights


def block_stop(
    rng: Rng, target_rows, draft_rows, target_token_probs: np.ndarray, draft_token_probs: np.ndarray
) -> tuple[int, float]:
    """The stop position of BV on one path: (tau, w_tau).

    target_rows: p_1..p_{L+1} and draft_rows: q_1..q_L, indexable by position (arrays, or lazy
    providers such as ``PathRows`` or q̃ of §7), read only where rho_i needs a full row;
    target_token_probs / draft_token_probs: (L,) p_i(x_i), q_i(x_i). The U_i are drawn lazily
    from i = L downwards, which has the same law as drawing all of them."""
    length = len(target_token_probs)
    weights = capped_weights(target_token_probs, draft_token_probs)
    for i in range(length, 0, -1):
        w = weights[i]
        if i == length:
            stop = w
        elif w <= 0.0 or w >= 1.0:
            # w = 0 gives rho = 0 and h = 0; w = 1 gives h = rho / rho = 1 (h = 1 by definition
            # when rho = 0 too): no pass over the vocabulary, and no row is built
            stop = min(max(w, 0.0), 1.0)
        else:
            difference = w * target_rows[i]
            difference -= draft_rows[i]
            rho = float(np.maximum(difference, 0.0, out=difference).sum())
            denominator = rho + 1.0 - w
            stop = 1.0 if denominator <= 0.0 else rho / denominator
        if rng.bernoulli(stop):
            return i, float(w)
    return 0, 1.0


def block_verify_path(
    rng: Rng, target_probs, draft_rows, tokens: np.ndarray, draft_token_probs: np.ndarray | None = None
) -> tuple[int, np.ndarray, bool]:
    """BV on one path with full vectors. target_probs: p_1..p_{L+1}, (L+1, V) array or rows
    indexable by position; draft_rows: q_1..q_L, indexable by position (an (L, V) array, or a lazy
    row provider, e.g. q̃ of §7); draft_token_probs: (L,) q_i(x_i) (read from draft_rows when
    omitted). Returns (tau, distribution of the extra token, guard_hit)."""
    length = len(tokens)
    if draft_token_probs is None:
        draft_token_probs = np.array([draft_rows[i][tokens[i]] for i in range(length)])
    target_token_probs = np.array([target_probs[i][tokens[i]] for i in range(length)])
    tau, w = block_stop(rng, target_probs, draft_rows, target_token_probs, draft_token_probs)
    if tau == length:
        return length, target_probs[length], False
    dist, guard = residual(target_probs[tau], draft_rows[tau], target_scale=w)
    return tau, dist, guard


class BlockVerification(Verifier):
    name = "bv"
    section = "§3"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = chain_nodes(tree)
        rows, target_rows, draft_rows = path_rows(tree, path)
        tokens = [int(t) for t in tree.tokens[list(path)]]
        # one batched gather per side for the ratios; full rows only where rho_i or the residual needs them
        tau, w = block_stop(
            rng, target_rows, draft_rows, tree.target.probs_of(rows[:-1], tokens), tree.draft.probs_of(rows[:-1], tokens)
        )
        node = rows[tau]
        if tau == len(path):
            return result_at(tree, node, draw_from(rng, tree.target, node)[0], True)
        token, guard = draw_from(
            rng, tree.target, node, lambda: residual(target_rows[tau], draft_rows[tau], target_scale=w)
        )
        return result_at(tree, node, token, False, diagnostics={"residual_guard_hits": guard})

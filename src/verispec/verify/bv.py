"""Block verification, BV (ALGORITHMS.md §3; Sun et al., arXiv 2403.10444, ICLR 2025).

Capped running weight w_i = min(1, w_{i-1} p_i(x_i)/q_i(x_i)); stop probabilities
h_i = rho_i / (rho_i + 1 - w_i) with rho_i = sum_x [w_i p_{i+1}(x) - q_{i+1}(x)]_+ for i < L and
h_L = w_L; tau = max{i : U_i < h_i}; residual norm([w_tau p_{tau+1} - q_{tau+1}]_+).
Lossless per iteration, no target modification.

Rows are read through the tree's row providers (core.rows), touching only what the
rule needs:
* the ratios p_i(x_i)/q_i(x_i) one entry per row, in blocks of 2, 4, 8, ... positions (one
  batched gather per side each, as SD), and no further once w reaches 0: p_i(x_i) = 0 makes every
  later w_j = 0 and h_j = 0 (§3 edge cases), so those rows cannot matter;
* rho_i and the residual only on the support of p_{i+1}: [w p - q]_+ vanishes where p = 0, so
  the sums and the law live on supp(p_{i+1}) (a top-p nucleus, not V), with q gathered there;
* no row at all where w_i is 0 or 1 (h_i is then 0 or 1 without rho_i).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from verispec.core.probs import residual
from verispec.core.rng import Rng
from verispec.core.rows import draw_on_support
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at
from verispec.verify.path_rows import PathRows, row_gather

FIRST_BLOCK = 2

# ratio_block(start, stop) -> (stop - start,) ratios p_i(x_i)/q_i(x_i) of positions start..stop-1
RatioBlock = Callable[[int, int], np.ndarray]
# rho_at(i, w) -> rho_i = sum_x [w p_{i+1}(x) - q_{i+1}(x)]_+ for 0 < w < 1
RhoAt = Callable[[int, float], float]


def capped_weights_until_zero(ratio_block: RatioBlock, length: int) -> np.ndarray:
    """w_0..w_m of a path of ``length`` tokens, reading the ratios in blocks of 2, 4, 8, ...
    positions and stopping after the block where w first reaches 0 (then m < length and w_m = 0:
    every later w_j is 0 as well and is not read). Shape (m + 1,), m = length when w stays > 0."""
    weights = [1.0]
    start, block = 0, FIRST_BLOCK
    while start < length:
        stop = min(start + block, length)
        for ratio in ratio_block(start, stop):
            weights.append(min(1.0, weights[-1] * float(ratio)))
            if weights[-1] <= 0.0:
                return np.array(weights)
        start, block = stop, block * 2
    return np.array(weights)


def capped_weights(target_token_probs: np.ndarray, draft_token_probs: np.ndarray) -> np.ndarray:
    """w_0..w_L for a path from p_i(x_i) and q_i(x_i), both shape (L,); w_j = 0 after the first
    zero (the full-length form of ``capped_weights_until_zero``)."""
    ratios = np.asarray(target_token_probs, dtype=np.float64) / np.asarray(draft_token_probs, dtype=np.float64)
    weights = np.zeros(len(ratios) + 1)
    read = capped_weights_until_zero(lambda start, stop: ratios[start:stop], len(ratios))
    weights[: len(read)] = read
    return weights


def block_stop(rng: Rng, weights: np.ndarray, length: int, rho_at: RhoAt) -> tuple[int, float]:
    """The stop position of BV on one path of ``length`` tokens: (tau, w_tau).

    weights: w_0..w_m from ``capped_weights_until_zero`` (m <= length; w_j = 0 for j > m, so
    h_j = 0 there and those positions are skipped: a test that never succeeds changes nothing);
    rho_at(i, w): rho_i, called only where 0 < w_i < 1 and i < length. The U_i are drawn lazily
    from i = m downwards, which has the same law as drawing all of them."""
    for i in range(len(weights) - 1, 0, -1):
        w = float(weights[i])
        if i == length:
            stop = w
        elif w <= 0.0 or w >= 1.0:
            # w = 0 gives rho = 0 and h = 0; w = 1 gives h = rho / rho = 1 (h = 1 by definition
            # when rho = 0 too): no pass over the vocabulary, and no row is built
            stop = min(max(w, 0.0), 1.0)
        else:
            rho = rho_at(i, w)
            denominator = rho + 1.0 - w
            stop = 1.0 if denominator <= 0.0 else rho / denominator
        if rng.bernoulli(stop):
            return i, w
    return 0, 1.0


def positive_excess(target_values: np.ndarray, draft_values: np.ndarray, w: float) -> float:
    """sum [w p - q]_+ over the given entries (the support of p: the rest adds 0)."""
    difference = w * target_values
    difference -= draft_values
    return float(np.maximum(difference, 0.0, out=difference).sum())


def block_verify_draw(
    rng: Rng, tree: DraftTree, rows, draft_rows, tokens, draft_token_probs: np.ndarray | None = None
) -> tuple[int, int, int]:
    """BV (§3) on the root path ``rows`` (node indices, root first; rows[i] holds p_{i+1}) of
    ``tree``: (tau, extra token, residual guard hits).

    draft_rows: the law the path was drawn from by position: ``PathRows`` of the tree's draft (BV),
    or q̃ of §7 (GMPBV), read at the target's support through ``row_gather``;
    draft_token_probs: (L,) q_i(x_i); when omitted they are read from draft_rows block by block
    with the target's entries (none past the block where w reaches 0)."""
    tokens = [int(t) for t in tokens]
    length = len(tokens)

    def draft_block(start: int, stop: int) -> np.ndarray:
        if draft_token_probs is not None:
            return np.asarray(draft_token_probs[start:stop], dtype=np.float64)
        if isinstance(draft_rows, PathRows):  # one batched gather, as for the target
            return draft_rows.rows.probs_of(draft_rows.nodes[start:stop], tokens[start:stop])
        return np.array([row_gather(draft_rows, i, [tokens[i]])[0] for i in range(start, stop)])

    def ratio_block(start: int, stop: int) -> np.ndarray:
        return tree.target.probs_of(rows[start:stop], tokens[start:stop]) / draft_block(start, stop)

    def rho_at(i: int, w: float) -> float:
        # [w p - q]_+ vanishes outside supp(p_{i+1}): sum over the target's support only
        ids, p = tree.target.support(rows[i])
        return positive_excess(p, row_gather(draft_rows, i, ids), w)

    weights = capped_weights_until_zero(ratio_block, length)
    tau, w = block_stop(rng, weights, length, rho_at)
    node = rows[tau]
    if tau == length:
        return tau, draw_on_support(rng, tree.target, node)[0], 0
    token, guard = draw_on_support(
        rng, tree.target, node, lambda ids, p: residual(p, row_gather(draft_rows, tau, ids), target_scale=w)
    )
    return tau, token, guard


class BlockVerification(Verifier):
    name = "bv"
    section = "§3"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = chain_nodes(tree)
        rows = [ROOT, *path]  # rows[i] holds p_{i+1} and q_{i+1}
        draft_rows = PathRows(tree.draft, rows[:-1])  # q entries read block by block, as p's
        tau, token, guard = block_verify_draw(rng, tree, rows, draft_rows, tree.tokens[list(path)])
        diagnostics = {} if tau == len(path) else {"residual_guard_hits": guard}
        return result_at(tree, rows[tau], token, tau == len(path), diagnostics=diagnostics)

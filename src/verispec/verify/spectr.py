"""SpecTr K-SEQ (ALGORITHMS.md §5; Sun et al., NeurIPS 2023, arXiv 2310.15141).

Single position (§5.1), k i.i.d. candidates c_1..c_k ~ q, beta(rho) = sum_x min(q(x), p(x)/rho):
  1. rho = the smallest value in [1, k] with f(rho) = rho beta(rho) - 1 + (1 - beta(rho))^k >= 0,
     always taken from the f >= 0 side (rho = 1 for k = 1 or when f(1) >= 0).
  2. For j = 1..k in draft order accept c_j with probability min(1, p(c_j) / (rho q(c_j)));
     duplicates are tested independently (no deduplication).
  3. All rejected: y ~ norm(p - min(q, p/rho) (1 - (1 - beta)^k) / beta), the general residual
     form, which is >= 0 for every rho with f(rho) >= 0 (beta = 0: the residual is p).
Acceptance 1 - (1 - beta(rho*))^k.

Multi-step (§5.2) on K i.i.d. paths (schemes CHAIN, IID_PATHS): top-down over the raw drafted
paths (``tree.paths``, duplicates kept); at depth i the candidates are the i-th tokens of the
paths that agree with the accepted prefix, in draft order, and k = their number.

``SpecTrWrongSideRho`` is the negative control of §14.2 ("K-SEQ residual written with rho taken
from the f < 0 side"): rho is the *lower* end of the bisection bracket after only
``bisection_steps`` halvings (rho below the root, f(rho) < 0) and the residual is the root form
[p - rho q]_+ / (1 - rho beta). It is NOT lossless for k >= 2.

The helpers below (``kseq_rho``, ``kseq_beta``, ``kseq_residual``, ...) take float64 vectors
over any set of tokens that holds the support of p: the full vocabulary (V,), or, as the rule
runs them (``kseq_node``), the support of p(.|node) with q gathered there (every sum
they take vanishes where p = 0; see ``kseq_node``). Choosing rho (``kseq_rho``) costs one
binning pass over those tokens plus work on the few whose ratio p/q stays inside the bracket;
it is done only when a candidate test needs rho (p(c) < k q(c)), and the residual only after k
rejections. ``kseq_rho_bracket`` is the plain full-vector bisection, kept as the reference.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from verispec.core.probs import normalized_positive_part
from verispec.core.rng import Rng
from verispec.core.rows import Rows
from verispec.core.tree import DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult
from verispec.verify.rrs import top_down
from verispec.verify.support import SupportDraw

BISECTION_STEPS = 60


def kseq_beta(target: np.ndarray, draft: np.ndarray, rho: float) -> float:
    """beta(rho) = sum_x min(q(x), p(x)/rho); target, draft shape (V,)."""
    scaled = target * (1.0 / rho)
    np.minimum(scaled, draft, out=scaled)
    return float(scaled.sum())


def _reject_all(beta: float, k: int) -> float:
    """(1 - beta)^k, accurate for small beta."""
    if beta >= 1.0:
        return 0.0
    return math.exp(k * math.log1p(-beta)) if beta > 0.0 else 1.0


def _f_from_deficit(deficit: float, rho: float, k: int) -> float:
    """f(rho) written through D(rho) = sum_x [p(x) - rho q(x)]_+ = 1 - rho beta(rho):
    f = ((rho - 1 + D)/rho)^k - D. This form has no cancellation against 1, so p = q gives
    f(1) = 0 exactly (and rho = 1)."""
    deficit = max(deficit, 0.0)
    return ((rho - 1.0 + deficit) / rho) ** k - deficit


def kseq_f(target: np.ndarray, draft: np.ndarray, rho: float, k: int) -> float:
    """f(rho) = rho beta(rho) - 1 + (1 - beta(rho))^k (§5.1 step 1), non-decreasing in rho;
    evaluated on the full vectors (shape (V,)) in the cancellation-free form of
    ``_f_from_deficit``."""
    excess = draft * (-rho)  # one (V,) temporary, updated in place
    excess += target
    np.maximum(excess, 0.0, out=excess)
    return _f_from_deficit(float(excess.sum()), rho, int(k))


def kseq_rho_bracket(target: np.ndarray, draft: np.ndarray, k: int, iterations: int = BISECTION_STEPS) -> tuple[float, float]:
    """Plain bisection bracket (lo, hi) of the K-SEQ root after ``iterations`` halvings of
    [1, k], evaluating f on the full vectors: f(lo) < 0 <= f(hi); (1, 1) when k = 1 or
    f(1) >= 0 (§5.1 step 1). O(V) per halving: a reference, and the source of the wrong-side
    rho of the negative control. ``kseq_rho`` is the fast production search."""
    k = int(k)
    if k <= 1 or kseq_f(target, draft, 1.0, k) >= 0.0:
        return 1.0, 1.0
    lo, hi = 1.0, float(k)
    for _ in range(int(iterations)):
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:
            break
        if kseq_f(target, draft, mid, k) >= 0.0:
            hi = mid
        else:
            lo = mid
    return lo, hi


# Bins per refinement level of ``kseq_rho``.
_RHO_BINS = 256
# Stand-in for q(x) = 0 in the ratio p/q: p > 0 gives a ratio above k, p = 0 gives 0.
_TINY = 1e-300


def _bin_ratios(ratio: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Bin index per token, overwriting ``ratio``: 0 for ratio < lo, j = 1.._RHO_BINS for
    ratio in [lo + (j-1) w, lo + j w), _RHO_BINS + 1 for ratio >= hi (w = (hi - lo)/_RHO_BINS)."""
    width = (hi - lo) / _RHO_BINS
    ratio *= 1.0 / width
    ratio += 1.0 - lo / width
    np.clip(ratio, 0.0, _RHO_BINS + 1.0, out=ratio)
    return ratio.astype(np.intp)


def kseq_rho(target: np.ndarray, draft: np.ndarray, k: int) -> float:
    """rho* of §5.1: the smallest rho in [1, k] with f(rho) >= 0, returned from the f >= 0 side.
    target, draft: shape (V,). (1 for k = 1 or when f(1) >= 0: p = q or disjoint supports.)

    D(rho) = sum_x [p(x) - rho q(x)]_+ is piecewise linear with breakpoints at the ratios p/q.
    One O(V) pass bins the ratios into _RHO_BINS intervals of the bracket and gets D at every
    grid point from per-bin sums of p and q (np.bincount), which locates the grid interval
    holding the root; only the tokens whose ratio falls in that interval stay "active" and are
    re-binned the same way. Once no ratio is left inside the bracket, D(rho) = P_above -
    rho Q_above there and a scalar bisection finishes to machine precision. A final check of f
    on the full vectors nudges rho up by a few ulps if rounding put it on the f < 0 side.
    Full-length work is done in one reused (V,) buffer: fresh large temporaries cost more than
    the arithmetic.
    """
    k = int(k)
    if k <= 1:
        return 1.0
    buffer = np.minimum(target, draft)
    if float(buffer.sum()) <= 0.0:
        return 1.0  # disjoint supports: beta = 0 for every rho, f(1) = 0
    buffer -= target  # -[p - q]_+
    if float(buffer.sum()) >= 0.0:
        return 1.0  # p = q: f(1) = TV^k - TV = 0
    np.maximum(draft, _TINY, out=buffer)
    np.divide(target, buffer, out=buffer)  # ratios p/q
    lo, hi = 1.0, float(k)
    bins = _bin_ratios(buffer, lo, hi)
    del buffer
    p_active, q_active = target, draft
    p_above = q_above = 0.0  # sums over tokens whose ratio is above the bracket
    grid_steps = np.arange(_RHO_BINS + 1)
    while True:
        p_bins = np.bincount(bins, weights=p_active, minlength=_RHO_BINS + 2)
        q_bins = np.bincount(bins, weights=q_active, minlength=_RHO_BINS + 2)
        grid = lo + ((hi - lo) / _RHO_BINS) * grid_steps
        grid[-1] = hi
        # at grid point i the ratios in bins > i are above it and contribute p - rho q to D
        p_suffix = p_above + p_bins[::-1].cumsum()[::-1][1:]
        q_suffix = q_above + q_bins[::-1].cumsum()[::-1][1:]
        deficit = np.maximum(p_suffix - grid * q_suffix, 0.0)
        f = ((grid - 1.0 + deficit) / grid) ** k - deficit
        nonnegative = np.flatnonzero(f >= 0.0)
        if nonnegative.size == 0:
            lo = float(grid[-2])
            break  # f(hi) >= 0 in exact arithmetic (f(k) >= 0 by Bernoulli's inequality)
        index = int(nonnegative[0])
        if index == 0:
            hi = lo
            break
        p_above += float(p_bins[index + 1 :].sum())
        q_above += float(q_bins[index + 1 :].sum())
        keep = np.flatnonzero(bins == index)
        p_active, q_active = p_active[keep], q_active[keep]
        lo, hi = float(grid[index - 1]), float(grid[index])
        if keep.size == 0:
            # no breakpoint inside (lo, hi): D(rho) = p_above - rho q_above, f increasing
            for _ in range(BISECTION_STEPS + 20):
                mid = 0.5 * (lo + hi)
                if not lo < mid < hi:
                    break
                if _f_from_deficit(p_above - mid * q_above, mid, k) >= 0.0:
                    hi = mid
                else:
                    lo = mid
            break
        if lo + 4 * np.spacing(hi) >= hi:
            break  # ratios tied at machine precision: the bracket cannot shrink further
        bins = _bin_ratios(p_active / np.maximum(q_active, _TINY), lo, hi)
    step = 4.0 * np.spacing(hi)
    while hi < k and kseq_f(target, draft, hi, k) < 0.0:  # rounding only: a few ulps at most
        hi = min(float(k), hi + step)
        step *= 2.0
    return hi


def kseq_acceptance(target: np.ndarray, draft: np.ndarray, k: int) -> float:
    """Single-position K-SEQ acceptance 1 - (1 - beta(rho*))^k (§5.1)."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    beta = kseq_beta(target, draft, kseq_rho(target, draft, k))
    return 1.0 - _reject_all(beta, int(k))


def kseq_residual(target: np.ndarray, draft: np.ndarray, rho: float, k: int) -> tuple[np.ndarray, bool]:
    """Law of the extra token after k rejections (§5.1 step 3), shape (V,):
    norm(p - min(q, p/rho) (1 - (1 - beta)^k) / beta); p itself when beta = 0.
    Returns (distribution, guard_hit)."""
    weights = target * (1.0 / rho)
    np.minimum(weights, draft, out=weights)  # min(q, p/rho), the per-trial acceptance mass
    beta = float(weights.sum())
    if beta <= 0.0:
        return target, False
    # k = 1: exactly [p - q]_+ (SD's residual), with no rounding in the scale
    scale = 1.0 if k == 1 else (1.0 - _reject_all(beta, k)) / beta
    weights *= -scale
    weights += target
    # the positive part matters for rounding only: the form is >= 0 when f(rho) >= 0
    return normalized_positive_part(weights, target)


def root_form_residual(target: np.ndarray, draft: np.ndarray, rho: float, k: int) -> tuple[np.ndarray, bool]:
    """[p - rho q]_+ / (1 - rho beta(rho)), shape (V,): equal to ``kseq_residual`` only at the
    exact root; used by the negative control ``SpecTrWrongSideRho``."""
    weights = draft * (-rho)
    weights += target
    return normalized_positive_part(weights, target)


RhoFn = Callable[[np.ndarray, np.ndarray, int], float]
ResidualFn = Callable[[np.ndarray, np.ndarray, float, int], tuple[np.ndarray, bool]]


def _kseq_tests(
    rng: Rng, target_entries: np.ndarray, draft_entries: np.ndarray, rho_of: Callable[[], float]
) -> tuple[int | None, float | None]:
    """§5.1 step 2 on the k candidates' entries p(c_j), q(c_j) (k,), in draft order: (index of the
    accepted candidate or None after k rejections, rho if it was computed, else None).

    rho is computed lazily by ``rho_of()``: a candidate with p(c) >= k q(c) is accepted with
    probability 1 for every rho in [1, k], so the root search is skipped until a test needs rho."""
    k = len(target_entries)
    rho = 1.0 if k == 1 else None
    for index in range(k):
        p_c, q_c = float(target_entries[index]), float(draft_entries[index])
        if p_c >= k * q_c:
            accept = 1.0
        else:
            if rho is None:
                rho = rho_of()
            accept = min(1.0, p_c / (rho * q_c))
        if rng.bernoulli(accept):
            return index, rho
    return None, rho


def kseq_node(
    rng: Rng,
    target: Rows,
    draft: Rows,
    node: int,
    candidates: Sequence[int],
    rho_fn: RhoFn = kseq_rho,
    residual_fn: ResidualFn = kseq_residual,
) -> tuple[int | None, SupportDraw | None, int]:
    """§5.1 at ``node`` of a tree, reading its rows through the row providers (core.rows), as a
    node rule of ``rrs.top_down``: (index of the accepted candidate, None, 0), or (None, the
    residual's ``SupportDraw``, 0) after k rejections (y is drawn on the target's support).

    Only the candidates' entries are gathered for the tests. rho and the residual are computed on
    the support S of p(.|node) (a top-p nucleus, not V), with q gathered at S; exact because every
    sum they take vanishes outside S: D(rho) = sum_x [p - rho q]_+ (f, hence rho), beta =
    sum_x min(q, p/rho), and the residual p - min(q, p/rho)(1 - (1 - beta)^k)/beta (and the
    root form [p - rho q]_+) are all 0 where p = 0. None of them sums q alone, so the q mass
    outside S is never needed."""
    k = len(candidates)
    nodes = [node] * k

    def rho_of() -> float:
        ids, p = target.support(node)
        return rho_fn(p, draft.gather(node, ids), k)

    index, rho = _kseq_tests(rng, target.probs_of(nodes, candidates), draft.probs_of(nodes, candidates), rho_of)
    if index is not None:
        return index, None, 0

    def build(ids: np.ndarray, p: np.ndarray) -> tuple[np.ndarray, bool]:
        q = draft.gather(node, ids)
        return residual_fn(p, q, rho if rho is not None else rho_fn(p, q, k), k)

    return None, SupportDraw(build), 0


def kseq_step(
    rng: Rng, target: np.ndarray, draft: np.ndarray, candidates: Sequence[int]
) -> tuple[int | None, np.ndarray | None]:
    """One K-SEQ position (§5.1). target p, draft q: shape (V,); candidates: k token ids drawn
    i.i.d. from q, in draft order (duplicates kept). Returns (accepted token, None), or
    (None, residual law of shape (V,)) when all k were rejected; then y ~ residual."""
    target = np.asarray(target, dtype=np.float64)
    draft = np.asarray(draft, dtype=np.float64)
    k = len(candidates)
    index, rho = _kseq_tests(rng, target[list(candidates)], draft[list(candidates)], lambda: kseq_rho(target, draft, k))
    if index is not None:
        return int(candidates[index]), None
    return None, kseq_residual(target, draft, kseq_rho(target, draft, k) if rho is None else rho, k)[0]


class SpecTr(Verifier):
    """Multi-step SpecTr K-SEQ on K i.i.d. draft paths (§5.2)."""

    name = "spectr"
    section = "§5"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})

    def _node_rule(self, rng: Rng, target: Rows, draft: Rows, node: int, tokens: Sequence[int]):
        return kseq_node(rng, target, draft, node, tokens)

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        """Top-down over the raw drafted paths (§5.2): at depth i the candidates are the i-th
        tokens of the paths that agree with the accepted prefix, in draft order."""
        return top_down(tree, rng, self._node_rule, raw_paths=True, reads_rows=True)


class SpecTrWrongSideRho(SpecTr):
    """Negative control (§14.2): rho *below the root* (the lower bisection end after only
    ``bisection_steps`` halvings, so f(rho) < 0) with the root-form residual
    [p - rho q]_+ / (1 - rho beta). NOT lossless for k >= 2 (equals SD for k = 1)."""

    name = "spectr-wrong-rho"
    lossless = False
    bisection_steps = 2

    def _lower_rho(self, target: np.ndarray, draft: np.ndarray, k: int) -> float:
        return kseq_rho_bracket(target, draft, k, self.bisection_steps)[0]

    def _node_rule(self, rng: Rng, target: Rows, draft: Rows, node: int, tokens: Sequence[int]):
        return kseq_node(rng, target, draft, node, tokens, self._lower_rho, root_form_residual)

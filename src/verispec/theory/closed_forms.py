"""Closed-form expectations and bounds (ALGORITHMS.md §14.1 item 5, §2-§11).

Block-level formulas sum over every prefix z = x_{1:i}, i = 1..L, of the toy models (callables
prefix -> (V,) vector), so they are meant for small V. Single-position formulas take vectors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from verispec.verify.greedy_selection import below_mass_all, skewed_mass
from verispec.verify.otm import otm_iid_acceptance_closed_form, otm_plan  # noqa: F401  (re-exported)
from verispec.verify.rrs import rrs_acceptance  # noqa: F401
from verispec.verify.spechub import spechub_acceptance  # noqa: F401
from verispec.verify.spectr import kseq_acceptance, kseq_rho  # noqa: F401

ProbFn = Callable[[tuple[int, ...]], np.ndarray]


def _prefix_stats(target: ProbFn, draft: ProbFn, length: int, num_drafts: int = 1) -> Iterator[dict]:
    """Yield, for every prefix z with 1 <= |z| <= length: P(z), Q(z), Q̃(z) (skewed law of the
    greedy selection among K i.i.d. drafts, §7.2), w(z) (BV's capped weight), w̃(z) (capped
    weight against q̃) and min-product sum_j min(p_j, q_j) chain for SD."""

    def walk(prefix, target_joint, draft_joint, below, bv_weight, skew_weight, sd_product):
        if len(prefix) == length:
            return
        p, q = target(prefix), draft(prefix)
        lower = below + draft_joint * below_mass_all(p, q)
        skew_joint = skewed_mass(lower, draft_joint * q, num_drafts)
        skew_parent = skewed_mass(below, draft_joint, num_drafts)
        for token in range(len(p)):
            if q[token] <= 0 and p[token] <= 0:
                continue
            ratio = p[token] / q[token] if q[token] > 0 else np.inf
            skew_cond = skew_joint[token] / skew_parent if skew_parent > 0 else 0.0
            stats = {
                "prefix": prefix + (token,),
                "P": target_joint * p[token],
                "Q": draft_joint * q[token],
                "Q_skew": float(skew_joint[token]),
                "w": min(1.0, bv_weight * ratio) if q[token] > 0 else 0.0,
                "w_skew": min(1.0, skew_weight * p[token] / skew_cond) if skew_cond > 0 else 0.0,
                "sd": sd_product * min(p[token], q[token]),
            }
            yield stats
            yield from walk(
                stats["prefix"], stats["P"], stats["Q"], float(lower[token]), stats["w"], stats["w_skew"], stats["sd"]
            )

    yield from walk((), 1.0, 1.0, 0.0, 1.0, 1.0, 1.0)


def expected_len_sd(target: ProbFn, draft: ProbFn, draft_len: int) -> float:
    """§2: E[tau] = sum_i sum_{x_{1:i}} prod_{j<=i} min(p_j(x_j), q_j(x_j))."""
    return sum(s["sd"] for s in _prefix_stats(target, draft, draft_len))


def expected_len_bv(target: ProbFn, draft: ProbFn, draft_len: int) -> float:
    """§3: E[tau] = sum_i sum_{x_{1:i}} Q(x_{1:i}) w_i(x_{1:i})."""
    return sum(s["Q"] * s["w"] for s in _prefix_stats(target, draft, draft_len))


def expected_len_gbv_mod(target: ProbFn, draft: ProbFn, draft_len: int) -> float:
    """§4: E[tau] = sum_i sum_{x_{1:i}} min(P, Q)."""
    return sum(min(s["P"], s["Q"]) for s in _prefix_stats(target, draft, draft_len))


def expected_len_spectr_gbv_star(target: ProbFn, draft: ProbFn, draft_len: int, num_drafts: int) -> float:
    """§6.3: E[tau] = sum min(P, Q̃)."""
    return sum(min(s["P"], s["Q_skew"]) for s in _prefix_stats(target, draft, draft_len, num_drafts))


def expected_len_gmpbv(target: ProbFn, draft: ProbFn, draft_len: int, num_drafts: int) -> float:
    """§7: E[tau] = sum Q̃ w̃, w̃ the capped products of p/q̃."""
    return sum(s["Q_skew"] * s["w_skew"] for s in _prefix_stats(target, draft, draft_len, num_drafts))


def claimed_bound_spectr_gbv(target: ProbFn, draft: ProbFn, draft_len: int, num_drafts: int) -> float:
    """The [SpecTr-GBV paper]'s claimed maximum sum_z F(z), F = P - P([P - Q]_+/P)^K (§6.1).
    §6.2 item 3: it is neither reached by that algorithm nor an upper bound."""
    total = 0.0
    for s in _prefix_stats(target, draft, draft_len):
        p_z, q_z = s["P"], s["Q"]
        gap = p_z * (max(p_z - q_z, 0.0) / p_z) ** num_drafts if p_z > 0 else 0.0
        total += p_z - gap
    return total


# ----- SPRINTER (§11) ---------------------------------------------------------------------------
def sprinter_token_law(target: np.ndarray, draft: np.ndarray, fpr: float) -> np.ndarray:
    """Thm 3.1: (1 - beta) p + beta q."""
    return (1.0 - fpr) * np.asarray(target) + fpr * np.asarray(draft)


def sprinter_kept_probability(target: np.ndarray, draft: np.ndarray, fpr: float) -> float:
    """Thm A.4: probability the drafted token is kept, 1 - (1 - beta) TV(p, q)."""
    return 1.0 - (1.0 - fpr) * total_variation_distance(target, draft)


def sprinter_run_length_pmf(tpr: float, fpr: float, num_acceptable: int, k: int) -> float:
    """Thm 3.3: P(N = k) with the first n drafted tokens acceptable and the rest not."""
    if k < num_acceptable:
        return tpr**k * (1.0 - tpr)
    return tpr**num_acceptable * fpr ** (k - num_acceptable) * (1.0 - fpr)


def sprinter_expected_run_length(tpr: float, fpr: float, num_acceptable: int) -> float:
    """Thm 3.3: E[N] = alpha (1 - alpha^n)/(1 - alpha) + alpha^n beta/(1 - beta)."""
    head = num_acceptable * 1.0 if tpr == 1.0 else tpr * (1.0 - tpr**num_acceptable) / (1.0 - tpr)
    return head + tpr**num_acceptable * fpr / (1.0 - fpr)


def total_variation_distance(first: np.ndarray, second: np.ndarray) -> float:
    return 0.5 * float(np.abs(np.asarray(first) - np.asarray(second)).sum())


# ----- speed -----------------------------------------------------------------------------------
def expected_block_efficiency(acceptance: float, draft_len: int) -> float:
    """(1 - a^(L+1)) / (1 - a): tokens per target call at a constant acceptance rate (Leviathan)."""
    if acceptance >= 1.0:
        return draft_len + 1.0
    return (1.0 - acceptance ** (draft_len + 1)) / (1.0 - acceptance)


def expected_speedup(acceptance: float, draft_len: int, overhead: float) -> float:
    """(1 - a^(L+1)) / ((1 - a)(1 + overhead)); overhead = L * c for a draft of cost ratio c."""
    return expected_block_efficiency(acceptance, draft_len) / (1.0 + overhead)


def block_efficiency_from_positions(position_acceptance) -> float:
    """1 + sum_i prod_{j<=i} a_j from measured per-position acceptance rates a_1..a_L
    (a_i = P(tau >= i | tau >= i-1))."""
    survive, total = 1.0, 1.0
    for rate in position_acceptance:
        survive *= rate
        total += survive
    return total

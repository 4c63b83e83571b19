"""Monte-Carlo criterion shared by the verification-rule tests (ALGORITHMS.md §14.1 item 6).
Import as ``from tests.verify.mc import mc_completed_counts, chi_square_pvalue``; samplers and the
exact criterion live in ``tests.verify.exact``.

``mc_completed_counts`` runs n independent iterations of a verifier with a ``SeededRng``,
completes every output (x_{1:tau}, y) to ``draft_len + 1`` tokens by
sampling the tail from the target process the iteration leaves behind (the modified process for
rules that carry a ``ModificationWindow``), and counts the completed sequences;
``chi_square_pvalue`` compares such counts with the exact target law (Pearson chi-square, cells
with expected count < 5 pooled into one cell).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable

import numpy as np
from scipy.stats import chi2

from verispec.core.rng import SeededRng
from verispec.theory.enumerate import LayeredProcess
from verispec.verify.base import Verifier

ProbFn = Callable[[tuple[int, ...]], np.ndarray]


def mc_completed_counts(
    verifier: Verifier,
    sampler,
    target: ProbFn,
    draft: ProbFn,
    draft_len: int,
    n: int,
    seed: int,
) -> dict[tuple[int, ...], int]:
    """Counts of n completed outputs over V^{draft_len + 1}.

    Each iteration draws a draft with ``sampler(rng, draft)`` (``rng = SeededRng(seed)``, shared
    by all iterations), scores every node with ``target``, and verifies. Outputs are completed to
    ``draft_len + 1`` tokens from the target process the iteration leaves (the rule's
    modification window, if any, applied as in ``completed_block_law``); the completion is
    vectorised: outputs are grouped and each group's count is split over next tokens by one
    multinomial draw per distinct prefix (numpy Generator seeded with ``seed + 1``).
    """
    rng = SeededRng(seed)
    groups: Counter = Counter()
    for _ in range(int(n)):
        skeleton = sampler(rng, draft)
        target_probs = np.stack([target(prefix) for prefix in skeleton.prefixes])
        result = verifier.verify(skeleton.with_target(target_probs, validate=False), rng)
        groups[(result.output_tokens, result.modification)] += 1
    completer = np.random.default_rng(seed + 1)
    base = LayeredProcess(target, draft)
    counts: dict[tuple[int, ...], int] = defaultdict(int)
    for (output, window), count in groups.items():
        process = base.with_layer(output, window)
        frontier = {output: count}
        while frontier:
            nxt: dict[tuple[int, ...], int] = {}
            for prefix, prefix_count in frontier.items():
                if len(prefix) >= draft_len + 1:
                    counts[prefix] += prefix_count
                    continue
                probs = np.asarray(process.probs(prefix), dtype=np.float64)
                split = completer.multinomial(prefix_count, probs / probs.sum())
                for token in np.flatnonzero(split):
                    nxt[prefix + (int(token),)] = int(split[token])
            frontier = nxt
    return dict(counts)


def chi_square_pvalue(counts: dict, probs: dict, min_expected: float = 5.0) -> float:
    """Pearson chi-square p-value of ``counts`` (dict cell -> count) against ``probs`` (dict
    cell -> probability). Cells with expected count < ``min_expected`` are pooled into one cell;
    a count on a cell of probability 0 gives p-value 0."""
    n = sum(counts.values())
    if any(count > 0 and probs.get(cell, 0.0) <= 0.0 for cell, count in counts.items()):
        return 0.0
    cells = list(probs)
    expected = n * np.array([probs[c] for c in cells], dtype=np.float64)
    observed = np.array([counts.get(c, 0) for c in cells], dtype=np.float64)
    small = expected < min_expected
    exp_cells = list(expected[~small])
    obs_cells = list(observed[~small])
    if small.any():
        exp_cells.append(expected[small].sum())
        obs_cells.append(observed[small].sum())
    exp_arr, obs_arr = np.array(exp_cells), np.array(obs_cells)
    keep = exp_arr > 0
    exp_arr, obs_arr = exp_arr[keep], obs_arr[keep]
    if exp_arr.size < 2:
        return 1.0
    statistic = float(((obs_arr - exp_arr) ** 2 / exp_arr).sum())
    return float(chi2.sf(statistic, exp_arr.size - 1))


def empirical_tv(counts: dict, probs: dict) -> float:
    """Total variation between the empirical law of ``counts`` and ``probs``."""
    n = sum(counts.values())
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys)


def tv_noise_floor(probs: dict, n: int) -> float:
    """E[TV_emp] ≈ 1/2 sum_x sqrt(2 P(x) / (pi n)) for a correct sampler (§14.1 item 6)."""
    return 0.5 * sum(np.sqrt(2.0 * p / (np.pi * n)) for p in probs.values())


def detectable_tv(n: int, num_cells: int, alpha: float, power: float = 0.99) -> float:
    """Smallest TV (on the pooled cells) that the Pearson chi-square test with ``num_cells`` cells
    rejects at level ``alpha`` with probability >= ``power`` from n samples, whatever the shape of
    the error.

    Under an alternative P1 the statistic is approximately noncentral chi-square with
    df = num_cells - 1 and noncentrality lam = n Σ (P1 - P0)^2 / P0. By Cauchy-Schwarz,
    (Σ |P1 - P0|)^2 <= Σ (P1 - P0)^2 / P0 · Σ P0, i.e. lam >= 4 n TV^2. So every alternative with
    TV >= sqrt(lam* / (4 n)) is rejected with probability >= power, lam* solving
    P(ncx2(df, lam*) > chi2.isf(alpha, df)) = power.
    """
    from scipy.optimize import brentq
    from scipy.stats import ncx2

    df = num_cells - 1
    critical = chi2.isf(alpha, df)
    lam = brentq(lambda value: ncx2.sf(critical, df, value) - power, 1e-6, 1e7)
    return float(np.sqrt(lam / (4.0 * n)))


def pooled_cell_count(probs: dict, n: int, min_expected: float = 5.0) -> int:
    """Number of cells ``chi_square_pvalue`` tests after pooling the small ones."""
    expected = n * np.array([p for p in probs.values() if p > 0])
    return int((expected >= min_expected).sum() + (expected < min_expected).any())

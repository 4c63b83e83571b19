"""Theory calculators (ALGORITHMS.md §11, §14.4, speedup formula)."""

import numpy as np
import pytest

from verispec.draft.samplers import sample_chain
from verispec.theory import closed_forms as cf
from verispec.core.rng import enumerate_outcomes
from verispec.theory.enumerate import LayeredProcess, block_law, run_step, total_variation
from verispec.models.toy import context_free_pair
from verispec.verify.sprinter import IdealizedSprinter


def test_sprinter_expected_run_length_test_vector():
    assert cf.sprinter_expected_run_length(0.9, 0.3, 5) == pytest.approx(3.938657, abs=5e-7)


def test_sprinter_run_length_pmf_sums_to_one_and_matches_mean():
    tpr, fpr, n = 0.8, 0.25, 4
    ks = np.arange(0, 400)
    pmf = np.array([cf.sprinter_run_length_pmf(tpr, fpr, n, k) for k in ks])
    assert pmf.sum() == pytest.approx(1.0, abs=1e-12)
    assert (ks * pmf).sum() == pytest.approx(cf.sprinter_expected_run_length(tpr, fpr, n), abs=1e-12)
    assert cf.sprinter_expected_run_length(1.0, 0.2, 3) == pytest.approx(3 + 0.2 / 0.8)


def test_sprinter_run_length_matches_simulation():
    """Thm 3.3 by simulation: first n drafted tokens acceptable, the rest not, i.i.d. decisions.
    200k runs; |mean - E[N]| < 5 sigma/sqrt(n) (false-alarm rate ~6e-7)."""
    rng = np.random.default_rng(0)
    tpr, fpr, n, runs = 0.9, 0.3, 5, 200_000
    lengths = np.zeros(runs)
    for i in range(runs):
        k = 0
        while rng.random() < (tpr if k < n else fpr):
            k += 1
        lengths[i] = k
    expected = cf.sprinter_expected_run_length(tpr, fpr, n)
    assert abs(lengths.mean() - expected) < 5 * lengths.std() / np.sqrt(runs)


@pytest.mark.parametrize("fpr", [0.0, 0.3, 0.7])
def test_sprinter_token_law_by_enumeration(fpr):
    """Thm 3.1 on one token: law (1 - beta) p + beta q, TV = beta TV(p, q), kept prob 1 - (1-beta) TV."""
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.3, 0.2])
    target, draft = context_free_pair(p, q)
    law = block_law(IdealizedSprinter(tpr=0.9, fpr=fpr), lambda rng, fn: sample_chain(rng, fn, 1), target, draft)
    first = {}
    for output, prob in law.probs.items():
        first[output[0]] = first.get(output[0], 0.0) + prob
    expected = cf.sprinter_token_law(p, q, fpr)
    assert max(abs(first.get(x, 0.0) - expected[x]) for x in range(3)) < 1e-12
    assert total_variation(first, dict(enumerate(p))) == pytest.approx(fpr * cf.total_variation_distance(p, q), abs=1e-12)
    # probability that the drafted token is kept, by enumerating the same rule (Thm A.4)
    process = LayeredProcess(target, draft)

    def kept(rng):
        result = run_step(IdealizedSprinter(tpr=0.9, fpr=fpr), lambda r, fn: sample_chain(r, fn, 1), process, (), rng)
        return bool(result.accepted_len == 1 or result.diagnostics.get("kept_draft_token"))

    kept_law = enumerate_outcomes(kept)
    assert kept_law.get(True, 0.0) == pytest.approx(cf.sprinter_kept_probability(p, q, fpr), abs=1e-12)
    assert cf.sprinter_kept_probability(p, q, fpr) == pytest.approx(1 - (1 - fpr) * 0.4)


def test_speedup_formula():
    assert cf.expected_block_efficiency(0.5, 3) == pytest.approx((1 - 0.5**4) / 0.5)
    assert cf.expected_speedup(0.8, 4, overhead=4 * 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert cf.expected_block_efficiency(1.0, 5) == 6.0
    assert cf.block_efficiency_from_positions([0.5, 0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25 + 0.125)

"""The fast ``below_mass_all`` (one int64 value sort, ``sorted_local_order``) against the old one
(one ``np.argsort`` + ``local_order`` on ties, kept in ``below_mass_reference.py``), ALGORITHMS.md
§7.1-7.2.

Both must give the SAME floats, not merely close ones: the local order (ratio ascending, exact
ties by the lower id ranking lower) is a total order, so the cumulative sums are taken in the
same sequence. The fixtures cover what the packed sort key can get wrong: exact ties (the id
bits must break them, lower id first), near ties whose ratios differ only in the low bits the key
replaces by the id (the repair must reorder them), exact zeros in p (the r = 0 bottom block) and
in q (no mass), truncated rows, point masses, disjoint supports, inf / subnormal ratios and
float32 inputs. The benchmark-sized dense rows (V = 50k) are the case the speed-up is for.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.verify.below_mass_reference import below_mass_all_reference
from verispec.verify.greedy_selection import below_mass_all, below_mass_on_supports, local_order, sorted_local_order


def softmax(logits: np.ndarray) -> np.ndarray:
    weights = np.exp(logits - logits.max())
    return weights / weights.sum()


def index_bits(count: int) -> int:
    return max(count - 1, 0).bit_length()


def near_tie_ratios(count: int, seed: int) -> np.ndarray:
    """Ratios in clusters of values a few ulps apart, within the low ``index_bits(count)`` bits
    that the packed key drops, placed so the higher-ratio member often has the LOWER position."""
    rng = np.random.default_rng(seed)
    centres = rng.uniform(0.1, 10.0, size=max(count // 4, 1))
    base = centres[rng.integers(len(centres), size=count)]
    offsets = rng.integers(0, 2 ** index_bits(count), size=count)  # ulps, all inside one key bucket
    bits = (base.view(np.int64) >> index_bits(count) << index_bits(count)) + offsets
    return bits.view(np.float64)


def ratio_fixtures():
    rng = np.random.default_rng(20261123)
    yield "random", rng.uniform(0.0, 5.0, size=1000)
    yield "exact_ties", rng.choice([0.5, 1.0, 2.5, 4.0], size=777)
    yield "all_equal", np.ones(4096)
    yield "near_ties_small", np.array([np.nextafter(1.0, 2.0), 1.0, 1.0, np.nextafter(1.0, 0.0)])
    yield "near_ties", near_tie_ratios(5000, seed=1)
    yield "near_and_exact_ties", np.concatenate([near_tie_ratios(3000, seed=2), np.full(3000, 1.0)])[rng.permutation(6000)]
    yield "inf_zero_subnormal", np.array([np.inf, 0.0, 5e-324, 1e-310, 1e300, np.inf, 0.0, 1.0, 5e-324])
    yield "single", np.array([0.7])
    yield "empty", np.array([])
    yield "large_random", np.exp(rng.standard_normal(50_000) * 2)


@pytest.mark.parametrize("name, ratios", list(ratio_fixtures()), ids=[name for name, _ in ratio_fixtures()])
def test_sorted_local_order_is_local_order(name, ratios):
    """The packed-key sort returns exactly ``local_order`` (ratio, then position, ascending)."""
    expected = local_order(ratios, np.arange(len(ratios)))
    got = sorted_local_order(ratios)
    assert got.dtype.kind == "i" and np.array_equal(got, expected), name


def test_near_ties_need_the_repair():
    """The near-tie fixtures really produce keys out of ratio order before the repair (else the
    test above would not test the repair); the packed-key order alone is wrong on them."""
    ratios = near_tie_ratios(5000, seed=1)
    bits = index_bits(len(ratios))
    keys = np.sort((ratios.view(np.int64) >> bits << bits) | np.arange(len(ratios)))
    ranked = ratios[keys & ((1 << bits) - 1)]
    assert np.count_nonzero(ranked[1:] < ranked[:-1]) > 100


def row_pairs():
    """(target, draft) rows, shape (V,) each."""
    rng = np.random.default_rng(7)
    vocab = 50_000
    shared = 3.0 * rng.standard_normal(vocab)
    dense_p, dense_q = softmax(shared + 0.6 * rng.standard_normal(vocab)), softmax(shared + 0.6 * rng.standard_normal(vocab))
    yield "dense_50k", dense_p, dense_q
    yield "p_equals_q_50k", dense_q, dense_q
    # the same law computed twice with different rounding: ratios within a few ulps of each other
    yield "p_almost_q_50k", dense_q, softmax(np.log(dense_q) * (1 + 1e-15))

    def top_k(vector, k):
        kept = np.zeros_like(vector)
        index = np.argsort(vector)[-k:]
        kept[index] = vector[index]
        return kept / kept.sum()

    yield "top_k_both", top_k(dense_p, 4000), top_k(dense_q, 3000)  # zeros in p, in q, in both
    yield "top_k_target_only", top_k(dense_p, 50), dense_q
    yield "top_k_draft_only", dense_p, top_k(dense_q, 50)
    # dyadic values: exact ties between tokens that carry different draft masses, and q = 0 < p
    dyadic = np.array([0.0, 0.125, 0.25, 0.5])
    for seed in range(20):
        small = np.random.default_rng([seed, 3])
        size = int(small.integers(2, 40))
        target, draft = small.choice(dyadic, size=size), small.choice(dyadic, size=size)
        if target.sum() > 0 and draft.sum() > 0:
            yield f"dyadic_{seed}", target / target.sum(), draft / draft.sum()
    tied_q = np.repeat([0.5, 0.25, 0.125], [1, 2, 4]) / 1.5
    tied_p = np.where(np.arange(7) % 3 == 0, 0.0, tied_q)
    yield "tied_with_zero_p", tied_p / tied_p.sum(), tied_q
    point = np.zeros(1000)
    point[17] = 1.0
    yield "point_masses_same", point, point.copy()
    other = np.zeros(1000)
    other[900] = 1.0
    yield "point_masses_disjoint", point, other
    half = np.zeros(1000)
    half[:500] = 1 / 500
    yield "disjoint_supports", half, half[::-1].copy()
    near_draft = rng.uniform(0.5, 1.5, size=5000)
    near_draft /= near_draft.sum()
    yield "near_tie_ratios", near_draft * near_tie_ratios(5000, seed=3), near_draft
    yield "float32", dense_p.astype(np.float32), dense_q.astype(np.float32)


@pytest.mark.parametrize("name, target, draft", list(row_pairs()), ids=[name for name, _, _ in row_pairs()])
def test_below_mass_all_equals_the_old_computation(name, target, draft):
    """Bit-identical to the argsort + lexsort version on every token (q = 0 tokens included)."""
    expected = below_mass_all_reference(target, draft)
    got = below_mass_all(target, draft)
    assert got.shape == expected.shape == (len(draft),)
    assert np.array_equal(got, expected), (name, int(np.count_nonzero(got != expected)))


@pytest.mark.parametrize("name, target, draft", list(row_pairs()), ids=[name for name, _, _ in row_pairs()])
def test_below_mass_on_supports_equals_below_mass_all(name, target, draft):
    """The support form (issue 16: no pass over V) gives the same floats as the dense form, for
    every token (q = 0 and p = 0 tokens included), with exact supports and with supersets that
    list zero entries (LogitRows may)."""
    target, draft = np.asarray(target, dtype=np.float64), np.asarray(draft, dtype=np.float64)
    expected = below_mass_all(target, draft)
    everything = np.arange(len(draft))
    exact = below_mass_on_supports(np.flatnonzero(target), target[target > 0], np.flatnonzero(draft),
                                   draft[draft > 0], everything)
    assert np.array_equal(exact, expected), (name, int(np.count_nonzero(exact != expected)))
    padded = below_mass_on_supports(everything, target, everything, draft, everything)
    assert np.array_equal(padded, expected), name
    some = np.random.default_rng(1).choice(len(draft), size=min(7, len(draft)), replace=False)
    assert np.array_equal(below_mass_on_supports(np.flatnonzero(target), target[target > 0], everything, draft, some),
                          expected[some]), name

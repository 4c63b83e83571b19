"""The injectable Rng (ALGORITHMS.md §14.1 item 1): seeded Monte-Carlo draws and the replay
enumerator that gives the exact output law of a program."""

import itertools
from fractions import Fraction

import numpy as np
import pytest

from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.errors import InvalidDistributionError


def _draw_sequence(rng: SeededRng, count: int = 50) -> list:
    probs = np.array([0.1, 0.2, 0.3, 0.4])
    return [(rng.categorical(probs), rng.bernoulli(0.37)) for _ in range(count)]


# ----- SeededRng -----------------------------------------------------------------------------


def test_seeded_rng_is_reproducible_with_a_fixed_seed():
    assert _draw_sequence(SeededRng(123)) == _draw_sequence(SeededRng(123))


def test_seeded_rng_differs_across_seeds():
    assert _draw_sequence(SeededRng(1)) != _draw_sequence(SeededRng(2))


def test_seeded_rng_accepts_a_numpy_generator():
    from_seed = _draw_sequence(SeededRng(7))
    from_generator = _draw_sequence(SeededRng(np.random.default_rng(7)))
    assert from_seed == from_generator


@pytest.mark.parametrize(
    "probs",
    [
        np.array([0.0, 0.3, 0.0, 0.7, 0.0]),  # zeros first, in the middle and last
        np.array([1.0, 0.0, 0.0]),  # point mass on the first entry
        np.array([0.0, 0.0, 1.0]),  # point mass on the last entry
    ],
    ids=["mixed", "first", "last"],
)
def test_categorical_never_returns_a_zero_probability_index(probs):
    rng = SeededRng(0)
    draws = np.array([rng.categorical(probs) for _ in range(100_000)])
    assert set(np.unique(draws)) <= set(np.flatnonzero(probs > 0))


def test_categorical_never_returns_zero_probability_on_a_large_sparse_vector():
    # many tiny entries and trailing zeros: cumsum(probs)[-1] and probs.sum() differ by rounding,
    # which exercises the "u * total rounded up to the last cdf value" fallback
    generator = np.random.default_rng(5)
    probs = generator.random(2000) ** 8
    probs[generator.random(2000) < 0.5] = 0.0
    probs[-300:] = 0.0
    probs /= probs.sum()
    rng = SeededRng(1)
    draws = np.array([rng.categorical(probs) for _ in range(100_000)])
    assert np.all(probs[draws] > 0)


def test_categorical_frequencies_match_the_probabilities():
    probs = np.array([0.05, 0.0, 0.25, 0.7])
    rng = SeededRng(11)
    n = 100_000
    counts = np.bincount([rng.categorical(probs) for _ in range(n)], minlength=4)
    sigma = np.sqrt(n * probs * (1 - probs))
    assert np.all(np.abs(counts - n * probs) <= 5 * sigma + 1e-9)


@pytest.mark.parametrize("prob,expected", [(1.5, True), (1.0, True), (0.0, False), (-0.3, False)])
def test_bernoulli_clamps_into_unit_interval(prob, expected):
    rng = SeededRng(3)
    assert all(rng.bernoulli(prob) is expected for _ in range(10_000))


def test_bernoulli_frequency():
    rng = SeededRng(4)
    n = 100_000
    hits = sum(rng.bernoulli(0.3) for _ in range(n))
    assert abs(hits - 0.3 * n) <= 5 * np.sqrt(n * 0.3 * 0.7)


@pytest.mark.parametrize(
    "probs,fragment",
    [
        ([0.5, np.nan, 0.5], "nan"),
        ([0.5, np.inf], "inf"),
        ([0.5, 0.4], "0.9"),  # sum < 1
        ([0.6, 0.6], "1.2"),  # sum > 1
        ([0.0, 0.0], "0.0"),  # no mass at all
    ],
)
def test_categorical_rejects_nan_and_bad_sums(probs, fragment):
    with pytest.raises(InvalidDistributionError, match=rf"summing to 1, got sum {fragment}"):
        SeededRng(0).categorical(np.array(probs))


def test_replay_categorical_rejects_bad_sums_too():
    with pytest.raises(InvalidDistributionError, match="summing to 1"):
        enumerate_outcomes(lambda rng: rng.categorical(np.array([0.5, 0.4])))
    with pytest.raises(InvalidDistributionError, match="summing to 1"):
        enumerate_outcomes(lambda rng: rng.categorical(np.array([np.nan, 1.0])))


# ----- enumerate_outcomes ----------------------------------------------------------------------

FIRST = [Fraction(1, 2), Fraction(1, 4), Fraction(1, 4)]
SECOND = [Fraction(1, 3), Fraction(0), Fraction(2, 3)]


def _bias(first: int) -> Fraction:
    return Fraction(1, 5) if first == 0 else Fraction(3, 5)


def _program(rng):
    """Two categoricals and a bernoulli whose bias depends on the first draw."""
    first = rng.categorical(np.array([float(f) for f in FIRST]))
    second = rng.categorical(np.array([float(f) for f in SECOND]))
    flip = rng.bernoulli(float(_bias(first)))
    return first, second, flip


def _hand_law() -> dict:
    law = {}
    for first, second, flip in itertools.product(range(3), range(3), (True, False)):
        bias = _bias(first)
        prob = FIRST[first] * SECOND[second] * (bias if flip else 1 - bias)
        if prob:
            law[(first, second, flip)] = prob
    return law


def test_enumerate_outcomes_gives_the_exact_product_law():
    law = enumerate_outcomes(_program)
    expected = _hand_law()
    assert set(law) == set(expected)  # zero-probability branches are never visited
    for outcome, prob in expected.items():
        assert law[outcome] == pytest.approx(float(prob), abs=1e-15)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15)


def test_enumerate_outcomes_sums_outputs_reached_by_several_leaves():
    law = enumerate_outcomes(lambda rng: sum(_program(rng)[:2]))  # first + second token
    expected: dict[int, Fraction] = {}
    for (first, second, _), prob in _hand_law().items():
        expected[first + second] = expected.get(first + second, Fraction(0)) + prob
    assert set(law) == set(expected)
    for outcome, prob in expected.items():
        assert law[outcome] == pytest.approx(float(prob), abs=1e-15)


def test_enumerate_outcomes_handles_choices_that_depend_on_earlier_ones():
    # a variable number of choices: keep flipping a 1/3-coin until heads, at most 4 times
    def program(rng):
        for flips in range(1, 5):
            if rng.bernoulli(1 / 3):
                return flips
        return 0

    law = enumerate_outcomes(program)
    expected = {k: Fraction(2, 3) ** (k - 1) * Fraction(1, 3) for k in range(1, 5)}
    expected[0] = Fraction(2, 3) ** 4
    assert law == pytest.approx({k: float(v) for k, v in expected.items()}, abs=1e-15)
    assert sum(law.values()) == pytest.approx(1.0, abs=1e-15)


def test_enumerate_outcomes_clamps_bernoulli():
    assert enumerate_outcomes(lambda rng: rng.bernoulli(1.7)) == {True: 1.0}
    assert enumerate_outcomes(lambda rng: rng.bernoulli(-0.2)) == {False: 1.0}


def test_enumerate_outcomes_runs_the_program_once_per_leaf():
    runs = []

    def program(rng):
        runs.append(1)
        return _program(rng)

    enumerate_outcomes(program)
    # 3 first tokens x 2 second tokens with positive mass x 2 coin sides
    assert len(runs) == 12


def test_enumerate_outcomes_raises_beyond_max_leaves():
    assert len(enumerate_outcomes(_program, max_leaves=12)) == 12
    with pytest.raises(RuntimeError, match="exceeded 11 leaves"):
        enumerate_outcomes(_program, max_leaves=11)

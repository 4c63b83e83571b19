"""Sampling parameters applied before verification (ALGORITHMS.md §1 rule 1, DESIGN.md §4)."""

import numpy as np
import pytest
import torch

from verispec.core.sampling import SamplingParams, logits_to_probs, process_probs
from verispec.errors import ConfigError, InvalidDistributionError


def _softmax64(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def _random_logits(rows: int, vocab: int, scale: float, seed: int) -> np.ndarray:
    return scale * np.random.default_rng(seed).standard_normal((rows, vocab))


# ----- SamplingParams --------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [-0.1, -1.0, float("nan"), float("inf")])
def test_bad_temperature(temperature):
    with pytest.raises(ConfigError, match=r"temperature must be >= 0 \(0 = greedy\)"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("top_p", [0.0, -0.1, 1.0001, 2.0])
def test_top_p_outside_unit_interval(top_p):
    with pytest.raises(ConfigError, match=rf"top_p must lie in \(0, 1\], got {top_p}"):
        SamplingParams(top_p=top_p)


@pytest.mark.parametrize("top_k", [-1, 2.5])
def test_bad_top_k(top_k):
    with pytest.raises(ConfigError, match=rf"top_k must be an integer >= 0 \(0 disables it\), got {top_k}"):
        SamplingParams(top_k=top_k)


def test_valid_edge_parameters():
    assert SamplingParams(temperature=0.0).greedy
    assert not SamplingParams(temperature=1e-3).greedy
    SamplingParams(top_p=1.0, top_k=0)
    SamplingParams(top_p=1e-9, top_k=1)


# ----- logits_to_probs -------------------------------------------------------------------------


def test_greedy_is_one_hot_with_lowest_id_on_ties():
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 5.0, 0.0, 5.0], [-1.0, -2.0, -3.0, -0.5]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0))
    assert probs.dtype == np.float64
    expected = np.zeros((3, 4))
    expected[[0, 1, 2], [1, 0, 3]] = 1.0
    np.testing.assert_array_equal(probs, expected)


def test_greedy_ignores_top_k_and_top_p():
    logits = torch.tensor([[0.0, 4.0, 1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.5))
    np.testing.assert_array_equal(probs, [[0.0, 1.0, 0.0]])


@pytest.mark.parametrize("temperature", [0.3, 1.0, 2.5])
def test_temperature_scaling_equals_softmax_of_scaled_logits(temperature):
    logits = _random_logits(4, 1000, 3.0, seed=1)
    probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(temperature=temperature))
    assert probs.dtype == np.float64 and probs.shape == (4, 1000)
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0, atol=1e-12)
    # the scaling runs in float32 before the float64 cast: relative error ~1e-6
    np.testing.assert_allclose(probs, _softmax64(logits / temperature), rtol=2e-5, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_any_float_dtype_gives_float64(dtype):
    logits = torch.tensor([[0.5, 1.5, -1.0]], dtype=dtype)
    probs = logits_to_probs(logits, SamplingParams())
    assert probs.dtype == np.float64
    np.testing.assert_allclose(probs, _softmax64(logits.double().numpy()), rtol=1e-5)


@pytest.mark.parametrize("top_k", [1, 5, 50, 999])
def test_top_k_keeps_the_k_most_likely_tokens(top_k):
    logits = _random_logits(3, 1000, 2.0, seed=2)
    probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(temperature=0.7, top_k=top_k))
    for row, row_logits in zip(probs, logits):
        kept = np.flatnonzero(row > 0)
        assert len(kept) == top_k
        assert set(kept) == set(np.argsort(-row_logits)[:top_k])
        expected = _softmax64(row_logits[kept] / 0.7)
        np.testing.assert_allclose(row[kept], expected, rtol=2e-5)


def test_top_k_at_least_vocab_size_is_a_no_op():
    logits = _random_logits(2, 10, 1.0, seed=3)
    full = logits_to_probs(torch.from_numpy(logits), SamplingParams())
    np.testing.assert_array_equal(logits_to_probs(torch.from_numpy(logits), SamplingParams(top_k=10)), full)
    np.testing.assert_array_equal(logits_to_probs(torch.from_numpy(logits), SamplingParams(top_k=50)), full)


def _nucleus_reference(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Brute force: full sort (descending probability, lowest id first on ties), keep the
    smallest prefix whose mass reaches top_p, renormalise."""
    out = np.zeros_like(probs)
    for index, row in enumerate(probs):
        order = np.lexsort((np.arange(len(row)), -row))
        cumulative = np.cumsum(row[order])
        size = int(np.argmax(cumulative >= top_p)) + 1 if cumulative[-1] >= top_p else len(row)
        kept = order[:size]
        out[index, kept] = row[kept] / row[kept].sum()
    return out


def _float32_probs(logits: np.ndarray, temperature: float) -> np.ndarray:
    """The un-truncated distribution exactly as logits_to_probs computes it before the mask."""
    return torch.softmax(torch.from_numpy(logits).float() / temperature, dim=-1).double().numpy()


@pytest.mark.parametrize("top_p", [0.05, 0.3, 0.5, 0.9, 0.95, 0.999])
@pytest.mark.parametrize("scale", [0.3, 2.0, 6.0], ids=["flat", "medium", "peaked"])
def test_top_p_matches_a_full_sort_reference(top_p, scale):
    # "flat" logits need nuclei far larger than the first partial selection of 64 tokens
    logits = _random_logits(5, 1000, scale, seed=int(scale * 10))
    probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(top_p=top_p))
    expected = _nucleus_reference(_float32_probs(logits, 1.0), top_p)
    np.testing.assert_array_equal(probs > 0, expected > 0)
    np.testing.assert_allclose(probs, expected, rtol=1e-12, atol=0)


def test_top_p_nucleus_is_the_smallest_prefix_reaching_top_p():
    logits = _random_logits(6, 1000, 2.0, seed=4)
    top_p = 0.8
    probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(top_p=top_p))
    full = _float32_probs(logits, 1.0)
    for kept_row, full_row in zip(probs, full):
        kept = kept_row > 0
        assert full_row[kept].sum() >= top_p - 1e-12  # reaches top_p ...
        smallest_kept = full_row[kept].min()
        assert full_row[kept].sum() - smallest_kept < top_p  # ... and no smaller prefix does
        assert np.all(full_row[~kept] <= smallest_kept)  # and it is a prefix of the sorted order


def test_top_p_breaks_ties_by_lowest_token_id():
    # four tied tokens of ~0.2436 each: top_p = 0.45 keeps exactly the two lowest ids
    logits = torch.tensor([[1.0, 0.0, 1.0, 1.0, 1.0, -50.0]], dtype=torch.float64)
    probs = logits_to_probs(logits, SamplingParams(top_p=0.45))
    np.testing.assert_array_equal(np.flatnonzero(probs[0]), [0, 2])


TIES_ACROSS_PARTITION = (
    "bug: _top_p_mask's first np.argpartition selection (64 tokens) cuts through a block of tied "
    "probabilities and keeps an arbitrary subset of the tied ids, not the lowest ones"
)


def test_top_p_uniform_large_vocab_keeps_lowest_ids():
    probs = logits_to_probs(torch.zeros(1, 1000), SamplingParams(top_p=0.01))
    np.testing.assert_array_equal(np.flatnonzero(probs[0]), np.arange(10))


def test_top_p_with_ties_matches_reference():
    logits = np.random.default_rng(8).integers(0, 6, size=(4, 1000)).astype(np.float64)
    for top_p in (0.1, 0.5, 0.77):
        probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(top_p=top_p))
        np.testing.assert_array_equal(probs > 0, _nucleus_reference(_float32_probs(logits, 1.0), top_p) > 0)


def test_top_p_with_temperature_and_top_k():
    logits = _random_logits(3, 1000, 2.0, seed=5)
    params = SamplingParams(temperature=0.8, top_k=40, top_p=0.7)
    probs = logits_to_probs(torch.from_numpy(logits), params)
    scaled = torch.from_numpy(logits).float() / 0.8
    kth = torch.topk(scaled, 40, dim=-1).values[:, -1:]
    truncated = torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1).double().numpy()
    expected = _nucleus_reference(truncated, 0.7)
    np.testing.assert_array_equal(probs > 0, expected > 0)
    np.testing.assert_allclose(probs, expected, rtol=1e-6)  # float32 softmax, max-shifted first
    assert np.all((probs > 0).sum(axis=1) <= 40)


def test_tiny_top_p_keeps_only_the_argmax():
    logits = _random_logits(3, 1000, 1.0, seed=6)
    probs = logits_to_probs(torch.from_numpy(logits), SamplingParams(top_p=1e-9))
    expected = np.zeros_like(probs)
    expected[np.arange(3), logits.argmax(axis=1)] = 1.0
    np.testing.assert_array_equal(probs, expected)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.0)], ids=["sample", "greedy"])
def test_non_finite_logits_raise(bad, params):
    logits = torch.tensor([[0.0, 1.0, 2.0], [0.0, bad, 1.0]])
    with pytest.raises(InvalidDistributionError, match=r"the model produced NaN, \+inf or all -inf logits"):
        logits_to_probs(logits, params)


@pytest.mark.parametrize("params", [SamplingParams(), SamplingParams(temperature=0.0)], ids=["sample", "greedy"])
def test_minus_inf_logits_mask_tokens_but_an_all_masked_row_raises(params):
    probs = logits_to_probs(torch.tensor([[0.0, float("-inf"), 1.0]]), params)
    assert probs[0, 1] == 0.0 and probs.sum() == pytest.approx(1.0)
    with pytest.raises(InvalidDistributionError, match="all -inf"):
        logits_to_probs(torch.full((1, 3), float("-inf")), params)


def test_tiny_temperature_does_not_overflow():
    probs = logits_to_probs(torch.tensor([[0.0, 120.0, 1.0]]), SamplingParams(temperature=1e-39))
    np.testing.assert_array_equal(probs, [[0.0, 1.0, 0.0]])


# ----- process_probs ---------------------------------------------------------------------------

PROBS_WITH_ZEROS = np.array(
    [
        [0.0, 0.5, 0.2, 0.0, 0.3],
        [0.1, 0.0, 0.0, 0.0, 0.9],
        [0.0, 0.0, 1.0, 0.0, 0.0],
    ]
)


def test_process_probs_default_params_is_identity():
    np.testing.assert_array_equal(process_probs(PROBS_WITH_ZEROS, SamplingParams()), PROBS_WITH_ZEROS)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0.5),
        SamplingParams(temperature=3.0),
        SamplingParams(temperature=100.0),
        SamplingParams(top_k=2),
        SamplingParams(top_p=0.6),
        SamplingParams(temperature=2.0, top_k=3, top_p=0.9),
        SamplingParams(temperature=0.0),
    ],
    ids=["T0.5", "T3", "T100", "k2", "p0.6", "T2k3p0.9", "greedy"],
)
def test_process_probs_keeps_zeros_at_zero(params):
    out = process_probs(PROBS_WITH_ZEROS, params)
    assert out.dtype == np.float64
    assert np.all(out[PROBS_WITH_ZEROS == 0] == 0.0)
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("temperature", [0.5, 2.0])
def test_process_probs_temperature_is_a_power(temperature):
    out = process_probs(PROBS_WITH_ZEROS, SamplingParams(temperature=temperature))
    powered = PROBS_WITH_ZEROS ** (1.0 / temperature)
    np.testing.assert_allclose(out, powered / powered.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-12)


def test_process_probs_greedy():
    out = process_probs(PROBS_WITH_ZEROS, SamplingParams(temperature=0.0))
    np.testing.assert_array_equal(out.argmax(axis=1), [1, 4, 2])
    np.testing.assert_array_equal(out.max(axis=1), 1.0)


def test_tiny_positive_temperature_gives_a_distribution_or_a_clear_error():
    try:
        probs = logits_to_probs(torch.tensor([[1.0, 2.0, 0.5]]), SamplingParams(temperature=1e-39))
    except (ConfigError, InvalidDistributionError):
        return
    assert np.all(np.isfinite(probs))
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0)

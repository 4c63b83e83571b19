"""The seed's Gumbel noise (core.noise): the stream layout, and the fast paths of the draw (the
noise of an untruncated row read as a view of the cache) agree with the definition."""

import numpy as np
import pytest

from verispec.core.noise import GumbelNoise, gumbel_max
from verispec.errors import ConfigError


def reference_exponentials(seed: int, position: int, ids) -> np.ndarray:
    """E = -log u from the documented layout, computed directly."""
    ids = np.asarray(ids)
    words = np.random.Philox(key=seed, counter=[0, position, 0, 0]).random_raw(int(ids.max()) + 1)
    return -np.log(((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53)[ids]


def test_exponentials_follow_the_documented_layout_bit_for_bit():
    noise = GumbelNoise(11)
    for position in (0, 7, 123):
        ids = np.array([5, 0, 300, 299, 17])
        assert np.array_equal(noise.exponentials(position, ids), reference_exponentials(11, position, ids))
        # a longer request regenerates the position; the shorter prefix keeps its values
        assert np.array_equal(noise.leading(position, 1000), reference_exponentials(11, position, np.arange(1000)))
        assert np.array_equal(noise.exponentials(position, ids), reference_exponentials(11, position, ids))


def test_cached_noise_cannot_be_written_through_a_view():
    noise = GumbelNoise(3)
    view = noise.leading(4, 64)
    with pytest.raises(ValueError):
        view[0] = 1.0
    copy = noise.exponentials(4, np.arange(64))
    copy[0] = 1.0  # a gather is the caller's own array
    assert noise.leading(4, 64)[0] != 1.0


def test_whole_vocabulary_and_gathered_draws_agree():
    """gumbel_max over ids 0..V-1 (the view) and over the same ids listed out of order (the gather)
    pick the same token, the argmax of p / E by the definition."""
    generator = np.random.default_rng(0)
    noise = GumbelNoise(9)
    for position in range(40):
        probs = generator.dirichlet(np.full(50, 0.3))
        expected = int(np.argmax(probs / reference_exponentials(9, position, np.arange(50))))
        assert gumbel_max(np.arange(50), probs, noise, position) == expected
        order = np.concatenate([[0], generator.permutation(np.arange(1, 49)), [49]])  # both ends in place
        assert gumbel_max(order, probs[order], noise, position) == expected
        # ids 0..49 with a gap are not the whole range: the gather path, same definition
        ids = np.delete(np.arange(51), 20)
        sub = np.delete(generator.dirichlet(np.full(51, 0.3)), 20)
        assert gumbel_max(ids, sub, noise, position) == int(ids[np.argmax(sub / reference_exponentials(9, position, ids))])


def test_zero_rows_are_refused_and_point_masses_read_no_noise():
    noise = GumbelNoise(1)
    with pytest.raises(ConfigError, match="positive mass"):
        gumbel_max(np.arange(4), np.zeros(4), noise, 0)
    with pytest.raises(ConfigError, match="positive mass"):
        gumbel_max(np.array([3]), np.zeros(1), noise, 0)
    assert gumbel_max(np.array([3]), np.ones(1), noise, 5) == 3
    assert 5 not in noise._exponentials  # noqa: SLF001 - the point mass generated nothing
    assert gumbel_max(np.array([0, 1, 2]), np.array([0.0, 0.0, 1.0]), noise, 2) == 2  # zeros never win

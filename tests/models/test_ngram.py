"""NGramDraft: the sparse implementation equals the plain dense definition of the module docstring."""

from __future__ import annotations

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from verispec.models.ngram import NGramDraft


def dense_reference(context, vocab_size, max_n=3, unigram_weight=0.05):
    """q straight from the definition: n^2-weighted follower distributions plus unigram mass."""
    context = np.asarray(context, dtype=np.int64)
    weights = np.zeros(vocab_size)
    length = len(context)
    for n in range(1, min(max_n, length - 1) + 1):
        windows = sliding_window_view(context[:-1], n)
        matches = np.flatnonzero((windows == context[length - n:]).all(axis=1))
        if len(matches):
            followers = context[matches + n]
            weights += n * n * np.bincount(followers, minlength=vocab_size) / len(followers)
    unigram = np.bincount(context, minlength=vocab_size) / max(length, 1)
    weights = weights + unigram_weight * unigram * max(weights.sum(), 1.0)
    return weights / weights.sum()


@pytest.mark.parametrize("seed", range(5))
def test_probs_match_the_dense_definition(seed):
    rng = np.random.default_rng(seed)
    vocab = 40
    draft = NGramDraft(vocab)
    context = rng.integers(0, 6, size=rng.integers(1, 30)).tolist()  # few distinct tokens: many matches
    draft.reset(context)
    for _ in range(4):
        prefix = rng.integers(0, 6, size=rng.integers(0, 4)).tolist()
        np.testing.assert_allclose(draft.probs(prefix), dense_reference(context + prefix, vocab), rtol=1e-12, atol=1e-15)
        appended = rng.integers(0, 8, size=3).tolist()
        draft.append(appended)
        context += appended
    q = draft.probs()
    assert q.sum() == pytest.approx(1.0) and (q[8:] == 0).all()  # q = 0 outside the context's tokens

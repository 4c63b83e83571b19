"""A stochastic n-gram / prompt-lookup draft that needs no training (the cheapest real draft).

q(.|context) mixes, for n = max_n..1, the empirical distribution of the tokens that followed
every earlier occurrence of the context's last n tokens, weighted n^2 so longer matches dominate,
plus a small share of the context's unigram counts. It is a proper probability vector with
q = 0 outside the tokens seen in the context, so lossless rules stay exact and multi-draft rules
draw genuinely different i.i.d. drafts. It copies from the prompt and from what was generated,
which is what makes prompt lookup pay off on code and extraction prompts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NGramDraft:
    """Draft distribution over ``vocab_size`` tokens computed from the running context only."""

    def __init__(self, vocab_size: int, max_n: int = 3, unigram_weight: float = 0.05):
        self.vocab_size = vocab_size
        self.max_n = max_n
        self.unigram_weight = unigram_weight
        self.context = np.zeros(0, dtype=np.int64)

    def reset(self, prompt_ids: Sequence[int]) -> None:
        self.context = np.asarray(list(prompt_ids), dtype=np.int64)

    def append(self, tokens: Sequence[int]) -> None:
        self.context = np.concatenate([self.context, np.asarray(list(tokens), dtype=np.int64)])

    def probs(self, prefix: Sequence[int] = ()) -> np.ndarray:
        """q(.|context, prefix), shape (V,) float64."""
        context = np.concatenate([self.context, np.asarray(list(prefix), dtype=np.int64)]) if len(prefix) else self.context
        weights = np.zeros(self.vocab_size)
        length = len(context)
        for n in range(1, min(self.max_n, length - 1) + 1):
            windows = sliding_window_view(context[:-1], n)  # windows[j] = context[j:j+n], followed by context[j+n]
            matches = np.flatnonzero((windows == context[length - n :]).all(axis=1))
            if len(matches):
                followers = context[matches + n]
                weights += n * n * np.bincount(followers, minlength=self.vocab_size)[: self.vocab_size] / len(followers)
        unigram = np.bincount(context, minlength=self.vocab_size)[: self.vocab_size] / max(length, 1)
        weights = weights + self.unigram_weight * unigram * max(weights.sum(), 1.0)
        return weights / weights.sum()

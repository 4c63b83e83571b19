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
        self._counts = np.zeros(vocab_size, dtype=np.int64)  # unigram counts of the context, kept current

    def reset(self, prompt_ids: Sequence[int]) -> None:
        self.context = np.asarray(list(prompt_ids), dtype=np.int64)
        self._counts = np.bincount(self.context, minlength=self.vocab_size)[: self.vocab_size]

    def append(self, tokens: Sequence[int]) -> None:
        tokens = np.asarray(list(tokens), dtype=np.int64)
        self.context = np.concatenate([self.context, tokens])
        np.add.at(self._counts, tokens, 1)

    def probs(self, prefix: Sequence[int] = ()) -> np.ndarray:
        """q(.|context, prefix), shape (V,) float64."""
        prefix = np.asarray(list(prefix), dtype=np.int64)
        context = np.concatenate([self.context, prefix]) if len(prefix) else self.context
        # Matches touch few tokens: accumulate them sparsely, then one dense vector (a draft is
        # called once per drafted token, and dense bincounts over a 49k vocabulary dominated it).
        followers_weights: dict[int, float] = {}
        length = len(context)
        for n in range(1, min(self.max_n, length - 1) + 1):
            windows = sliding_window_view(context[:-1], n)  # windows[j] = context[j:j+n], followed by context[j+n]
            matches = np.flatnonzero((windows == context[length - n :]).all(axis=1))
            if len(matches):
                tokens, counts = np.unique(context[matches + n], return_counts=True)
                for token, count in zip(tokens.tolist(), (n * n * counts / len(matches)).tolist()):
                    followers_weights[token] = followers_weights.get(token, 0.0) + count
        match_mass = sum(followers_weights.values())
        unigram = self._counts.astype(np.float64)
        if len(prefix):
            np.add.at(unigram, prefix, 1.0)
        weights = (self.unigram_weight * max(match_mass, 1.0) / max(length, 1)) * unigram
        if followers_weights:
            tokens = np.fromiter(followers_weights.keys(), dtype=np.int64, count=len(followers_weights))
            weights[tokens] += np.fromiter(followers_weights.values(), dtype=np.float64, count=len(followers_weights))
        return weights / weights.sum()

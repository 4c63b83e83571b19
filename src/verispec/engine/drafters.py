"""Drafters: the bridge between a draft model and the samplers of ``verispec.draft``.

Each round a drafter hands the sampler a ``draft_fn`` (q(.|context, prefix) for one prefix, or
``batch_probs`` for a whole tree level in one model call); after verification ``commit`` tells it
which tokens were kept, so a KV-cached draft rolls back the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np

from verispec.core.sampling import SamplingParams, logits_to_probs, process_probs
from verispec.models.ngram import NGramDraft


class DraftFn(Protocol):
    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray: ...

    def batch_probs(self, prefixes: Sequence[tuple[int, ...]]) -> list[np.ndarray]: ...


class Drafter(Protocol):
    vocab_size: int
    calls: int  # draft model forward calls so far

    def reset(self, prompt_ids: Sequence[int]) -> None: ...

    def begin_round(self) -> DraftFn: ...

    def commit(self, accepted: Sequence[int], next_token: int) -> None: ...


class _RoundFn:
    """Per-round cache prefix -> q row, filled by the drafter's batch scorer."""

    def __init__(self, score_batch):
        self.rows: dict[tuple[int, ...], np.ndarray] = {}
        self._score_batch = score_batch

    def batch_probs(self, prefixes):
        missing = [p for p in dict.fromkeys(map(tuple, prefixes)) if p not in self.rows]
        if missing:
            self.rows.update(zip(missing, self._score_batch(missing)))
        return [self.rows[tuple(p)] for p in prefixes]

    def __call__(self, prefix):
        return self.batch_probs([prefix])[0]


class NGramDrafter:
    """The training-free default draft: stochastic n-gram / prompt lookup (models.ngram)."""

    def __init__(self, vocab_size: int, params: SamplingParams, max_n: int = 3):
        self.model = NGramDraft(vocab_size, max_n=max_n)
        self.vocab_size = vocab_size
        self.params = params
        self.calls = 0

    def reset(self, prompt_ids):
        self.model.reset(prompt_ids)

    def begin_round(self) -> DraftFn:
        def score(prefixes):
            self.calls += 1
            return list(process_probs(np.stack([self.model.probs(p) for p in prefixes]), self.params))

        return _RoundFn(score)

    def commit(self, accepted, next_token):
        self.model.append(list(accepted) + [int(next_token)])


class ModelDrafter:
    """A KV-cached neural draft (``models.hf.HFModelAdapter``); each tree level is one forward."""

    def __init__(self, adapter, params: SamplingParams):
        self.adapter = adapter
        self.vocab_size = adapter.vocab_size
        self.params = params
        self.calls = 0
        self._nodes: dict[tuple[int, ...], int] = {}

    def reset(self, prompt_ids):
        self.adapter.reset(prompt_ids)
        self._nodes = {}

    def begin_round(self) -> DraftFn:
        self._nodes = {}
        return _RoundFn(self._score)

    def _score(self, prefixes):
        tokens, parents = [], []
        first = len(self._nodes)
        for prefix in prefixes:
            node = first + len(tokens)
            if prefix:
                parents.append(self._nodes[prefix[:-1]])
                tokens.append(prefix[-1])
            else:
                parents.append(-1)
                tokens.append(-1)
            self._nodes[prefix] = node
        self.calls += 1
        logits = self.adapter.extend(tokens, parents)
        return list(logits_to_probs(logits, self.params))

    def commit(self, accepted, next_token):
        accepted = [int(t) for t in accepted]
        path = []
        for depth in range(1, len(accepted) + 1):
            node = self._nodes.get(tuple(accepted[:depth]))
            if node is None:
                break
            path.append(node)
        if not self._nodes:  # nothing was drafted this round
            self.adapter.append_committed(accepted, next_token)
        elif len(path) == len(accepted):
            self.adapter.commit(path, next_token)
        else:
            # the deepest accepted tokens were never fed to the draft (leaves): they ride along
            # in its next forward
            self.adapter.commit(path, accepted[len(path)])
            self.adapter.append_committed(accepted[len(path) + 1 :], next_token)
        self._nodes = {}

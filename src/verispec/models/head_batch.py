"""One EAGLE-3 head step over several sequences: the batched head forward of ``engine.batch``.

In a batch each sequence's ``HeadDrafter`` keeps its own head KV cache and state; only its head
step (``Eagle3Head.step``: the midlayer over n new entries attending to m cached ones) is queued
here, and ``flush`` runs every queued step as ONE padded call of ``Eagle3Head.step``: the requests'
new entries padded to N = the largest n, their cached keys/values to M = the largest m, and a
(B, N, M + N) mask holding each request's own pattern (its cached columns at [0, m), its new ones at
[M, M + n)). Padded query rows see every column (their outputs are dropped); padded key columns are
seen by no real row. Every real row therefore computes the function of its solo step: exactly in
float64 up to the rounding of a differently shaped product (tests/engine/test_batch_draft_model.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, StepOutput


@dataclass
class _HeadRequest:
    """One sequence's head step: the arguments of ``Eagle3Head.step`` for a batch of one."""

    hidden: torch.Tensor  # (1, n, H)
    embeds: torch.Tensor  # (1, n, H)
    positions: torch.Tensor  # (1, n)
    past_keys: torch.Tensor  # (1, kv_heads, m, head_dim)
    past_values: torch.Tensor
    allowed: torch.Tensor | None  # (1, n, m + n) or None (all past, causal among the new)


class BatchedHeadSteps:
    """A queue of head steps of several sequences over one ``Eagle3Head``, run together by ``flush``."""

    def __init__(self, head: Eagle3Head):
        self.head = head
        self._requests: dict[object, _HeadRequest] = {}  # a sequence's key -> its queued step, in queue order
        self._results: dict[object, StepOutput] = {}

    @property
    def pending(self) -> int:
        return len(self._requests)

    def stepper(self, wait: Callable[[], None]) -> Callable[..., StepOutput]:
        """A replacement for ``head.step`` (batch of one) for one sequence: it queues the step,
        calls ``wait`` (the scheduler flushes meanwhile) and returns the step's own output."""
        owner = object()  # this sequence's key in the queue

        def step(hidden, embeds, positions, past_keys=None, past_values=None, allowed=None) -> StepOutput:
            if owner in self._requests:
                raise ConfigError("a head step is already queued for this sequence; flush before queueing another")
            if past_keys is None:
                config = self.head.config
                past_keys = past_values = hidden.new_zeros(1, config.num_key_value_heads, 0, config.head_dim)
            self._requests[owner] = _HeadRequest(hidden, embeds, positions, past_keys, past_values, allowed)
            wait()
            return self._results.pop(owner)

        return step

    def discard_queued(self) -> None:
        self._requests = {}

    @torch.no_grad()
    def flush(self) -> None:
        """Run every queued step in one padded ``Eagle3Head.step``; results wait for their owners."""
        if not self._requests:
            return
        owners = list(self._requests)
        requests = [self._requests[owner] for owner in owners]
        sizes = [r.hidden.shape[1] for r in requests]
        pasts = [r.past_keys.shape[2] for r in requests]
        width, past = max(sizes), max(pasts)
        first = requests[0]
        batch = len(requests)
        hidden = first.hidden.new_zeros(batch, width, first.hidden.shape[2])
        embeds = first.embeds.new_zeros(batch, width, first.embeds.shape[2])
        positions = first.positions.new_zeros(batch, width)
        keys = first.past_keys.new_zeros(batch, first.past_keys.shape[1], past, first.past_keys.shape[3])
        values = torch.zeros_like(keys)
        allowed = torch.zeros(batch, width, past + width, dtype=torch.bool, device=hidden.device)
        for row, (request, n, m) in enumerate(zip(requests, sizes, pasts)):
            hidden[row, :n], embeds[row, :n], positions[row, :n] = request.hidden[0], request.embeds[0], request.positions[0]
            keys[row, :, :m], values[row, :, :m] = request.past_keys[0], request.past_values[0]
            own = request.allowed[0] if request.allowed is not None else \
                torch.ones(n, m + n, dtype=torch.bool, device=hidden.device).tril(m)
            allowed[row, :n, :m] = own[:, :m]
            allowed[row, :n, past : past + n] = own[:, m:]
            allowed[row, n:] = True  # padded queries: any columns (their outputs are dropped)
        result = self.head.step(hidden, embeds, positions, keys, values, allowed)
        for row, (owner, n) in enumerate(zip(owners, sizes)):
            self._results[owner] = StepOutput(result.out[row : row + 1, :n], result.keys[row : row + 1, :, :n],
                                              result.values[row : row + 1, :, :n])
        self._requests = {}

"""Injectable randomness (ALGORITHMS.md §14.1 item 1).

Every random choice of drafting and verification goes through an ``Rng`` with two methods,
``categorical(probs)`` and ``bernoulli(prob)``. ``SeededRng`` draws real random numbers
(Monte-Carlo); ``enumerate_outcomes`` re-runs the *same* program with a replaying Rng that walks
every branch, which yields the program's exact output law.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import numpy as np

from verispec.errors import InvalidDistributionError

T = TypeVar("T", bound=Hashable)

# Tolerance on the total mass of a probability vector handed to ``categorical``.
SUM_TOLERANCE = 1e-6


class Rng(Protocol):
    """Source of every random choice. ``categorical`` returns an index drawn from ``probs``
    (shape (V,), non-negative, sums to 1); ``bernoulli`` returns True with probability ``prob``
    (clamped into [0, 1]: 'accept iff U < a', ALGORITHMS.md §1 rule 4)."""

    def categorical(self, probs: np.ndarray) -> int: ...

    def bernoulli(self, prob: float) -> bool: ...


def _checked_total(probs: np.ndarray) -> float:
    if probs.size and probs.min() < 0:
        raise InvalidDistributionError(f"categorical() got a negative probability ({probs.min():.3g}); probabilities must be >= 0")
    total = float(probs.sum())
    if not np.isfinite(total) or abs(total - 1.0) > SUM_TOLERANCE:
        raise InvalidDistributionError(
            f"categorical() needs probabilities summing to 1, got sum {total!r}; "
            "normalise the vector (and check it for NaN) before sampling"
        )
    return total


def _clamped(prob: float) -> float:
    prob = float(prob)
    if prob != prob:  # NaN
        raise InvalidDistributionError("bernoulli() got NaN as its probability; check the acceptance ratio's inputs")
    return min(max(prob, 0.0), 1.0)


class SeededRng:
    """Monte-Carlo ``Rng`` backed by ``numpy.random.Generator`` (PCG64), seeded explicitly."""

    def __init__(self, seed: int | np.random.Generator | None = 0):
        self.generator = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)

    def categorical(self, probs: np.ndarray) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        total = _checked_total(probs)
        cdf = np.cumsum(probs)
        # side="right" never lands on a zero-probability entry: its cdf equals its predecessor's.
        index = int(np.searchsorted(cdf, self.generator.random() * total, side="right"))
        if index >= probs.shape[0]:  # u*total rounded up to the last cdf value
            index = int(np.flatnonzero(probs > 0)[-1])
        return index

    def bernoulli(self, prob: float) -> bool:
        return bool(self.generator.random() < _clamped(prob))


@dataclass
class _ReplayRng:
    """Replays a forced prefix of choices, then always takes the first option of each new choice
    point and records the alternatives (prefix + alternative) for later runs."""

    forced: tuple[int, ...]
    choices: list[int] = field(default_factory=list)
    alternatives: list[tuple[int, ...]] = field(default_factory=list)
    prob: float = 1.0

    def _choose(self, options: list[tuple[int, float]]) -> int:
        position = len(self.choices)
        if position < len(self.forced):
            choice = self.forced[position]
            option_prob = dict(options)[choice]
        else:
            choice, option_prob = options[0]
            prefix = tuple(self.choices)
            for alt, _ in options[1:]:
                self.alternatives.append(prefix + (alt,))
        self.choices.append(choice)
        self.prob *= option_prob
        return choice

    def categorical(self, probs: np.ndarray) -> int:
        probs = np.asarray(probs, dtype=np.float64)
        total = _checked_total(probs)
        return self._choose([(int(i), float(probs[i]) / total) for i in np.flatnonzero(probs > 0)])

    def bernoulli(self, prob: float) -> bool:
        prob = _clamped(prob)
        options = [(1, prob), (0, 1.0 - prob)]
        return bool(self._choose([o for o in options if o[1] > 0.0]))


def enumerate_outcomes(
    program: Callable[[Rng], T], max_leaves: int = 5_000_000
) -> dict[T, float]:
    """Exact output law of ``program(rng)``: run it once per leaf of its choice tree.

    Every leaf's probability is the product of its choice probabilities; outputs reached by
    several leaves are summed. Cost: (#leaves) x (program cost). Raises if the tree has more than
    ``max_leaves`` leaves, so a test cannot hang silently.
    """
    law: dict[T, float] = defaultdict(float)
    stack: list[tuple[int, ...]] = [()]
    leaves = 0
    while stack:
        rng = _ReplayRng(stack.pop())
        outcome = program(rng)
        law[outcome] += rng.prob
        stack.extend(rng.alternatives)
        leaves += 1
        if leaves > max_leaves:
            raise RuntimeError(f"enumeration exceeded {max_leaves} leaves; use a smaller setting")
    return dict(law)

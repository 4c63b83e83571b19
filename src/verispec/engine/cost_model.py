"""Online cost model of one decoding round, learned from the rounds' own timings (DESIGN.md §4,
"Decisions from the past only").

Every round scores n tokens in one target forward (n = tree nodes, or L + 1 for a chain, 1 for a
plain round) and spends some time drafting and verifying. ``OnlineCostModel.record`` takes both
timings; the model keeps, per size bucket of n (1, 2, 3-4, 5-8, 9-16, ...), the last ``window``
readings, and estimates

    seconds(n) = unit x shape(n) x exp(r_target[b(n)])  +  unit x overhead_shape(n) x exp(r_over[b(n)])

* ``unit``: the seconds of a one-token forward: the median of the n = 1 readings together with
  ``prior_weight`` pseudo-readings equal to the unit implied by the other buckets' readings
  (reading / shape(n)); with no reading at all, 1.0 (the costs are then relative, which is all a
  choice of size needs).
* ``shape``, ``overhead_shape``: the prior curve (``draft.tree_policy.CostCurve()``,
  relative to one token) and a prior drafting + verification overhead per round and per node.
* ``r[b]``: the log ratio of measured to prior cost in bucket b: the median of the readings' log
  ratios together with ``prior_weight`` pseudo-readings at the *pooled* ratio (the median over the
  readings of every bucket of n >= 2 together with ``prior_weight`` zeros), so one wild reading (a
  10x stall) moves nothing, and a bucket with few readings of its own starts from what the other
  sizes measured on this machine, not from the prior: where the whole curve differs from the
  prior (an fp32 CPU, where 4 tokens cost 1.7x one; the engine's tree forwards with their masks,
  steeper than the plain forwards the prior was measured on), every bucket follows as soon as any
  has readings. Replayed on the rounds of 76 tuning prompts (bf16, Zen 5), the tree sizes chosen
  with pooled pseudo-readings reached 0.4-0.5 points more of the hindsight oracle than with zeros
  (the cost model's share of the gap: 1.2 points with the run's final table known from the start).
  An unobserved bucket takes its ratio from its observed neighbours (linear in the bucket index
  between them, the nearest one's beyond them): the prior's shape, rescaled by what was measured
  nearby, never a slope extrapolated from two noisy points.

No start-up calibration: the first rounds use the prior, and the model follows the machine's load
as readings replace each other. Nothing here reads a round's random draws, so a policy built on it
keeps every rule exact.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from statistics import median

import numpy as np

from verispec.draft.tree_policy import CostCurve
from verispec.errors import ConfigError

# drafting + verification per round, relative to a one-token forward: a fixed part for every round
# (drawing, commit, text decoding), one more for a speculative round, and a part per scored node
PRIOR_ROUND_OVERHEAD = 0.01
PRIOR_SPECULATION_OVERHEAD = 0.01
PRIOR_NODE_OVERHEAD = 0.002
_PRIOR_CURVE = CostCurve(overhead=0.0)
_PRIOR_TABLE = _PRIOR_CURVE.table(4096)  # computed once: the model reads it for every reading
TINY_SECONDS = 1e-9  # a reading of 0 s (a coarse clock) is taken as this, so its log is finite


def size_bucket(n: int) -> int:
    """Bucket of a round scoring n >= 1 tokens: 0 for 1, 1 for 2, 2 for 3-4, 3 for 5-8, ..."""
    return (int(n) - 1).bit_length()


def prior_shape(sizes) -> np.ndarray:
    """Prior cost of one forward over ``sizes`` tokens relative to one token: the shipped
    ``CostCurve`` (``DEFAULT_COST_POINTS``, interpolated) without its overhead."""
    sizes = np.asarray(sizes, dtype=int)
    largest = int(sizes.max(initial=1))
    table = _PRIOR_TABLE if largest <= _PRIOR_TABLE.size else _PRIOR_CURVE.table(largest)
    return table[sizes - 1]


def prior_overhead_shape(sizes) -> np.ndarray:
    """Prior drafting + verification time of a round scoring ``sizes`` tokens, relative to one token."""
    return np.array([_prior_overhead_of(int(n)) for n in np.ravel(sizes)]).reshape(np.shape(sizes))


def _prior_overhead_of(n: int) -> float:
    """Prior drafting + verification time of a round scoring n tokens, relative to one token."""
    return PRIOR_ROUND_OVERHEAD + (PRIOR_SPECULATION_OVERHEAD if n > 1 else 0.0) + PRIOR_NODE_OVERHEAD * (n - 1)


@dataclass
class RoundDecision:
    """What the size policy chose for one round and why (written into ``StepStats.policy``).

    scored_tokens: tokens the target scores (tree nodes; L + 1 for a chain; 1 for a plain round);
    draft_len: the chain's L (None for a token tree); expected_tokens: tokens the policy expected
    the round to emit; predicted_seconds: the cost model's seconds for the round (target forward +
    overhead) when it chose (a resting round, which chooses nothing: the prediction standing since the
    last choice, ``OnlineCostModel.standing_seconds``); measured_target_seconds / measured_round_seconds: what the round then
    took; probe: the round was forced larger than the policy's choice to keep learning; batch: in a
    batched round, the batch budget's decision (predicted_seconds is then the batched round's);
    time_price: a token tree deciding alone: the running rate, in tokens per plain round's time,
    that a node had to beat to be kept (``draft.tree_policy.LongRunRate``; None otherwise)."""

    scored_tokens: int
    expected_tokens: float
    predicted_seconds: float
    probe: bool = False
    draft_len: int | None = None
    measured_target_seconds: float | None = None
    measured_round_seconds: float | None = None
    # in a batch: the budget's decision for the whole batched round (engine.batch_budget.BatchRoundDecision)
    batch: object | None = None
    time_price: float | None = None


class OnlineCostModel:
    """Running robust estimates of a round's seconds by the number n of scored tokens (see the
    module docstring). ``learn=False`` freezes it at the prior (or at what it has learned so far),
    which makes every choice a function of past acceptance alone: the exact-law tests use it."""

    def __init__(self, window: int = 9, prior_weight: int = 3, max_tokens: int = 4096, learn: bool = True,
                 prior_points: tuple[tuple[int, float], ...] | None = None):
        if window < 1 or prior_weight < 0:
            raise ConfigError(f"the cost model needs window >= 1 and prior_weight >= 0, got {window}, {prior_weight}")
        # the shape readings are measured against: the shipped curve, or a backend's own points
        # (n, cost relative to n = 1; a target adapter's ``cost_prior``, e.g. llama.cpp's nearly
        # linear one), so a process's first rounds are not sized for another machine while the
        # buckets fill
        self.prior = _PRIOR_CURVE if prior_points is None else CostCurve(tuple(prior_points), overhead=0.0)
        self._prior_table = _PRIOR_TABLE if prior_points is None else self.prior.table(max(int(max_tokens), 2))
        self.window = int(window)
        self.prior_weight = int(prior_weight)
        self.learn = learn
        self.buckets = size_bucket(max_tokens) + 1
        self.target_readings = [deque(maxlen=self.window) for _ in range(self.buckets)]  # (n, seconds)
        self.overhead_readings = [deque(maxlen=self.window) for _ in range(self.buckets)]
        self._estimates: tuple[float, np.ndarray, np.ndarray] | None = None  # unit, factors; reset by record
        # the table until the next reading, for the largest n_max asked (a smaller one is its
        # start): a round reads it several times (the size choice, the probe schedule, the
        # decision's prediction), every one the same
        self._table: np.ndarray | None = None
        self._stale = True  # a reading came after the last table (kept for ``standing_seconds``)
        self._shape_cache: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # ``_shapes``

    # ----- feeding ----------------------------------------------------------------------------
    def record(self, scored_tokens: int, target_seconds: float, overhead_seconds: float) -> None:
        """One round: its target forward over ``scored_tokens`` tokens took ``target_seconds``; its
        drafting, verification and bookkeeping ``overhead_seconds``."""
        if not self.learn:
            return
        bucket = min(size_bucket(scored_tokens), self.buckets - 1)
        self.target_readings[bucket].append((int(scored_tokens), max(float(target_seconds), TINY_SECONDS)))
        self.overhead_readings[bucket].append((int(scored_tokens), max(float(overhead_seconds), TINY_SECONDS)))
        self._estimates = None
        self._stale = True

    @property
    def readings(self) -> int:
        return sum(len(r) for r in self.target_readings)

    # ----- estimates --------------------------------------------------------------------------
    def unit_seconds(self) -> float:
        """Seconds of a one-token target forward (1.0 before any reading: relative units)."""
        implied = [s / self._prior_of(n) for bucket in self.target_readings[1:] for n, s in bucket]
        plain = [s for _, s in self.target_readings[0]]
        if not plain and not implied:
            return 1.0
        if not plain:
            return median(implied)
        return median(plain + ([median(implied)] * self.prior_weight if implied else []))

    def _prior_of(self, n: int) -> float:
        """The prior cost of a forward over ``n`` tokens relative to one token."""
        return float(self._prior_table[n - 1]) if n <= self._prior_table.size else float(self.prior(n))

    def _prior_shape(self, sizes: np.ndarray) -> np.ndarray:
        largest = int(sizes.max(initial=1))
        return self._prior_table[sizes - 1] if largest <= self._prior_table.size else self.prior.table(largest)[sizes - 1]

    def _log_ratios(self, readings, shape, unit: float) -> list[float | None]:
        """Per bucket: median log(reading / (unit x shape(n))) with prior_weight pseudo-readings at
        the pooled ratio (module docstring); None where unobserved."""
        logs = [[math.log(s / (unit * shape(n))) for n, s in found] for found in readings]
        speculative = [ratio for bucket in logs[1:] for ratio in bucket]
        pooled = median(speculative + [0.0] * self.prior_weight) if speculative else 0.0
        pseudo = [pooled] * self.prior_weight
        return [median(found + pseudo) if found else None for found in logs]

    @staticmethod
    def _fill(ratios: list[float | None]) -> list[float]:
        """Unobserved buckets from their observed neighbours (0 = the prior when none is observed):
        linear between them, constant beyond the outermost ones (``np.interp``'s arithmetic, in
        Python: a dozen buckets, where NumPy's per-call cost dominated a round's bookkeeping)."""
        observed = [bucket for bucket, ratio in enumerate(ratios) if ratio is not None]
        if not observed:
            return [0.0] * len(ratios)
        filled = list(ratios)
        first, last = observed[0], observed[-1]
        for bucket in range(first):
            filled[bucket] = ratios[first]
        for bucket in range(last + 1, len(ratios)):
            filled[bucket] = ratios[last]
        for left, right in zip(observed, observed[1:]):
            slope = (ratios[right] - ratios[left]) / (right - left)
            for bucket in range(left + 1, right):
                filled[bucket] = slope * (bucket - left) + ratios[left]
        return filled

    def _current(self) -> tuple[float, np.ndarray, np.ndarray]:
        """(unit, target cost factors, overhead cost factors) per bucket: the exponentials of the
        log ratios, recomputed after a reading."""
        if self._estimates is None:
            unit = self.unit_seconds()
            target_ratio = self._fill(self._log_ratios(self.target_readings, self._prior_of, unit))
            target_ratio[0] = 0.0  # bucket 0 is the unit itself
            overhead_ratio = self._fill(self._log_ratios(self.overhead_readings, _prior_overhead_of, unit))
            self._estimates = (unit, np.exp(target_ratio), np.exp(overhead_ratio))
        return self._estimates

    def _shapes(self, n_max: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(bucket, prior shape, prior overhead shape) of n = 1..n_max: fixed for a given n_max,
        so computed once, not after every reading."""
        if self._shape_cache is None or self._shape_cache[0].size < n_max:
            sizes = np.arange(1, n_max + 1)
            buckets = np.minimum(np.ceil(np.log2(sizes)).astype(int), self.buckets - 1)  # size_bucket, vectorised
            self._shape_cache = (buckets, self._prior_shape(sizes), prior_overhead_shape(sizes))
        buckets, shape, overhead = self._shape_cache
        return buckets[:n_max], shape[:n_max], overhead[:n_max]

    def table(self, n_max: int) -> np.ndarray:
        """Predicted seconds of a round scoring n = 1..n_max tokens (target forward + overhead),
        shape (n_max,); in units of a one-token forward before any reading. Read-only (shared
        until the next reading)."""
        n_max = int(n_max)
        if self._stale or self._table is None or self._table.size < n_max:
            unit, target_factor, overhead_factor = self._current()
            buckets, shape, overhead = self._shapes(n_max)
            table = unit * (shape * target_factor[buckets] + overhead * overhead_factor[buckets])
            table.setflags(write=False)
            self._table, self._stale = table, False
        return self._table[:n_max]

    def round_seconds(self, scored_tokens: int) -> float:
        """Predicted seconds of a round scoring ``scored_tokens`` tokens."""
        return float(self.table(scored_tokens)[-1])

    def standing_seconds(self, scored_tokens: int) -> float:
        """``round_seconds`` from the last table computed (after the readings since then only if
        there is none, or it is too short): what a round that chooses nothing (a resting token
        tree's plain round) records as its prediction. Recomputing the estimates after every
        reading costs ~40 us, 0.6% of a llama.cpp decoding step: measured to be most of what a
        resting round cost beyond a plain one."""
        if self._table is not None and self._table.size >= scored_tokens:
            return float(self._table[scored_tokens - 1])
        return self.round_seconds(scored_tokens)

"""Dynamic draft length L for chains of sampled drafts (n-gram, draft model, draft head) verified
by a chain rule (sd, bv, ...): each round, the L in [0, L_max] that maximises expected tokens per
second from past acceptance and a cost table (DESIGN.md §4, "Decisions from the past only").

Per-position acceptance a_i = P(tau >= i | tau >= i - 1) is estimated from past rounds (hits and
trials with a slow decay, so the estimate follows the text); a position never tried yet inherits
the rate of the one before it (the first from ``first_prior``), worth ``prior_weight`` trials. A
chain of L tokens then emits 1 + sum_{j<=L} prod_{i<=j} a_i tokens in expectation, and costs a
round scoring L + 1 tokens (``cost.table``: the target forward and the overhead, whose drafting
part grows with L). L = 0 is a plain round. The choice reads only past rounds, never this
round's draws, so every chain rule stays exact whatever L it picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from verispec.draft.tree_policy import CostTable, ProbeSchedule
from verispec.errors import ConfigError


@dataclass(frozen=True)
class ChainChoice:
    """This round's draft length, the tokens it is expected to emit, and whether it is a probe."""

    draft_len: int
    expected_tokens: float
    probe: bool = False


@dataclass
class PositionAcceptance:
    """Running per-position acceptance of a chain: hits[i] / trials[i] for position i + 1."""

    first_prior: float = 0.6
    prior_weight: float = 2.0
    decay: float = 0.98
    hits: list[float] = field(default_factory=list)
    trials: list[float] = field(default_factory=list)

    def rates(self, length: int) -> np.ndarray:
        """a_1..a_length, shape (length,)."""
        rates, prior = [], self.first_prior
        for i in range(length):
            hits, trials = (self.hits[i], self.trials[i]) if i < len(self.trials) else (0.0, 0.0)
            if trials + self.prior_weight > 0:  # else never tried and no prior weight: keep the previous rate
                prior = (hits + self.prior_weight * prior) / (trials + self.prior_weight)
            rates.append(prior)
        return np.array(rates)

    def record(self, draft_len: int, accepted_len: int) -> None:
        """A round that drafted ``draft_len`` tokens and kept ``accepted_len``: positions 1..tau + 1
        (up to L) were tried, 1..tau hit."""
        self.hits = [h * self.decay for h in self.hits]
        self.trials = [t * self.decay for t in self.trials]
        while len(self.trials) < draft_len:
            self.hits.append(0.0)
            self.trials.append(0.0)
        for i in range(min(accepted_len + 1, draft_len)):
            self.trials[i] += 1.0
            self.hits[i] += float(i < accepted_len)


@dataclass
class ChainLengthPolicy:
    """Chooses L per round (``choose``) and learns from the outcome (``record``)."""

    max_len: int
    acceptance: PositionAcceptance = field(default_factory=PositionAcceptance)
    probes: ProbeSchedule = field(default_factory=lambda: ProbeSchedule(size=2))

    def __post_init__(self):
        if self.max_len < 1:
            raise ConfigError(f"the longest adaptive draft must be >= 1 token, got {self.max_len}")

    def gains(self, limit: int | None = None) -> np.ndarray:
        """Expected extra tokens of each drafted position 1..min(max_len, limit): the estimated
        probability that the chain is accepted up to it (prod a_i), non-increasing; a batch budget
        (``engine.batch_budget``) reads them as the chain's offer."""
        longest = self.max_len if limit is None else max(0, min(self.max_len, int(limit)))
        return np.cumprod(self.acceptance.rates(longest)) if longest else np.zeros(0)

    def choose(self, cost: CostTable, limit: int | None = None) -> ChainChoice:
        """The best L in [0, min(max_len, limit)] by expected tokens per unit of ``cost``, or a
        probe of ``probes.size`` tokens after a run of plain rounds."""
        gains = self.gains(limit)
        if gains.size == 0:
            return ChainChoice(0, 1.0)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(gains)])
        return self.settle(int(np.argmax(expected / cost.table(gains.size + 1))), gains, cost)

    def settle(self, draft_len: int, gains: np.ndarray, cost: CostTable | None = None) -> ChainChoice:
        """The choice for a length decided from ``gains`` (here or by a batch budget), turned into
        a probe after a run of plain rounds (as long as ``cost`` makes probes cheap enough)."""
        if gains.size == 0:
            return ChainChoice(0, 1.0)
        expected = 1.0 + np.concatenate([[0.0], np.cumsum(gains)])
        best = max(0, min(int(draft_len), gains.size))
        if self.probes.due(best > 0, cost):
            best = min(self.probes.size, gains.size)
            return ChainChoice(best, float(expected[best]), probe=True)
        return ChainChoice(best, float(expected[best]))

    def record(self, draft_len: int, accepted_len: int) -> None:
        if draft_len > 0:
            self.acceptance.record(draft_len, accepted_len)

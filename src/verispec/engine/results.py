"""What a decode returns: ``GenerationOutput`` (the tokens, the text and the summary metrics of
DESIGN.md §5) and one ``StepStats`` per round (what the round drafted, kept and cost, and the size
policy's decision)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from verispec.engine.cost_model import RoundDecision


@dataclass
class StepStats:
    """One round. accepted_len = tau (draft tokens kept); new_tokens = tau + 1 before truncation
    at EOS / max_new_tokens; times in seconds."""

    accepted_len: int
    new_tokens: int
    drafted_tokens: int
    tree_nodes: int
    draft_seconds: float
    target_seconds: float
    verify_seconds: float
    other_seconds: float
    target_calls: int = 1
    draft_calls: int = 0
    policy: RoundDecision | None = None  # the size policy's choice (token trees, adaptive L)


@dataclass
class GenerationOutput:
    """Result of ``generate``. Block efficiency = new tokens / target calls during decoding
    (prefill excluded, DESIGN.md §5)."""

    method: str
    num_drafts: int
    draft_len: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    steps: list[StepStats]
    seconds: float
    prefill_seconds: float
    stop_reason: str
    sampling: dict = field(default_factory=dict)

    @property
    def new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def target_calls(self) -> int:
        return sum(step.target_calls for step in self.steps)

    @property
    def draft_calls(self) -> int:
        return sum(step.draft_calls for step in self.steps)

    @property
    def block_efficiency(self) -> float:
        return self.new_tokens / self.target_calls if self.target_calls else 0.0

    @property
    def mean_accepted_len(self) -> float:
        return float(np.mean([s.accepted_len for s in self.steps])) if self.steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """mean tau / L (DESIGN.md §5)."""
        return self.mean_accepted_len / self.draft_len if self.draft_len else 0.0

    def position_acceptance(self) -> list[float]:
        """a_i = P(tau >= i | tau >= i-1), i = 1..L, estimated over the rounds that drafted
        position i (a plain round of an adaptive policy drafts none)."""
        taus = np.array([s.accepted_len for s in self.steps])
        drafted = np.array([s.drafted_tokens for s in self.steps])
        rates = []
        for i in range(1, self.draft_len + 1):
            reached = int(((taus >= i - 1) & (drafted >= i)).sum())
            rates.append(float((taus >= i).sum() / reached) if reached else 0.0)
        return rates

    @property
    def root_only_rounds(self) -> int:
        """Rounds of a speculative method that scored one token (plain rounds chosen by the policy)."""
        return sum(1 for s in self.steps if s.policy is not None and s.policy.scored_tokens == 1)

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0

    def time_breakdown(self) -> dict[str, float]:
        return {
            part: float(sum(getattr(s, f"{part}_seconds") for s in self.steps))
            for part in ("draft", "target", "verify", "other")
        }

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "K": self.num_drafts,
            "L": self.draft_len,
            "new_tokens": self.new_tokens,
            "token_ids": self.token_ids,
            "text": self.text,
            "target_calls": self.target_calls,
            "draft_calls": self.draft_calls,
            "block_efficiency": self.block_efficiency,
            "mean_accepted_len": self.mean_accepted_len,
            "acceptance_rate": self.acceptance_rate,
            "position_acceptance": self.position_acceptance(),
            "tokens_per_second": self.tokens_per_second,
            "seconds": self.seconds,
            "prefill_seconds": self.prefill_seconds,
            "time_breakdown": self.time_breakdown(),
            "stop_reason": self.stop_reason,
            "root_only_rounds": self.root_only_rounds,
            "sampling": self.sampling,
            "steps": [asdict(step) for step in self.steps],
        }

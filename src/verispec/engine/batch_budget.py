"""Who gets the tokens of a batched forward: the per-round budget of ``engine.batch`` (DESIGN.md §4).

A batched round has ONE target forward over every sequence's tree, so its cost is a function of
the total number of tokens scored, T, summed over the sequences: ``seconds(T)``, predicted by one
``OnlineCostModel`` for the batched forward (the batch's own: total scored tokens -> seconds of the
flush, plus the round's drafting and verification of all sequences as overhead). The default
policy, ``split_scored_tokens``, shares T out by expected tokens against that cost:

* every running sequence offers its candidate draft tokens in best-first order with their
  estimated reach probabilities (a token tree's node scores: the estimated probability that the
  walk reaches the node; each node's expected contribution to the tokens the round emits);
* all offers are merged best first (ties: lower sequence first, then the sequence's own order, so
  every sequence keeps a prefix of its order: a tree), and the round keeps the global prefix
  maximising the expected tokens gained over plain batched decoding in the same time, (sum over
  sequences of expected tokens) - seconds(T) x B / seconds(T0), T = B + nodes kept (each
  sequence's root is always scored) + the tokens other sequences already queued (a prefill), T0
  the same without nodes (the long-run rate, as ``draft.tree_policy.best_prefix``);
* each sequence drafts its share of that prefix.

With one sequence this is exactly the single-sequence choice of ``draft.tree_policy.grow_tree``
(``best_prefix``: the gain over plain decoding, first maximum). With many, a forward over B roots already
costs more, each extra node adds the same seconds but only one sequence's gain, so the trees
shrink and speculation turns off by itself once no candidate is worth its cost; the sequences
with the most promising candidates (a long copy match) get the tokens. The offers and the cost
model read only past rounds (the drafter's state after the last commit, past timings), never the
coming round's draws, so every rule stays exact whatever the split.

The older interface stays for explicit caps: a ``BudgetPolicy`` maps ``SequenceView``s to at most
how many tree nodes each sequence may draft (``EvenSplit``, ``drafter_choice``); with such a
policy each sequence sizes its tree itself under the cap.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from verispec.draft.tree_policy import CostTable
from verispec.errors import ConfigError


@dataclass(frozen=True)
class SequenceView:
    """What a budget policy sees of one running sequence before a round."""

    index: int  # position of its prompt in the batch's prompt list
    context_len: int  # prompt + generated tokens so far
    new_tokens: int


BudgetPolicy = Callable[[Sequence[SequenceView]], Sequence["int | None"]]


def drafter_choice(sequences: Sequence[SequenceView]) -> list[None]:
    """Every sequence's drafter sizes its tree itself (with its own cost model, as decoded alone)."""
    return [None] * len(sequences)


@dataclass(frozen=True)
class EvenSplit:
    """A fixed number of scored tokens per forward, split evenly: with B sequences each tree has
    at most ``total // B`` nodes, root included (so ``total // B - 1`` drafted nodes; none once B
    reaches ``total``, i.e. plain batched decoding)."""

    total: int

    def __post_init__(self):
        if isinstance(self.total, bool) or int(self.total) != self.total or self.total < 1:
            raise ConfigError(f"an even split needs a total of >= 1 scored tokens per forward, got {self.total!r}")

    def __call__(self, sequences: Sequence[SequenceView]) -> list[int]:
        return [max(0, self.total // len(sequences) - 1)] * len(sequences)


@dataclass
class BatchRoundDecision:
    """The budget's choice for one batched round (shared by the round's sequences'
    ``StepStats.policy.batch``).

    batch_size: sequences that offered drafts this round; fixed_tokens: tokens other sequences had
    already queued for the same forward (a joining sequence's prompt); nodes: each offering
    sequence's tree nodes, root included, in batch order; scored_tokens: the forward's planned total
    (fixed_tokens + sum(nodes)); expected_tokens: tokens the offering sequences are expected to emit
    together; predicted_seconds: the batch cost model's seconds for the round when it chose;
    measured_target_seconds / measured_round_seconds: the batched forward's and the whole round's
    wall time (all sequences' turns included)."""

    batch_size: int
    fixed_tokens: int
    nodes: tuple[int, ...]
    scored_tokens: int
    expected_tokens: float
    predicted_seconds: float
    measured_target_seconds: float | None = None
    measured_round_seconds: float | None = None

    def to_dict(self) -> dict:
        return {
            "batch_size": self.batch_size, "fixed_tokens": self.fixed_tokens, "nodes": list(self.nodes),
            "scored_tokens": self.scored_tokens, "expected_tokens": self.expected_tokens,
            "predicted_seconds": self.predicted_seconds, "measured_target_seconds": self.measured_target_seconds,
            "measured_round_seconds": self.measured_round_seconds,
        }


def split_scored_tokens(offers: Sequence[Sequence[float]], cost: CostTable, fixed_tokens: int = 0) -> BatchRoundDecision:
    """The global best-first prefix of ``offers`` (per sequence: its candidate nodes' estimated
    reach probabilities, best first, root excluded) maximising the expected tokens gained over plain
    batched decoding in the same time (see the module docstring). ``cost.table(n)``: seconds of a batched round scoring
    1..n tokens in total."""
    batch = len(offers)
    if batch == 0:
        raise ConfigError("a batched round needs at least one sequence to split its tokens between")
    fixed_tokens = int(fixed_tokens)
    # (-score, sequence, position): one sort gives the global best-first order, each sequence's own
    # order kept among equal scores, so every sequence's kept nodes are a prefix of its offer (a tree)
    entries = sorted((-float(score), owner, position)
                     for owner, scores in enumerate(offers) for position, score in enumerate(scores))
    gains = np.array([-entry[0] for entry in entries], dtype=float)
    expected = batch + np.concatenate([[0.0], np.cumsum(gains)])
    base = fixed_tokens + batch  # the roots (and queued tokens) are scored whatever the split
    seconds = np.asarray(cost.table(base + len(entries)), dtype=float)[base - 1:]
    # expected tokens gained over plain batched decoding in the same time (batch tokens per
    # seconds[0]): draft.tree_policy.best_prefix's rule, of which one sequence is the special case
    keep = int(np.argmax(expected - seconds * (batch / seconds[0])))
    nodes = [1] * batch
    for _, owner, _ in entries[:keep]:
        nodes[owner] += 1
    return BatchRoundDecision(batch, fixed_tokens, tuple(nodes), base + keep, float(expected[keep]), float(seconds[keep]))

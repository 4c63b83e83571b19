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
  the same without nodes (time priced at plain batched decoding's rate; a sequence deciding alone
  prices it at its own running rate, ``draft.tree_policy.LongRunRate``, but a batch's speculation
  earns little over plain batching, 1.08x at 4 sequences (docs/numbers.md), so that rate is ~1 here);
* each sequence drafts its share of that prefix.

A token tree's offer is read lazily (``draft.tree_policy.BestFirstOrder``): the merge takes
entries best first and stops once no longer prefix can gain more (every later entry scores at
most the next one), so each tree is grown about as far as the split keeps, not to its 24 nodes.

With one sequence this is exactly the single-sequence choice of ``draft.tree_policy.grow_tree``
at rate 1 (``best_prefix``: the gain over plain decoding, first maximum). With many, a forward over B roots already
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

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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


class LazyOffer(Protocol):
    """An offer read on demand (``draft.tree_policy.BestFirstOrder``): ``score(i)`` is its i-th
    candidate's score (None past its end), non-increasing in i; ``capacity`` bounds its length."""

    capacity: int

    def score(self, position: int) -> float | None: ...


class _ListOffer:
    """A whole offer given as a list (a chain's gains, a test's scores) read as a ``LazyOffer``:
    sorted best first (stable), the order in which a global sort of all entries takes them."""

    def __init__(self, scores: Sequence[float]):
        self.scores = sorted((float(score) for score in scores), key=lambda score: -score)

    @property
    def capacity(self) -> int:
        return len(self.scores)

    def score(self, position: int) -> float | None:
        return self.scores[position] if position < len(self.scores) else None


def split_scored_tokens(offers: Sequence[Sequence[float] | LazyOffer], cost: CostTable, fixed_tokens: int = 0) -> BatchRoundDecision:
    """The global best-first prefix of ``offers`` (per sequence: its candidate nodes' estimated
    reach probabilities, best first, root excluded: a list, or a ``LazyOffer`` read only as far as
    needed) maximising the expected tokens gained over plain batched decoding in the same time (see
    the module docstring). ``cost.table(n)``: seconds of a batched round scoring 1..n tokens in total.

    The offers are merged best first (ties: lower sequence first, then each one's own order), and
    the merge stops once no longer prefix can gain more than the best so far: every later entry
    scores at most the next one, s, so m more entries gain at most m x s and cost what the table
    says; a lazy offer is read (a token tree grown) only up to one entry past what the merge took.
    The choice is the one the whole merged order gives (same sums in the same order, first maximum)."""
    batch = len(offers)
    if batch == 0:
        raise ConfigError("a batched round needs at least one sequence to split its tokens between")
    offers = [offer if hasattr(offer, "score") else _ListOffer(offer) for offer in offers]
    fixed_tokens = int(fixed_tokens)
    base = fixed_tokens + batch  # the roots (and queued tokens) are scored whatever the split
    seconds = np.asarray(cost.table(base + sum(offer.capacity for offer in offers)), dtype=float)[base - 1:]
    # the cost of each prefix in expected tokens: plain batched decoding's batch tokens per seconds[0]
    priced = seconds * (batch / seconds[0])
    prices = priced.tolist()
    heap = [(-score, owner, 0) for owner, offer in enumerate(offers) if (score := offer.score(0)) is not None]
    heapq.heapify(heap)
    owners: list[int] = []  # the merged order's owners, as far as taken
    gained = 0.0  # the cumulative sum of the taken scores (np.cumsum's order)
    keep, best, best_expected = 0, batch - prices[0], float(batch)
    while heap:
        taken = len(owners)
        next_score = -heap[0][0]
        # one more entry cannot beat the best: check whether any number of them can (slack: rounding)
        if next_score < prices[taken + 1] - prices[taken] + best - (batch + gained - prices[taken]) and _settled(
                priced, taken, next_score, best - (batch + gained - prices[taken]) - 1e-9):
            break
        negative, owner, position = heapq.heappop(heap)
        owners.append(owner)
        gained += -negative
        value = (batch + gained) - prices[taken + 1]
        if value > best:
            keep, best, best_expected = taken + 1, value, batch + gained
        score = offers[owner].score(position + 1)
        if score is not None:
            heapq.heappush(heap, (-score, owner, position + 1))
    nodes = [1] * batch
    for owner in owners[:keep]:
        nodes[owner] += 1
    return BatchRoundDecision(batch, fixed_tokens, tuple(nodes), base + keep, float(best_expected), float(seconds[keep]))


def _settled(priced: np.ndarray, taken: int, next_score: float, margin: float) -> bool:
    """Whether no m >= 1 further entries, each scoring at most ``next_score``, can gain more than
    ``margin`` over the prefix of ``taken`` entries: m x next_score - (priced[taken + m] - priced[taken]) < margin."""
    extra = priced[taken + 1:] - priced[taken]
    return bool(np.all(np.arange(1, extra.size + 1) * next_score - extra < margin))

"""Adaptive size of deterministic token trees: which candidates, and how many.

Each round the draft offers candidate children for every node (copy continuations, adjacency
top-k). A candidate edge gets an estimated acceptance probability from running hit rates per
candidate *class* (source x bucket x rank: copy by match length, adjacency by the target probability
recorded in the table, each by its rank among its siblings), and a node's score is the product of the estimates on its root path: the
estimated probability that the q-free walk reaches it. The expected number of tokens a round emits
is then 1 + the sum of the scores of the tree's nodes.

Nodes are added best first (a child never scores above its parent, so every prefix of that order
is a tree), and the round keeps the prefix that maximises the expected tokens gained over what the
decoder's long-run rate (``LongRunRate``) earns in the same time (``best_prefix``), where a cost
table gives the cost of a round scoring n tokens: the engine's online model
(``engine.cost_model.OnlineCostModel``, seconds learned from past rounds, per-node overhead
included) or a fixed ``CostCurve`` (relative to one token). When no candidate is worth its cost
the tree is the root alone: plain decoding. ``ProbeSchedule`` then forces a small tree now and
then, so the estimates keep learning.
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol
from dataclasses import dataclass, field

import numpy as np

from verispec.errors import ConfigError

# Scoring n tree nodes after 300 cached tokens with the default target (SmolLM2-135M, bf16, native
# runner, one-token rows by float32 products), relative to one token: AMD EPYC Zen 5 (avx512_bf16,
# no AMX), 1 thread, 2026-11-29 (benchmarks/single_query_attention.py --curve). Packed fp32 on the
# same CPU costs nearly the same (5 / 9 / 16 / 32 tokens: 1.19 / 1.40 / 1.75 / 2.67).
DEFAULT_COST_POINTS = ((1, 1.0), (2, 1.07), (5, 1.20), (9, 1.41), (16, 1.77), (24, 2.16), (32, 2.65))


class CostTable(Protocol):
    def table(self, n_max: int) -> np.ndarray:
        """Cost of a round scoring n = 1..n_max tokens, shape (n_max,), in any one unit."""
        ...


@dataclass(frozen=True)
class CostCurve:
    """Cost of one forward over n tokens relative to n = 1, linear between measured points and
    extrapolated with the last slope. ``overhead``: per-round cost of drafting and verifying, in
    the same unit, added to every speculative round (not to a root-only round)."""

    points: tuple[tuple[int, float], ...] = DEFAULT_COST_POINTS
    overhead: float = 0.02

    def __post_init__(self):
        sizes = [n for n, _ in self.points]
        if len(self.points) < 2 or sizes != sorted(sizes) or sizes[0] != 1:
            raise ConfigError(f"a cost curve needs >= 2 points (n, cost) with increasing n starting at 1, got {self.points}")

    def __call__(self, n: int) -> float:
        return float(self.table(n)[n - 1])

    def table(self, n_max: int) -> np.ndarray:
        """Costs of n = 1..n_max tokens, shape (n_max,)."""
        sizes = np.array([p[0] for p in self.points], dtype=float)
        costs = np.array([p[1] for p in self.points], dtype=float)
        n = np.arange(1, n_max + 1, dtype=float)
        slope = (costs[-1] - costs[-2]) / (sizes[-1] - sizes[-2])
        base = np.where(n <= sizes[-1], np.interp(n, sizes, costs), costs[-1] + slope * (n - sizes[-1]))
        return base + np.where(n > 1, self.overhead, 0.0)


def copy_bucket(match_len: int) -> int:
    """Class index of a copy edge by the length of the suffix match behind it."""
    for index, bound in enumerate((1, 2, 3, 5, 8, 15)):
        if match_len <= bound:
            return index
    return 6


ADJ_BOUNDS = (0.05, 0.15, 0.3, 0.5, 0.7, 0.85, 0.95, 1.01)
SIBLING_RANKS = 3  # a candidate's rank among its siblings: 0 (the best), 1, or 2 (the third or later)
# Prior hit rates of the classes (source, bucket, rank): copy by match length, adjacency by the
# probability recorded in the table, each by its rank among its siblings. Fitted on tuning prompts
# (greedy and T = 0.6: ``benchmarks/acceptance_priors.py``, which prints this table): the rate at
# which the q-free walk moved into a candidate of the class when it reached the candidate's parent.
# The rank matters as much as the bucket: siblings exclude each other (the walk moves into at most
# one), so an adjacency candidate recorded at 0.95 or more is right ~51% of the time as the best
# sibling and ~12% in second place (usually below a copy continuation); a recorded probability
# comes from another context, so it is optimistic, while a copy of a match longer than 15 tokens
# continues ~94% of the time. The table is as fitted (2026-11-28, AMD EPYC Zen 5, bf16).
ACCEPT_PRIOR: dict[tuple[str, int, int], float] = {
    ('copy', 0, 0): 0.15, ('copy', 0, 1): 0.15, ('copy', 0, 2): 0.15,  # trials 0 / 0 / 0
    ('copy', 1, 0): 0.28, ('copy', 1, 1): 0.11, ('copy', 1, 2): 0.11,  # trials 462 / 243 / 96
    ('copy', 2, 0): 0.606, ('copy', 2, 1): 0.214, ('copy', 2, 2): 0.206,  # trials 503 / 40 / 5
    ('copy', 3, 0): 0.694, ('copy', 3, 1): 0.376, ('copy', 3, 2): 0.219,  # trials 813 / 38 / 12
    ('copy', 4, 0): 0.819, ('copy', 4, 1): 0.56, ('copy', 4, 2): 0.448,  # trials 753 / 9 / 1
    ('copy', 5, 0): 0.837, ('copy', 5, 1): 0.621, ('copy', 5, 2): 0.621,  # trials 887 / 3 / 0
    ('copy', 6, 0): 0.936, ('copy', 6, 1): 0.936, ('copy', 6, 2): 0.936,  # trials 840 / 0 / 0
    ('adj', 0, 0): 0.01, ('adj', 0, 1): 0.01, ('adj', 0, 2): 0.01,  # trials 6 / 1297 / 18552
    ('adj', 1, 0): 0.079, ('adj', 1, 1): 0.079, ('adj', 1, 2): 0.064,  # trials 348 / 1719 / 3614
    ('adj', 2, 0): 0.163, ('adj', 2, 1): 0.147, ('adj', 2, 2): 0.147,  # trials 732 / 1248 / 590
    ('adj', 3, 0): 0.236, ('adj', 3, 1): 0.212, ('adj', 3, 2): 0.196,  # trials 813 / 566 / 128
    ('adj', 4, 0): 0.298, ('adj', 4, 1): 0.249, ('adj', 4, 2): 0.119,  # trials 707 / 234 / 38
    ('adj', 5, 0): 0.341, ('adj', 5, 1): 0.14, ('adj', 5, 2): 0.08,  # trials 568 / 113 / 3
    ('adj', 6, 0): 0.45, ('adj', 6, 1): 0.158, ('adj', 6, 2): 0.126,  # trials 559 / 77 / 1
    ('adj', 7, 0): 0.512, ('adj', 7, 1): 0.118, ('adj', 7, 2): 0.094,  # trials 1092 / 192 / 1
}


def adjacency_bucket(prob: float) -> int:
    # bisect, not np.searchsorted: called for every candidate of every node (~140 per round), where
    # numpy's per-call overhead on one scalar was ~1.4 ms of a round's Python time; same buckets
    return bisect_right(ADJ_BOUNDS, prob) if prob < ADJ_BOUNDS[-1] else len(ADJ_BOUNDS) - 1


@dataclass
class AcceptanceEstimates:
    """Running hit rates of candidate classes ("copy", bucket, rank) and ("adj", bucket, rank): hits and
    trials since the start, with a prior worth ``prior_weight`` trials. A trial is a candidate
    child of a node the walk visited; a hit is the walk moving into it.

    ``prior_scale`` scales the prior rates (``ACCEPT_PRIOR``): 1 for a target whose extra
    tokens per forward are cheap (torch's curve: 5 tokens 1.2x one, where an optimistic start costs little),
    less for one whose forwards cost nearly linearly in their tokens (llama.cpp: the adapter's
    ``acceptance_prior_scale``), where optimism makes a fresh decoder's first trees cost several
    plain steps without paying; 0 means a class needs observed hits before it is drafted."""

    prior_weight: float = 4.0
    decay: float = 0.995  # older rounds count less, so the estimates follow the text
    prior_scale: float = 1.0
    hits: dict[tuple[str, int], float] = field(default_factory=dict)
    trials: dict[tuple[str, int], float] = field(default_factory=dict)

    @staticmethod
    def prior(cls: tuple) -> float:
        """The prior rate of ``cls`` = (source, bucket, rank); (source, bucket) means rank 0."""
        source, bucket, *rank = cls
        return ACCEPT_PRIOR[(source, bucket, rank[0] if rank else 0)]

    def __post_init__(self):
        if not 0.0 <= self.prior_scale <= 1.0 or self.prior_weight < 0:
            raise ConfigError(f"acceptance estimates need prior_scale in [0, 1] and prior_weight >= 0, got "
                              f"{self.prior_scale}, {self.prior_weight}")

    def rate(self, cls: tuple[str, int]) -> float:
        trials = self.trials.get(cls, 0.0)
        prior = self.prior_weight * self.prior_scale * self.prior(cls)
        return (self.hits.get(cls, 0.0) + prior) / (trials + self.prior_weight) if trials + self.prior_weight > 0 else 0.0

    def record(self, outcomes: Iterable[tuple[tuple[str, int], bool]]) -> None:
        for cls in self.trials:
            self.trials[cls] *= self.decay
            self.hits[cls] *= self.decay
        for cls, hit in outcomes:
            self.trials[cls] = self.trials.get(cls, 0.0) + 1.0
            self.hits[cls] = self.hits.get(cls, 0.0) + float(hit)


@dataclass(frozen=True)
class Candidate:
    """A proposed child: its token, estimated acceptance given its parent is reached, the class
    it is scored by, and source-specific state to grow its own children (a copy position)."""

    token: int
    accept: float
    cls: tuple[str, int]
    copy_start: int | None = None  # copy: context index of this token; its child copies index + 1
    copy_match: int = 0


@dataclass(frozen=True)
class CandidateTree:
    """One round's deterministic tree. tokens[0] is the root's token (the last committed token),
    parents[0] = -1, nodes in best-first order (parents first); classes[i] is the class node i was
    scored by; scores[i] the estimated probability that the walk reaches node i."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    classes: tuple[tuple[str, int] | None, ...]
    scores: tuple[float, ...]
    expected_tokens: float
    offered: CandidateTree | None = None  # the whole best-first order before the cut (probes, oracles)
    probe: bool = False  # larger than the policy's choice, to keep the estimates learning
    plan: object | None = None  # a batch's budget decision this tree was cut by (engine.batch_budget)

    def prefix(self, nodes: int) -> CandidateTree:
        """The first ``nodes`` nodes of the best-first order (a tree: parents come first)."""
        nodes = max(1, min(int(nodes), self.num_nodes))
        return CandidateTree(
            self.tokens[:nodes], self.parents[:nodes], self.classes[:nodes], self.scores[:nodes],
            1.0 + float(sum(self.scores[1:nodes])), self,
        )

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    def children_of(self) -> list[dict[int, int]]:
        """Per node: {child token: child node}."""
        kids: list[dict[int, int]] = [{} for _ in self.tokens]
        for node in range(1, len(self.tokens)):
            kids[self.parents[node]].setdefault(self.tokens[node], node)
        return kids


class BestFirstOrder:
    """A candidate tree's best-first order, grown on demand: ``grow(n)`` extends it to n nodes
    (root included; fewer when the candidates run out, at most ``max_nodes`` + 1), and
    ``score(i)`` is the score of the i-th node after the root (None past the end), growing as far
    as that. ``expand(candidate, depth)`` lists the children of a node added for ``candidate`` at
    ``depth``; a node's children are listed only when the node after it is asked for.

    The scores come out non-increasing (a child's score is its parent's times an acceptance <= 1),
    so a batch's budget (``engine.batch_budget``) can merge several sequences' orders best first
    and stop growing them once no further node can pay: growing a whole 24-node tree per sequence
    for a split that keeps ~3 of them cost ~2.4 ms of a ~43 ms B = 4 round."""

    def __init__(self, root_token: int, root_candidates: Sequence[Candidate], expand: Callable[[Candidate, int], Sequence[Candidate]],
                 max_nodes: int, max_depth: int):
        self.tokens, self.parents, self.classes, self.scores = [root_token], [-1], [None], [1.0]
        self.depths = [0]
        self.capacity = max(0, int(max_nodes))  # most nodes after the root
        self.max_depth = max_depth
        self._expand = expand
        self._heap: list[tuple[float, int, int, Candidate]] = []
        self._counter = 0
        self._unexpanded: tuple[int, Candidate] | None = None  # the last node added, children not listed yet
        self._push(0, root_candidates)

    def _push(self, parent: int, candidates: Sequence[Candidate]) -> None:
        seen = set()
        for candidate in candidates:
            if candidate.token in seen or candidate.accept <= 0.0:
                continue
            seen.add(candidate.token)
            heapq.heappush(self._heap, (-self.scores[parent] * candidate.accept, self._counter, parent, candidate))
            self._counter += 1

    def grow(self, nodes: int) -> int:
        """Grow the order to ``nodes`` nodes (root included) if it has that many; returns its size."""
        while len(self.tokens) < nodes and len(self.tokens) <= self.capacity:
            if self._unexpanded is not None:
                node, candidate = self._unexpanded
                self._unexpanded = None
                self._push(node, self._expand(candidate, self.depths[node]))
            if not self._heap:
                break
            negative_score, _, parent, candidate = heapq.heappop(self._heap)
            self.tokens.append(candidate.token)
            self.parents.append(parent)
            self.classes.append(candidate.cls)
            self.scores.append(-negative_score)
            self.depths.append(self.depths[parent] + 1)
            if self.depths[-1] < self.max_depth:
                self._unexpanded = (len(self.tokens) - 1, candidate)
        return len(self.tokens)

    def score(self, position: int) -> float | None:
        """The score of node ``position`` + 1 (the position-th after the root), None if there is none."""
        return self.scores[position + 1] if self.grow(position + 2) > position + 1 else None

    def tree(self, expected_tokens: float | None = None) -> CandidateTree:
        """The nodes grown so far as a tree (``expected_tokens``: 1 + the sum of their scores when None)."""
        if expected_tokens is None:
            expected_tokens = 1.0 + float(sum(self.scores[1:]))
        return CandidateTree(tuple(self.tokens), tuple(self.parents), tuple(self.classes), tuple(self.scores), expected_tokens)


def grow_tree(
    root_token: int,
    root_candidates: Sequence[Candidate],
    expand: Callable[[Candidate, int], Sequence[Candidate]],
    cost: CostTable,
    max_nodes: int,
    max_depth: int,
    rate: float = 1.0,
) -> CandidateTree:
    """Best-first tree over candidates (``BestFirstOrder``, grown to ``max_nodes`` + 1 nodes).
    Keeps the prefix of the best-first order that ``best_prefix`` chooses at ``rate``; ``offered``
    holds the whole order."""
    order = BestFirstOrder(root_token, root_candidates, expand, max_nodes, max_depth)
    order.grow(int(max_nodes) + 1)
    keep, expected = best_prefix(order.scores, cost, rate)
    return order.tree(expected).prefix(keep)


def rated_price(relative_cost: float, rate: float) -> float:
    """A round's price in expected tokens: what the decoder earns at ``rate`` (tokens per plain
    round's time) in the round's extra time over a plain round, plus the plain round's own token:
    rate x (cost(n) / cost(1) - 1) + 1. At rate 1 this is cost(n) / cost(1)."""
    return rate * (relative_cost - 1.0) + 1.0


def best_prefix(scores: Sequence[float], cost: CostTable, rate: float = 1.0) -> tuple[int, float]:
    """(nodes kept, root included: the first maximum over prefixes of the expected tokens gained
    over the long-run rate in the same time, (1 + cumulative score) - ``rated_price``(cost(nodes) /
    cost(1), rate); expected tokens of the whole order).

    Why a difference and not the ratio (1 + cumulative score) / cost(nodes): the goal is the
    long-run rate, total tokens over total time, and a round that maximises its own ratio is
    too timid on a round whose first nodes are nearly sure (its ratio is already high, so a
    further node must beat it) and too bold on a weak one. The long-run optimum keeps a node
    while its score exceeds its extra cost times the rate the decoder reaches (renewal-reward;
    Dinkelbach's parameter is the optimal rate), ``rate`` in tokens per plain round's time: the
    decoder's running rate (``LongRunRate``, >= 1, plain decoding's). On the tuning prompts'
    recorded rounds the running rate came 0.5 to 0.9 points of the hindsight oracle closer than
    plain decoding's rate (docs/adaptive-speculation.md): a node is kept only if it pays more than
    what the time would earn anyway.

    In Python: at most max_nodes + 1 entries, where NumPy's per-call cost exceeded the arithmetic
    (the same sums, in the same order, as ``1 + np.cumsum``)."""
    if len(scores) == 1:
        return 1, 1.0
    costs = cost.table(len(scores)).tolist()
    plain = costs[0]
    keep, best, total = 1, 0.0, 0.0  # the root alone gains nothing over plain decoding
    for nodes in range(2, len(scores) + 1):
        total += scores[nodes - 1]
        gain = 1.0 + total - rated_price(costs[nodes - 1] / plain, rate)
        if gain > best:
            keep, best = nodes, gain
    return keep, 1.0 + total


def root_alone_wins(best_accept: float, cost: CostTable, max_nodes: int, rate: float = 1.0) -> bool:
    """Whether ``grow_tree`` would keep the root alone, known before growing anything: every node's
    score is a product of acceptances <= 1, so none exceeds ``best_accept``, the best root
    candidate's, and a tree of k nodes expects at most 1 + (k - 1) x best_accept tokens. When that
    bound's gain (``best_prefix`` at ``rate``) stays strictly below the root alone's, 0,
    for every k up to 1 + max_nodes, no prefix of the best-first order can win (grow_tree keeps
    the first maximum), so the round is plain decoding and growing the tree would be wasted work."""
    if max_nodes < 1:
        return True
    costs = cost.table(1 + int(max_nodes)).tolist()  # Python over <= 25 entries: cheaper than NumPy's calls
    best, plain = max(float(best_accept), 0.0), costs[0]
    return all(1.0 + nodes * best - rated_price(costs[nodes] / plain, rate) < 0.0 for nodes in range(1, len(costs)))


@dataclass
class LongRunRate:
    """The decoder's running rate in tokens per plain round's time (plain decoding: 1), the price
    of time in ``best_prefix``: each round adds its emitted tokens and its modelled cost relative to a
    plain round, cost(n) / cost(1), both decayed by ``decay`` per round, on top of ``prior_weight``
    plain rounds. Never below 1: plain decoding is always available. Past rounds only, so a tree
    sized by it keeps every rule exact."""

    decay: float = 0.95
    prior_weight: float = 4.0
    tokens: float = field(init=False)  # decayed tokens emitted, prior included
    plain_rounds: float = field(init=False)  # decayed time they took, in plain rounds

    def __post_init__(self):
        if not 0.0 < self.decay <= 1.0 or not self.prior_weight >= 0.0:
            raise ConfigError(f"a long-run rate needs 0 < decay <= 1 and prior_weight >= 0, got {self.decay}, {self.prior_weight}")
        self.tokens = self.plain_rounds = float(self.prior_weight)

    def record(self, tokens: int, relative_cost: float) -> None:
        """One round emitted ``tokens`` in ``relative_cost`` plain rounds' time."""
        self.tokens = self.decay * self.tokens + float(tokens)
        self.plain_rounds = self.decay * self.plain_rounds + float(relative_cost)

    @property
    def value(self) -> float:
        if self.plain_rounds <= 0.0:
            return 1.0
        return max(1.0, self.tokens / self.plain_rounds)


@dataclass
class RestSchedule:
    """When a token-tree drafter rests (``TokenTreeDrafter.resting``): after ``after`` proposals in
    a row that kept the root alone, rounds are plain, except every ``wake_every``-th, which
    proposes as usual; a proposal that drafts anything ends the rest. A deterministic function of
    past proposals only. ``after`` 0 disables resting."""

    after: int = 8
    wake_every: int = 8
    quiet: int = 0  # proposals in a row that kept the root alone
    rested: int = 0  # plain rounds since the last proposal while resting

    def __post_init__(self):
        if self.after < 0 or self.wake_every < 1:
            raise ConfigError(f"a rest schedule needs after >= 0 and wake_every >= 1, got {self.after}, {self.wake_every}")

    def record(self, drafted: bool) -> None:
        """A proposal was made (drafting a tree or not)."""
        self.quiet = 0 if drafted else self.quiet + 1
        self.rested = 0

    def rests(self) -> bool:
        """Called once per round before proposing: True when this round is plain."""
        if self.after == 0 or self.quiet < self.after or self.rested + 1 >= self.wake_every:
            return False
        self.rested += 1
        return True


@dataclass
class ProbeSchedule:
    """When the policy keeps choosing the root alone, force a small tree (or chain) now and then:
    after a run of decisions without speculation, one probe of ``size`` draft tokens. A
    deterministic function of past decisions and past timings only.

    The run is at least ``every`` decisions, and long enough that probes cost at most
    ``max_overhead`` of plain decoding's time: a probe scores ``size`` tokens more than a plain
    round, (cost(1 + size) / cost(1) - 1) of a plain round more, so with ``cost`` (the round
    costs the policy reads) the run is at least that extra over ``max_overhead``, minus one. With the
    shipped prior (5 tokens and a speculative round's overhead: 1.22x a plain round) that is 21
    rounds; where extra tokens are nearly free (5 tokens for 1.05x one) it is ``every``;
    where a forward's cost grows with its tokens (llama.cpp's quantized kernels: 5 tokens ~3x one)
    probes become rare (~200 rounds apart) instead of costing a fifth of the time. Without
    ``cost``: every ``every + 1`` rounds."""

    every: int = 8
    size: int = 4
    max_overhead: float = 0.01
    plain_streak: int = 0

    def __post_init__(self):
        if self.every < 1 or self.size < 1 or not self.max_overhead > 0:
            raise ConfigError(f"a probe schedule needs every >= 1, size >= 1 and max_overhead > 0, got "
                              f"{self.every}, {self.size}, {self.max_overhead}")

    def run_length(self, cost: CostTable | None = None) -> int:
        """Plain decisions in a row before a probe is due."""
        if cost is None:
            return self.every
        table = cost.table(1 + self.size)
        extra = max(0.0, float(table[-1] / table[0]) - 1.0)
        return max(self.every, math.ceil(extra / self.max_overhead) - 1)

    def due(self, speculating: bool, cost: CostTable | None = None) -> bool:
        """Called once per decision: True when this one should be a probe (and then restarts the count)."""
        if speculating:
            self.plain_streak = 0
            return False
        if self.plain_streak >= self.run_length(cost):
            self.plain_streak = 0
            return True
        self.plain_streak += 1
        return False

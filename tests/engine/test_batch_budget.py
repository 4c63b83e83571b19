"""The batch budget (``engine.batch_budget.split_scored_tokens``): one cost model for the batched
forward, its scored tokens split between sequences by expected tokens per predicted second.

* one sequence: exactly the single-sequence choice of ``grow_tree`` (same offers, same cost);
* more sequences with the same offers: each tree shrinks, and with enough of them speculation
  turns off (every tree the root alone);
* expensive forwards (cost linear in the tokens scored): no speculation at any batch size;
* the sequence with the better candidates gets the tokens;
* in a real batch (tiny model) the decision is in every round's stats and the trees follow it.
"""

import numpy as np
import pytest

from verispec.draft.tree_policy import Candidate, CostCurve, grow_tree
from verispec.engine.batch_budget import split_scored_tokens
from verispec.engine.cost_model import OnlineCostModel
from verispec.errors import ConfigError

# a chain of candidates each accepted with 0.6 (a typical rate): 6 nodes pay alone under the prior
CHAIN_OFFER = [0.6 ** (i + 1) for i in range(24)]


def random_tree(rng: np.random.Generator, cost, max_nodes: int = 24):
    """A best-first tree from random candidates: 3 children per node with random acceptances that
    sum to at most 1 (siblings exclude each other: the walk moves into one of them at most)."""
    def candidates():
        weights = rng.uniform(0, 1, 3)
        accepts = weights / weights.sum() * rng.uniform(0, 1)
        return [Candidate(int(t), float(a), ("adj", 0)) for t, a in zip(rng.choice(50, 3, replace=False), accepts)]

    return grow_tree(0, candidates(), lambda candidate, depth: candidates(), cost, max_nodes, 6)


def random_order(rng: np.random.Generator, max_nodes: int = 24):
    """``random_tree``'s candidates as a ``BestFirstOrder`` grown on demand (same draws, same order)."""
    from verispec.draft.tree_policy import BestFirstOrder

    def candidates():
        weights = rng.uniform(0, 1, 3)
        accepts = weights / weights.sum() * rng.uniform(0, 1)
        return [Candidate(int(t), float(a), ("adj", 0)) for t, a in zip(rng.choice(50, 3, replace=False), accepts)]

    return BestFirstOrder(0, candidates(), lambda candidate, depth: candidates(), max_nodes, 6)


@pytest.mark.parametrize("cost", [CostCurve(), CostCurve(overhead=0.0), OnlineCostModel(learn=False),
                                  CostCurve(((1, 1.0), (2, 1.6)))])
def test_one_sequence_is_exactly_the_single_sequence_choice(cost):
    rng = np.random.default_rng(0)
    sizes = set()
    for _ in range(200):
        tree = random_tree(rng, cost)
        decision = split_scored_tokens([tree.offered.scores[1:]], cost)
        assert decision.nodes == (tree.num_nodes,)
        assert decision.expected_tokens == pytest.approx(tree.expected_tokens)
        assert decision.scored_tokens == tree.num_nodes
        sizes.add(tree.num_nodes)
    if cost.table(2)[1] < 1.5:  # cheap extra tokens: the choices vary, not a constant
        assert len(sizes) > 3


def test_trees_shrink_with_the_batch_and_speculation_turns_off():
    cost = OnlineCostModel(learn=False)  # the prior: extra tokens nearly free up to ~8, then dearer
    per_sequence = []
    for batch in (1, 2, 4, 8, 16, 32):
        decision = split_scored_tokens([CHAIN_OFFER] * batch, cost)
        assert len(set(decision.nodes)) <= 2  # equal offers, near-equal shares (ties go to the lower index)
        per_sequence.append(max(decision.nodes))
        assert decision.scored_tokens == sum(decision.nodes)
        assert decision.predicted_seconds == pytest.approx(cost.round_seconds(decision.scored_tokens))
    assert per_sequence == sorted(per_sequence, reverse=True)
    assert per_sequence[0] >= 5 and per_sequence[-1] == 1  # grows alone; off at 32
    assert per_sequence[2] < per_sequence[0]  # 4 sequences already get smaller trees
    assert split_scored_tokens([CHAIN_OFFER] * 64, cost).nodes == (1,) * 64


def test_expensive_forwards_turn_speculation_off():
    linear = CostCurve(((1, 1.0), (2, 2.0)), overhead=0.0)  # every token costs a whole forward
    for batch in (1, 2, 4):
        assert split_scored_tokens([[0.9, 0.8, 0.5]] * batch, linear).nodes == (1,) * batch


def test_the_better_offer_gets_the_tokens():
    cost = OnlineCostModel(learn=False)
    weak, strong = [0.3 ** (i + 1) for i in range(12)], [0.95 ** (i + 1) for i in range(12)]
    decision = split_scored_tokens([weak, strong, weak, weak], cost)
    assert decision.nodes[1] > max(decision.nodes[0], decision.nodes[2], decision.nodes[3])
    assert decision.nodes[1] >= 6
    # the kept nodes are the global best first: no kept score below a dropped one
    kept = [s for offer, n in zip([weak, strong, weak, weak], decision.nodes) for s in offer[: n - 1]]
    dropped = [s for offer, n in zip([weak, strong, weak, weak], decision.nodes) for s in offer[n - 1 :]]
    assert min(kept) >= max(dropped)


def test_tokens_already_queued_count_in_the_cost():
    cost = OnlineCostModel(learn=False)
    alone = split_scored_tokens([CHAIN_OFFER], cost)
    beside_a_prompt = split_scored_tokens([CHAIN_OFFER], cost, fixed_tokens=200)
    assert beside_a_prompt.scored_tokens == 200 + sum(beside_a_prompt.nodes)
    assert beside_a_prompt.nodes[0] != alone.nodes[0]


def test_an_empty_offer_is_a_plain_round_and_no_sequence_is_an_error():
    assert split_scored_tokens([[], []], CostCurve()).nodes == (1, 1)
    with pytest.raises(ConfigError, match="at least one sequence"):
        split_scored_tokens([], CostCurve())


def _split_of_the_whole_order(offers, cost, fixed_tokens=0):
    """The split as first written: every offer read whole, one sort, the first maximum over all
    prefixes (the lazy merge must choose the same)."""
    batch = len(offers)
    entries = sorted((-float(score), owner, position) for owner, scores in enumerate(offers) for position, score in enumerate(scores))
    gains = np.array([-entry[0] for entry in entries], dtype=float)
    expected = batch + np.concatenate([[0.0], np.cumsum(gains)])
    base = fixed_tokens + batch
    seconds = np.asarray(cost.table(base + len(entries)), dtype=float)[base - 1:]
    keep = int(np.argmax(expected - seconds * (batch / seconds[0])))
    nodes = [1] * batch
    for _, owner, _ in entries[:keep]:
        nodes[owner] += 1
    return tuple(nodes), float(expected[keep]), float(seconds[keep])


@pytest.mark.parametrize("seed", range(40))
def test_the_lazy_merge_chooses_what_the_whole_order_gives(seed):
    """Lazy offers (best-first orders grown on demand) and lists: the same split as sorting every
    entry of every whole offer, on smooth and on bumpy cost tables; a lazy order is read at most
    one entry past what the split takes from it."""
    from verispec.draft.tree_policy import BestFirstOrder

    rng = np.random.default_rng(seed)
    steps = rng.uniform(0.0, 0.3, 80) * (rng.uniform(size=80) < (0.3 if seed % 2 else 1.0))
    cost = CostCurve(tuple((n, 1.0 + float(steps[: n - 1].sum())) for n in range(1, 81)), overhead=0.0)
    batch = int(rng.integers(1, 6))
    orders, wholes = [], []
    for _ in range(batch):
        tree = random_tree(rng, cost)
        scores = list(tree.offered.scores[1:])
        wholes.append(scores)
        orders.append(_ReplayOrder(scores))
    fixed = int(rng.integers(0, 3))
    expected_nodes, expected_tokens, expected_seconds = _split_of_the_whole_order(wholes, cost, fixed)
    for offers in (wholes, orders):
        plan = split_scored_tokens(offers, cost, fixed)
        assert plan.nodes == expected_nodes
        assert plan.expected_tokens == expected_tokens and plan.predicted_seconds == expected_seconds
    # the merge takes entries best first until no more can pay, then stops reading
    assert sum(order.read for order in orders) <= sum(len(whole) for whole in wholes)
    if seed % 2 == 0 and sum(expected_nodes) < batch + 3:  # smooth cost, small trees: most of the orders unread
        assert sum(order.read for order in orders) < sum(len(whole) for whole in wholes) / 2


def test_a_best_first_order_grown_on_demand_is_grow_trees_order():
    from verispec.draft.tree_policy import BestFirstOrder

    for seed in range(20):
        whole = random_tree(np.random.default_rng(seed), CostCurve()).offered
        lazy = random_order(np.random.default_rng(seed))  # the same candidates, drawn in the same order
        assert lazy.score(0) == (whole.scores[1] if whole.num_nodes > 1 else None)
        lazy.grow(100)
        assert lazy.tree().tokens == whole.tokens and lazy.tree().scores == whole.scores


class _ReplayOrder:
    """A ``LazyOffer`` over known scores that records how far it was read."""

    def __init__(self, scores):
        self.scores, self.capacity, self.read = scores, len(scores), 0

    def score(self, position):
        self.read = max(self.read, position + 1)
        return self.scores[position] if position < len(self.scores) else None

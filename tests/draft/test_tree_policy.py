"""Adaptive token-tree size (issue 12): the cost curve, the acceptance estimates and the best-first
tree that maximises expected tokens per unit of cost."""

import pytest

from verispec.draft.tree_policy import (
    AcceptanceEstimates,
    Candidate,
    CostCurve,
    adjacency_bucket,
    copy_bucket,
    LongRunRate,
    best_prefix,
    grow_tree,
    rated_price,
    root_alone_wins,
)
from verispec.errors import ConfigError

CLS = ("adj", 3)


def chain_expander(accept):
    """Each node has one child (token + 1) and a weaker one (token + 100)."""
    return lambda candidate, depth: [Candidate(candidate.token + 1, accept, CLS), Candidate(candidate.token + 100, accept / 4, CLS)]


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve(((1, 1.0), (5, 1.4), (9, 2.2)), overhead=0.1)
    assert curve(1) == 1.0  # a root-only round pays no drafting overhead
    assert curve(3) == pytest.approx(1.2 + 0.1)
    assert curve(13) == pytest.approx(3.0 + 0.1)
    with pytest.raises(ConfigError, match="starting at 1"):
        CostCurve(((2, 1.0), (4, 2.0)))


def test_worthless_candidates_give_the_root_alone():
    tree = grow_tree(7, [Candidate(1, 0.01, CLS)], chain_expander(0.01), CostCurve(), max_nodes=16, max_depth=8)
    assert tree.tokens == (7,) and tree.expected_tokens == 1.0


def test_good_candidates_grow_a_tree_that_beats_its_cost():
    cost = CostCurve()
    tree = grow_tree(7, [Candidate(1, 0.9, CLS)], chain_expander(0.9), cost, max_nodes=32, max_depth=12)
    assert tree.num_nodes > 5
    assert tree.expected_tokens / cost(tree.num_nodes) > 1.0
    # parents precede children and scores never increase along the best-first order
    assert all(0 <= p < i for i, p in enumerate(tree.parents) if i)
    assert list(tree.scores[1:]) == sorted(tree.scores[1:], reverse=True)
    assert tree.scores[1] == pytest.approx(0.9) and tree.scores[2] == pytest.approx(0.81)
    assert tree.expected_tokens == pytest.approx(1 + sum(tree.scores[1:]))
    assert max(len([p for p in tree.parents if p == n]) for n in range(tree.num_nodes)) <= 2


def test_depth_and_size_limits():
    tree = grow_tree(0, [Candidate(1, 1.0, CLS)], chain_expander(1.0), CostCurve(((1, 1.0), (64, 1.0)), 0.0), max_nodes=5, max_depth=3)
    assert tree.num_nodes <= 6
    depth = {0: 0}
    for node in range(1, tree.num_nodes):
        depth[node] = depth[tree.parents[node]] + 1
    assert max(depth.values()) <= 3


def test_estimates_follow_hits_and_start_at_the_prior():
    estimates = AcceptanceEstimates(prior_weight=4.0, decay=1.0)
    cls = ("copy", copy_bucket(6))
    assert estimates.rate(cls) == pytest.approx(AcceptanceEstimates.prior(cls))
    estimates.record([(cls, True)] * 96)
    assert estimates.rate(cls) == pytest.approx((96 + 4 * AcceptanceEstimates.prior(cls)) / 100)
    assert adjacency_bucket(0.0) == 0 and adjacency_bucket(0.99) == 7 and adjacency_bucket(1.0) == 7


def test_root_alone_wins_only_when_growing_keeps_the_root_alone():
    """The shortcut that skips growing a tree must never change the choice: whenever it says "root
    alone", grow_tree keeps the root alone, over many acceptances, costs and limits; and it is
    not vacuous (it fires on worthless candidates, not on good ones)."""
    import random

    generator = random.Random(5)
    fired = 0
    for _ in range(400):
        accept = generator.choice([0.001, 0.01, 0.03, 0.1, 0.3, 0.6, 0.9])
        deep = generator.uniform(0.0, 1.0)  # children may be as good as (or better than) the root's
        slope = generator.choice([0.0, 0.005, 0.02, 0.1])
        cost = CostCurve(((1, 1.0), (2, 1.0 + slope), (32, 1.0 + 31 * slope)), overhead=generator.choice([0.0, 0.02, 0.2]))
        max_nodes = generator.choice([1, 2, 8, 24])
        rate = generator.choice([1.0, 1.0, 1.3, 2.5])  # the price of time (a decoder's running rate)
        expand = lambda candidate, depth, deep=deep: [Candidate(candidate.token + 1, deep, CLS)]  # noqa: E731
        tree = grow_tree(0, [Candidate(1, accept, CLS), Candidate(2, accept / 2, CLS)], expand, cost, max_nodes, 12, rate)
        if root_alone_wins(accept, cost, max_nodes, rate):
            fired += 1
            assert tree.num_nodes == 1, (accept, deep, slope, max_nodes)
    assert 40 < fired < 360
    assert root_alone_wins(0.001, CostCurve(), 24) and not root_alone_wins(0.5, CostCurve(), 24)
    # at a higher rate the same candidate no longer pays: 0.3 per node against 0.1 of a plain round's
    # time per node, worth 0.2 tokens at rate 2 and 0.4 at rate 4
    linear = CostCurve(((1, 1.0), (2, 1.1), (32, 4.1)), overhead=0.0)
    assert not root_alone_wins(0.3, linear, 24, rate=2.0) and root_alone_wins(0.3, linear, 24, rate=4.0)


def test_root_alone_wins_bounds_every_size_not_just_the_first_node():
    """One candidate of 0.015 does not pay for a 2-node round (cost 1.02), but the bound must also
    cover larger trees: with a flat cost curve 24 such nodes would pay (1 + 24 x 0.015 > 1.02)."""
    flat = CostCurve(((1, 1.0), (32, 1.0)), overhead=0.02)
    assert not root_alone_wins(0.015, flat, 24)
    assert root_alone_wins(0.015, flat, 1)
    assert not root_alone_wins(0.03, flat, 1)


def test_best_prefix_maximises_the_gain_over_plain_decoding_not_the_rounds_ratio():
    """A nearly sure first node and a 0.4 second one, the second costing 0.3 of a plain step: the
    round's own ratio stops at one node (1.99 / 1.0 > 2.39 / 1.3), the long-run rate keeps both
    (2.39 - 1.3 > 1.99 - 1.0: the 0.4 tokens beat the 0.3 plain steps they cost)."""
    step = CostCurve(((1, 1.0), (2, 1.0), (3, 1.3), (4, 4.0)), overhead=0.0)
    assert best_prefix([1.0, 0.99, 0.4], step) == (3, pytest.approx(2.39))
    assert best_prefix([1.0, 0.99, 0.2], step) == (2, pytest.approx(2.19))  # 0.2 < 0.3: not worth it
    assert best_prefix([1.0, 0.1], CostCurve(((1, 1.0), (2, 1.2)), overhead=0.0)) == (1, pytest.approx(1.1))
    # ties keep the smaller tree (the first maximum): 0.5 tokens for 0.5 plain steps
    assert best_prefix([1.0, 0.5], CostCurve(((1, 1.0), (2, 1.5)), overhead=0.0))[0] == 1


def test_best_prefix_prices_time_at_the_running_rate():
    """A node is kept while its score beats its extra time times the rate the decoder reaches: at
    rate 1.5 the 0.4 node of the example above, costing 0.3 plain rounds (0.45 tokens at 1.5), is
    no longer worth it; at rate 1.3 (0.39 tokens) it still is. Plain decoding's price is rate 1."""
    step = CostCurve(((1, 1.0), (2, 1.0), (3, 1.3), (4, 4.0)), overhead=0.0)
    assert best_prefix([1.0, 0.99, 0.4], step, rate=1.3)[0] == 3
    assert best_prefix([1.0, 0.99, 0.4], step, rate=1.5)[0] == 2
    assert best_prefix([1.0, 0.99, 0.4], step, rate=1.0) == best_prefix([1.0, 0.99, 0.4], step)
    assert rated_price(1.3, 1.0) == pytest.approx(1.3) and rated_price(1.3, 2.0) == pytest.approx(1.6)
    assert rated_price(1.0, 7.0) == 1.0  # a plain round costs one token's time at any rate


def test_long_run_rate_follows_the_rounds_and_never_drops_below_plain():
    rate = LongRunRate(decay=1.0, prior_weight=4.0)
    assert rate.value == 1.0  # the prior: plain decoding
    rate.record(3, 1.2)  # a round that emitted 3 tokens in 1.2 plain rounds' time
    assert rate.value == pytest.approx((4 + 3) / (4 + 1.2))
    for _ in range(50):
        rate.record(1, 1.5)  # rounds that waste time: the rate would sink below plain, but plain is always there
    assert rate.value == 1.0
    decaying = LongRunRate(decay=0.5, prior_weight=0.0)
    decaying.record(1, 1.0)
    decaying.record(4, 1.0)
    assert decaying.value == pytest.approx((0.5 * 1 + 4) / (0.5 + 1))  # the last round weighs twice the one before
    assert LongRunRate(prior_weight=0.0).value == 1.0  # nothing recorded yet
    for bad in ({"decay": 0.0}, {"decay": 1.5}, {"prior_weight": -1.0}):
        with pytest.raises(ConfigError, match="long-run rate"):
            LongRunRate(**bad)

"""The token trees' candidate classes carry their rank among siblings (draft.tree_policy
ACCEPT_PRIOR, engine.drafters.TokenTreeDrafter._merge): siblings exclude each other, so the same
adjacency bucket is far likelier right as the best sibling than below a copy continuation."""

import pytest
import torch

from verispec.draft.tree_policy import ACCEPT_PRIOR, SIBLING_RANKS, AcceptanceEstimates, CostCurve
from verispec.engine.drafters import TokenTreeDrafter
from verispec.models.token_tree import AdjacencyTable

VOCAB = 8
FREE = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)


def table_with_row(token: int, next_logits: dict[int, float]) -> AdjacencyTable:
    table = AdjacencyTable(VOCAB, k=3)
    logits = torch.full((1, VOCAB), -30.0)
    for next_token, value in next_logits.items():
        logits[0, next_token] = value
    table.update([token], logits)
    return table


def test_siblings_are_classed_by_rank_and_a_copy_outranks_the_adjacency_row():
    # token 3's row: 5 (p ~0.88), 6 (~0.12), 7 (~0.0): buckets 6, 1, 0
    table = table_with_row(3, {5: 4.0, 6: 2.0, 7: -4.0})
    drafter = TokenTreeDrafter(VOCAB, k=3, adjacency=table, cost=FREE)
    drafter.reset([1, 2, 3, 4, 1, 2, 3])  # the suffix 1 2 3 recurs: the copy continues with 4
    children = drafter._merge([drafter._copy(3, 3)], 3)
    by_token = {c.token: c for c in children}
    assert [c.token for c in children][0] == 4  # a 3-token copy (0.59) before an adjacency 0.88 (0.42)
    assert by_token[4].cls == ("copy", 2, 0)
    assert by_token[5].cls == ("adj", 6, 1) and by_token[6].cls == ("adj", 1, 2) and by_token[7].cls == ("adj", 0, 2)
    assert by_token[5].accept == pytest.approx(ACCEPT_PRIOR[("adj", 6, 1)])
    assert by_token[5].accept < ACCEPT_PRIOR[("adj", 6, 0)] / 2  # second place costs it most of its chance


def test_a_token_offered_by_both_sources_takes_the_union_at_its_rank():
    table = table_with_row(3, {4: 4.0, 6: 2.0})
    drafter = TokenTreeDrafter(VOCAB, k=3, adjacency=table, cost=FREE)
    drafter.reset([1, 2, 3, 4, 1, 2, 3])
    children = drafter._merge([drafter._copy(3, 3)], 3)
    first = children[0]
    copy_rate, adj_rate = ACCEPT_PRIOR[("copy", 2, 0)], ACCEPT_PRIOR[("adj", 6, 0)]
    assert first.token == 4 and first.copy_start == 3  # the copy state is kept
    assert first.accept == pytest.approx(1 - (1 - copy_rate) * (1 - adj_rate))
    assert first.cls == (("copy", 2, 0) if copy_rate >= adj_rate else ("adj", 6, 0))
    assert children[1].cls[2] == 1


def test_estimates_learn_each_rank_separately():
    estimates = AcceptanceEstimates(prior_weight=4.0, decay=1.0)
    estimates.record([(("adj", 6, 1), False)] * 20)
    assert estimates.rate(("adj", 6, 1)) == pytest.approx(4 * ACCEPT_PRIOR[("adj", 6, 1)] / 24)
    assert estimates.rate(("adj", 6, 0)) == pytest.approx(ACCEPT_PRIOR[("adj", 6, 0)])  # untouched


def test_the_prior_table_is_complete_and_never_favours_a_worse_sibling():
    for source, buckets in (("copy", 7), ("adj", 8)):
        for bucket in range(buckets):
            rates = [ACCEPT_PRIOR[(source, bucket, rank)] for rank in range(SIBLING_RANKS)]
            assert all(0.0 < r < 1.0 for r in rates)
            assert rates == sorted(rates, reverse=True), (source, bucket)
    assert len(ACCEPT_PRIOR) == (7 + 8) * SIBLING_RANKS


def test_ranks_come_from_the_shipped_priors_even_when_nothing_was_learned():
    """With llama.cpp's zero prior every learned rate starts at 0; the siblings are still ranked by
    the shipped rank-0 priors, so the first hits teach the classes that will be drafted, not
    whichever candidate arrived first in a tie: here a 1-token copy match (prior 0.15) arrives
    first, and an adjacency entry recorded at ~1.0 (prior 0.51) still takes rank 0."""
    table = table_with_row(3, {5: 12.0, 6: 2.0})
    drafter = TokenTreeDrafter(VOCAB, k=3, adjacency=table, cost=FREE, prior_scale=0.0)
    drafter.reset([1, 2, 3, 4, 1, 2, 3])
    copy = drafter._copy(3, 1)
    assert copy.cls == ("copy", 0) and ACCEPT_PRIOR[("copy", 0, 0)] < ACCEPT_PRIOR[("adj", 7, 0)]
    children = drafter._merge([copy], 3)
    assert all(c.accept == 0.0 for c in children)
    assert {c.token: c.cls for c in children} == {5: ("adj", 7, 0), 4: ("copy", 0, 1), 6: ("adj", 0, 2)}

"""The online cost model (engine.cost_model): prior before any reading, learning per size bucket,
robustness to one wild reading, neighbours for unobserved sizes; the probe schedule; the chain
length policy; and what the engine records of each round's decision."""

import json

import numpy as np
import pytest

from tests.engine.tiny import tiny_llama
from verispec.draft.chain_policy import ChainLengthPolicy, PositionAcceptance
from verispec.draft.tree_policy import Candidate, CostCurve, ProbeSchedule, grow_tree, rated_price
from verispec.engine.cost_model import OnlineCostModel, prior_overhead_shape, prior_shape, size_bucket
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter

CLS = ("adj", 3)
PROMPT = [1, 2, 3, 4, 1, 2, 3]


def chain_expander(accept):
    return lambda candidate, depth: [Candidate(candidate.token + 1, accept, CLS), Candidate(candidate.token + 100, accept / 3, CLS)]


def tree_size(cost, accept=0.7) -> int:
    return grow_tree(0, [Candidate(1, accept, CLS)], chain_expander(accept), cost, max_nodes=32, max_depth=12).num_nodes


def machine(model: OnlineCostModel, unit: float, per_token: float, sizes=(1, 4, 8, 12, 16, 24), rounds=6) -> None:
    """Feed readings of a machine whose forward costs unit + per_token x (n - 1) seconds."""
    for _ in range(rounds):
        for n in sizes:
            model.record(n, unit + per_token * (n - 1), 0.02 * unit)


def test_size_buckets():
    assert [size_bucket(n) for n in (1, 2, 3, 4, 5, 8, 9, 16, 17)] == [0, 1, 2, 2, 3, 3, 4, 4, 5]


def test_before_any_reading_the_table_is_the_prior():
    model = OnlineCostModel()
    sizes = np.arange(1, 41)
    np.testing.assert_allclose(model.table(40), prior_shape(sizes) + prior_overhead_shape(sizes))
    assert model.unit_seconds() == 1.0 and model.round_seconds(5) == pytest.approx(model.table(5)[-1])
    with pytest.raises(ConfigError, match="window >= 1"):
        OnlineCostModel(window=0)


def test_a_reading_renews_the_tables_read_between_readings():
    """Tables are kept between readings (a round reads them several times) and every reading
    renews them; a kept table cannot be written."""
    model = OnlineCostModel()
    first = model.table(8)
    assert np.shares_memory(model.table(8), first) and np.shares_memory(model.table(3), first)
    np.testing.assert_array_equal(model.table(16)[:8], first)  # a larger table starts the same
    with pytest.raises(ValueError):
        first[0] = 0.0
    model.record(1, 0.5, 0.001)  # the first one-token reading: seconds replace the relative units
    assert model.table(8)[0] == pytest.approx(0.5 * (1 + prior_overhead_shape([1])[0]), rel=0.01)
    assert first[0] == pytest.approx(1 + prior_overhead_shape([1])[0])


def test_standing_seconds_reads_the_last_table_without_recomputing():
    """A resting round records the prediction standing since the last table: readings after it
    do not move it until a round reads the table again (then it is that table's)."""
    model = OnlineCostModel()
    assert model.standing_seconds(1) == pytest.approx(1 + prior_overhead_shape([1])[0])  # no table yet: computed
    model.record(1, 0.5, 0.001)
    before = model.standing_seconds(1)
    assert before == pytest.approx(1 + prior_overhead_shape([1])[0])  # the table from before the reading
    fresh = model.round_seconds(1)
    assert fresh == pytest.approx(0.5 * (1 + prior_overhead_shape([1])[0]), rel=0.01) and fresh != before
    assert model.standing_seconds(1) == fresh
    assert model.standing_seconds(4) == model.round_seconds(4)  # a table too short: computed


def test_the_table_follows_the_machine_and_so_does_the_tree():
    cheap, dear = OnlineCostModel(), OnlineCostModel()
    machine(cheap, 0.02, 0.0002)  # scoring more tokens costs almost nothing: big trees pay
    machine(dear, 0.02, 0.004)  # each extra token costs 20% of a forward: small trees
    assert cheap.unit_seconds() == pytest.approx(0.02, rel=0.05)
    assert cheap.table(16)[-1] == pytest.approx(0.02 + 15 * 0.0002 + 0.02 * 0.02, rel=0.15)
    assert dear.table(16)[-1] == pytest.approx(0.02 + 15 * 0.004 + 0.02 * 0.02, rel=0.15)
    assert tree_size(cheap) > tree_size(dear) + 4


@pytest.mark.parametrize("size", [1, 8, 16])
def test_one_wild_reading_does_not_move_the_choice(size):
    model = OnlineCostModel()
    machine(model, 0.02, 0.001)
    before, table = tree_size(model), model.table(32).copy()
    model.record(size, 10 * (0.02 + 0.001 * (size - 1)), 0.0004)  # a 10x stall (another process, a page fault)
    assert tree_size(model) == before
    np.testing.assert_allclose(model.table(32), table, rtol=0.05)


def test_a_bucket_leaves_the_prior_only_after_more_readings_than_prior_weight():
    model = OnlineCostModel(prior_weight=3)
    for _ in range(5):
        model.record(1, 0.01, 0.0)
    prior_seconds = 0.01 * float(prior_shape(12))
    for _ in range(2):
        model.record(12, 5 * prior_seconds, 0.0)
    assert model.table(12)[-1] < 1.1 * prior_seconds  # two agreeing readings against three prior ones
    for _ in range(2):
        model.record(12, 5 * prior_seconds, 0.0)
    assert model.table(12)[-1] > 4.5 * prior_seconds


def test_a_bucket_with_few_readings_starts_from_the_ratio_the_other_sizes_measured():
    """The pseudo-readings of a bucket sit at the ratio pooled over every speculative bucket: on a
    machine whose forwards all cost twice the prior, a bucket's first reading at the prior's value
    (or a 10x stall) leaves it at twice the prior, where zeros would have pulled it back to 1x."""
    for first_reading in (1.0, 10.0):
        model = OnlineCostModel(prior_weight=3)
        for _ in range(5):
            model.record(1, 0.01, 0.01 * float(prior_overhead_shape([1])[0]))
            for n in (3, 6, 20):  # buckets 3-4, 5-8 and 17-32 at twice the prior
                model.record(n, 2.0 * 0.01 * float(prior_shape([n])[0]), 0.01 * float(prior_overhead_shape([n])[0]))
        model.record(12, first_reading * 0.01 * float(prior_shape([12])[0]), 0.01 * float(prior_overhead_shape([12])[0]))
        target = model.table(12)[-1] - 0.01 * float(prior_overhead_shape([12])[0])  # overhead at the prior
        assert target / (0.01 * float(prior_shape([12])[0])) == pytest.approx(2.0, rel=0.02)


def test_unobserved_sizes_take_their_neighbours_ratio_not_a_slope():
    model = OnlineCostModel(prior_weight=0)
    for n, times_prior in ((1, 1.0), (3, 2.0), (20, 2.0)):  # buckets 3-4 and 17-32 at twice the prior
        model.record(n, times_prior * 0.01 * float(prior_shape(n)), 0.01 * float(prior_overhead_shape(n)))
    seconds = model.table(200) - 0.01 * prior_overhead_shape(np.arange(1, 201))
    ratio = seconds / (0.01 * prior_shape(np.arange(1, 201)))
    np.testing.assert_allclose(ratio[[3, 7, 11, 15, 40, 199]], 2.0, rtol=1e-9)  # between them and beyond: x2, the prior's shape
    assert ratio[1] == pytest.approx(np.sqrt(2.0))  # bucket 2, halfway (in log) between bucket 1 (x1) and bucket 3-4 (x2)


def test_a_frozen_model_ignores_readings():
    model = OnlineCostModel(learn=False)
    model.record(1, 5.0, 1.0)
    assert model.readings == 0 and model.unit_seconds() == 1.0


def test_probe_schedule_bounds_probes():
    probes = ProbeSchedule(every=3, size=2)
    due = [probes.due(False) for _ in range(12)]
    assert due == [False, False, False, True] * 3  # one probe in every every + 1 root-only decisions
    assert probes.due(True) is False and probes.plain_streak == 0
    with pytest.raises(ConfigError, match="every >= 1"):
        ProbeSchedule(every=0)
    with pytest.raises(ConfigError, match="max_overhead > 0"):
        ProbeSchedule(max_overhead=0)


def test_probes_cost_at_most_max_overhead_of_plain_decoding():
    """Where a forward's cost grows with its tokens (llama.cpp's quantized kernels), probes become
    rare enough to cost <= max_overhead of plain decoding; where extra tokens are nearly free they
    stay every + 1 rounds apart."""
    linear = CostCurve(((1, 1.0), (2, 2.0)), overhead=0.0)  # 5 tokens cost 5x one
    probes = ProbeSchedule(every=8, size=4, max_overhead=0.01)
    rounds = 4000
    due = [probes.due(False, linear) for _ in range(rounds)]
    extra = linear(1 + probes.size) / linear(1) - 1
    assert 1 <= sum(due) and sum(due) * extra / rounds <= 0.01
    assert sum(due) >= 0.8 * rounds * 0.01 / extra  # not rarer than the bound needs (still probing)
    flat = CostCurve(((1, 1.0), (16, 1.05)), overhead=0.0)
    assert ProbeSchedule(every=8, size=4).run_length(flat) == 8
    assert ProbeSchedule(every=8, size=4).run_length(None) == 8
    # the token-tree drafter passes its cost: with the linear curve no probe in 100 root-only rounds
    drafter = TokenTreeDrafter(8, k=2, max_nodes=8, max_depth=3)
    drafter.reset([1, 2, 3, 1, 2])
    assert not any(drafter.propose(cost=linear).probe for _ in range(100))


def test_token_tree_probes_after_a_run_of_root_only_rounds():
    # max_overhead huge: this test is about the run of root-only rounds, not the probes' cost bound
    drafter = TokenTreeDrafter(8, k=2, max_nodes=8, max_depth=3, probes=ProbeSchedule(every=2, size=3, max_overhead=1e6))
    drafter.reset([1, 2, 3, 1, 2])  # a copy candidate (3) is offered
    costly = CostCurve(((1, 1.0), (2, 50.0)))  # nothing pays
    trees = [drafter.propose(cost=costly) for _ in range(6)]
    assert [t.num_nodes for t in trees] == [1, 1, 4, 1, 1, 4]
    assert [t.probe for t in trees] == [False, False, True] * 2
    assert trees[2].tokens == trees[2].offered.tokens[: trees[2].num_nodes]
    # root-only rounds known before growing: no offered order, which offered_tree grows on demand
    assert trees[0].offered is None and drafter.offered_tree(cost=costly).tokens == trees[2].offered.tokens
    with pytest.raises(ConfigError, match="needs a cost table"):
        TokenTreeDrafter(8).propose()


def test_chain_length_follows_acceptance_and_cost():
    flat = CostCurve(((1, 1.0), (16, 1.0)), overhead=0.0)  # drafting is free: the longest chain
    assert ChainLengthPolicy(6).choose(flat).draft_len == 6
    dear = CostCurve(((1, 1.0), (2, 1.7), (16, 15.0)), overhead=0.0)
    # max_overhead huge: every 9th decision probes, whatever a probe costs
    policy = ChainLengthPolicy(6, probes=ProbeSchedule(size=2, max_overhead=1e6))
    for _ in range(20):
        policy.record(4, 0)  # nothing accepted: plain rounds, then a probe of 2 now and then
    choices = [policy.choose(dear) for _ in range(18)]
    assert [c.draft_len for c in choices].count(0) == 16 and all(c.draft_len == 2 for c in choices if c.probe)
    # the default bound: a probe of 2 costs 1.65 plain rounds more here, so ~165 plain rounds between probes
    policy = ChainLengthPolicy(6)
    for _ in range(20):
        policy.record(4, 0)
    assert [policy.choose(dear).draft_len for _ in range(150)].count(0) == 150
    assert ChainLengthPolicy(6).choose(flat, limit=3).draft_len == 3 and ChainLengthPolicy(6).choose(flat, limit=0).draft_len == 0


def test_position_acceptance_counts_only_tried_positions():
    acceptance = PositionAcceptance(decay=1.0, prior_weight=0.0)
    acceptance.record(3, 1)  # positions 1, 2 tried; 1 hit
    acceptance.record(3, 3)
    np.testing.assert_allclose(acceptance.rates(4), [1.0, 0.5, 1.0, 1.0])  # position 4 never tried: inherits 3's


def test_stats_record_each_rounds_decision():
    target = tiny_llama(0)
    decoder = SpeculativeDecoder(target, temperature=0, max_new_tokens=12, eos_token_id=[])
    assert not hasattr(decoder.drafter, "calibrate")  # no start-up measurement any more
    output = decoder.generate(PROMPT)
    record = json.loads(json.dumps(output.to_dict()))
    policies = [step["policy"] for step in record["steps"]]
    assert all(p["scored_tokens"] == step["tree_nodes"] for p, step in zip(policies, record["steps"]))
    assert all(p["predicted_seconds"] > 0 and p["measured_target_seconds"] > 0 for p in policies)
    assert record["root_only_rounds"] == sum(p["scored_tokens"] == 1 for p in policies)
    assert decoder.cost_model.readings == len(policies)
    # the price of time each round's size was chosen at: the running rate of the rounds before it
    assert policies[0]["time_price"] == 1.0 and all(p["time_price"] >= 1.0 for p in policies)


def test_default_draft_len_is_chosen_per_round_for_chain_rules_only():
    target = tiny_llama(0)
    auto = SpeculativeDecoder(target, "ngram", method="sd", temperature=0, max_new_tokens=16, eos_token_id=[])
    assert auto.adaptive_draft_len and auto.draft_len == 8
    output = auto.generate(PROMPT)
    assert all(s.policy.draft_len == s.drafted_tokens for s in output.steps)
    assert output.token_ids == SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=16, eos_token_id=[]).generate(PROMPT).token_ids
    fixed = SpeculativeDecoder(target, "ngram", method="sd", draft_len=3, max_new_tokens=8, eos_token_id=[])
    assert not fixed.adaptive_draft_len and all(s.drafted_tokens == 3 and s.policy is None for s in fixed.generate(PROMPT).steps)
    for method, kwargs in (("gbv-mod", {}), ("spectr", {"num_drafts": 2})):  # windows need the full L; K paths keep L
        decoder = SpeculativeDecoder(target, "ngram", method=method, **kwargs)
        assert not decoder.adaptive_draft_len and decoder.draft_len == 4


def test_cli_draft_len_is_auto_by_default():
    from verispec.cli.main import build_parser

    parse = lambda *flags: build_parser().parse_args(["generate", "hi", *flags]).draft_len  # noqa: E731
    assert parse() is None and parse("-L", "auto") is None and parse("-L", "3") == 3
    for bad in ("0", "x"):
        with pytest.raises(SystemExit):
            parse("-L", bad)


def test_token_tree_shortcut_chooses_what_growing_would():
    """propose() skips growing when the root alone must win; over a run with a cost table that makes
    some rounds root-only and others not, every tree equals the cut grow_tree makes of the whole
    offered order (probes aside)."""
    import torch

    drafter = TokenTreeDrafter(16, k=3, max_nodes=8, max_depth=4, probes=ProbeSchedule(every=1000, size=2))
    drafter.reset([1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    generator = np.random.default_rng(0)
    sizes = set()
    for step in range(60):
        cost = CostCurve(((1, 1.0), (2, 1.0 + (0.5 if step % 3 else 0.01)), (16, 3.0)), overhead=0.0)
        rate = drafter.rate.value  # the price of time this round: the drafter's running rate
        tree = drafter.propose(cost=cost)
        full = drafter.offered_tree(cost=cost)
        table = cost.table(full.num_nodes)
        gains = [1.0 + sum(full.scores[1:n]) - rated_price(table[n - 1] / table[0], rate) for n in range(1, full.num_nodes + 1)]
        keep = int(np.argmax(gains)) + 1
        assert tree.tokens == full.tokens[:keep], step
        sizes.add(tree.num_nodes)
        logits = torch.tensor(generator.normal(size=(tree.num_nodes, 16)), dtype=torch.float32)
        drafter.observe_target(tree.tokens, tree.parents, logits)
        visited = [0] + ([1] if tree.num_nodes > 1 and step % 2 else [])
        drafter.observe_walk(tree, visited)
        drafter.commit([tree.tokens[n] for n in visited[1:]], int(generator.integers(1, 6)))
    assert 1 in sizes and max(sizes) > 1  # both kinds of rounds were compared
    assert drafter.rate.value > 1.0  # and the rounds after the first priced time above plain decoding's


def test_token_tree_drafter_prices_time_at_its_past_rounds_rate():
    """Each committed round adds its tokens (accepted + 1) and its modelled cost relative to a plain
    round, cost(n) / cost(1), to the drafter's running rate; a round that scored the root alone
    (or rested) adds 1 token in 1 plain round."""
    drafter = TokenTreeDrafter(16, k=3, max_nodes=8, max_depth=4, probes=ProbeSchedule(every=1000, size=2))
    drafter.reset([1, 2, 3, 4, 1, 2, 3, 5, 1, 2])
    cost = CostCurve(((1, 1.0), (16, 1.5)), overhead=0.02)
    tokens, plain_rounds, decay = drafter.rate.tokens, drafter.rate.plain_rounds, drafter.rate.decay
    tree = drafter.propose(cost=cost)
    assert tree.num_nodes > 1
    drafter.commit([tree.tokens[1]], 9)
    assert drafter.rate.tokens == pytest.approx(decay * tokens + 2)
    assert drafter.rate.plain_rounds == pytest.approx(decay * plain_rounds + cost(tree.num_nodes) / cost(1))
    tokens, plain_rounds = drafter.rate.tokens, drafter.rate.plain_rounds
    drafter.commit([], 4)  # a resting round: nothing proposed
    assert (drafter.rate.tokens, drafter.rate.plain_rounds) == pytest.approx((decay * tokens + 1, decay * plain_rounds + 1))


def test_a_backend_prior_shapes_the_first_rounds_and_readings_still_rule():
    """A target adapter's ``cost_prior`` (llama.cpp: nearly linear) is the model's prior: before any
    reading the table follows it, so the first rounds are sized for that backend; readings move the
    estimate away from it as from the shipped prior."""
    linear = ((1, 1.0), (2, 2.0), (16, 16.0))
    model = OnlineCostModel(prior_points=linear)
    sizes = np.arange(1, 21)
    np.testing.assert_allclose(model.table(20), sizes + prior_overhead_shape(sizes))
    assert OnlineCostModel().table(16)[-1] < 2.0 < model.table(16)[-1] / 8  # the shipped prior: nearly flat
    for _ in range(9):  # this machine: 8 tokens cost what 2 do by the prior
        model.record(1, 0.01, 0.0001)
        model.record(8, 0.02, 0.0001)
    assert model.round_seconds(8) < 0.03

    target = HFModelAdapter(tiny_llama(0))
    target.cost_prior = linear  # what LlamaCppAdapter sets, on a torch adapter
    decoder = SpeculativeDecoder(target, temperature=0, max_new_tokens=4, eos_token_id=[])
    np.testing.assert_allclose(decoder.cost_model.table(20), sizes + prior_overhead_shape(sizes))
    np.testing.assert_allclose(decoder.batch_cost_model.table(20), sizes + prior_overhead_shape(sizes))


def test_a_batch_sequences_drafter_keeps_its_own_running_rate():
    """``token_tree_copy`` shares the adjacency table and the estimates (they describe the target),
    but each sequence's running rate is its own: its rounds do not price another's time."""
    from verispec.engine.batch import token_tree_copy

    drafter = TokenTreeDrafter(16, k=3, max_nodes=8, max_depth=4)
    own = token_tree_copy(drafter)
    assert own.estimates is drafter.estimates and own.rate is not drafter.rate
    own.rate.record(5, 1.0)
    assert own.rate.value > 1.0 and drafter.rate.value == 1.0

"""Resting token trees (docs/adaptive-speculation.md, "Resting"): after a run of proposals that kept
the root alone, the drafter rests and the engine decodes plain rounds without looking up candidates,
proposing again every ``wake_every``-th round; a drafted tree ends the rest. A resting round draws
the root's token as the root-only q-free walk would, so the text stays plain sampling's (greedy and
seeded), and the drafter's context stays in step with the text."""

import pytest

from tests.engine.test_acceptance_prior import PROMPT, VOCAB, confident_table
from tests.engine.tiny import tiny_llama
from verispec.draft.tree_policy import CostCurve, RestSchedule
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError

STEEP = CostCurve(((1, 1.0), (2, 3.0)), overhead=0.0)  # no node ever pays: every proposal keeps the root alone
FREE = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)


def test_the_schedule_rests_after_quiet_proposals_and_wakes_every_nth_round():
    rest = RestSchedule(after=2, wake_every=3)
    pattern = []
    for _ in range(9):
        resting = rest.rests()
        pattern.append(resting)
        if not resting:
            rest.record(drafted=False)
    # two quiet proposals, then two plain rounds and a proposal, again and again
    assert pattern == [False, False, True, True, False, True, True, False, True]
    rest.record(drafted=True)  # a tree ends the rest
    assert not rest.rests() and not rest.rests()
    never = RestSchedule(after=0)
    for _ in range(5):
        assert not never.rests()
        never.record(drafted=False)
    for bad in (dict(after=-1), dict(wake_every=0)):
        with pytest.raises(ConfigError, match="rest schedule needs"):
            RestSchedule(**bad)


def test_a_drafter_rests_only_deciding_alone_and_a_new_prompt_ends_its_rest():
    drafter = TokenTreeDrafter(VOCAB, k=2, adjacency=confident_table(), rest=RestSchedule(after=1, wake_every=4))
    drafter.reset(PROMPT)
    assert not drafter.resting()
    assert drafter.propose(cost=STEEP).num_nodes == 1
    assert drafter.resting()
    drafter.planner = lambda offered: (1, None)  # in a batch the budget sizes every round
    assert not drafter.resting()
    drafter.planner = None
    drafter.reset(PROMPT)
    assert not drafter.resting()
    assert drafter.propose(cost=FREE).num_nodes > 1  # where trees pay, no rest
    assert not drafter.resting()


@pytest.mark.parametrize("temperature, seed", [(0.0, 0), (0.8, 3), (0.8, 11)])
def test_resting_rounds_keep_plain_samplings_text_and_the_drafters_context(temperature, seed):
    target = tiny_llama(0)
    drafter = TokenTreeDrafter(VOCAB, k=3, max_nodes=8, max_depth=4, cost=STEEP, adjacency=confident_table(),
                               rest=RestSchedule(after=2, wake_every=3))
    common = dict(temperature=temperature, max_new_tokens=20, eos_token_id=[], seed=seed)
    output = SpeculativeDecoder(target, drafter, **common).generate(PROMPT)
    plain = SpeculativeDecoder(target, None, method="ar", **common).generate(PROMPT)
    assert output.token_ids == plain.token_ids
    assert drafter.index.context == list(PROMPT) + output.token_ids  # resting rounds kept the index in step
    # 20 rounds: 2 proposals, then per 3 rounds 2 resting and 1 proposal: 8 proposals in all
    proposals = 2 + sum(1 for r in range(18) if r % 3 == 2)
    assert drafter.rest.quiet == proposals
    assert all(step.tree_nodes == 1 and step.policy is not None for step in output.steps)


def test_the_decoder_rests_where_the_target_asks_llamacpp_does_and_torch_does_not():
    from verispec.models.hf import HFModelAdapter
    from verispec.models.llamacpp import LlamaCppAdapter

    target = HFModelAdapter(tiny_llama(0))
    assert SpeculativeDecoder(target).drafter.rest.after == 0  # torch: resting delayed the trees that pay
    assert LlamaCppAdapter.rest_after > 0
    target.rest_after, target.rest_wake_every = LlamaCppAdapter.rest_after, LlamaCppAdapter.rest_wake_every
    rest = SpeculativeDecoder(target).drafter.rest
    assert (rest.after, rest.wake_every) == (LlamaCppAdapter.rest_after, LlamaCppAdapter.rest_wake_every)


def test_a_deterministic_drafter_without_resting_decodes_as_before():
    """A drafter offering the token-tree interface but no ``resting`` (a duck-typed one) never rests."""

    class Wrapped:
        deterministic = True

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, name):
            if name == "resting":
                raise AttributeError(name)
            return getattr(self.inner, name)

    target = tiny_llama(0)
    inner = TokenTreeDrafter(VOCAB, k=3, max_nodes=8, max_depth=4, cost=STEEP, adjacency=confident_table(),
                             rest=RestSchedule(after=1, wake_every=2))
    common = dict(temperature=0.0, max_new_tokens=8, eos_token_id=[])
    output = SpeculativeDecoder(target, Wrapped(inner), method="qfree", **common).generate(PROMPT)
    assert output.token_ids == SpeculativeDecoder(target, None, method="ar", **common).generate(PROMPT).token_ids
    assert inner.rest.quiet == 8  # every round proposed

"""Continuous batching (``engine.continuous``): sequences join a running batch between rounds,
report every round, stop on cancel or on their round hook, and keep their solo law and text.

Exact law: the replay enumerator drives the Rng of a sequence that JOINS a batch two rounds after
two others started (float64 tiny Llama, q-free token trees and sd with the n-gram draft, each
sequence its own decoder); the law of its tokens must equal its law decoded alone (1e-12)."""

import pytest

from tests.engine.test_batch_engine import PROMPTS, VOCAB, make_decoder, tiny_target
from tests.engine.tiny import tiny_llama
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.engine.continuous import ContinuousBatch
from verispec.errors import ConfigError
from verispec.theory.enumerate import max_abs_difference


def run_all(batch: ContinuousBatch, limit: int = 200) -> list:
    ended = []
    for _ in range(limit):
        if not batch.active:
            return ended
        ended += batch.step()
    raise AssertionError("the batch did not finish")


def maker(case, model, **options):
    return lambda target: make_decoder(case, target, **options)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["qfree-token-tree", "sd"])
def test_a_sequence_joining_mid_batch_keeps_its_solo_law(case):
    model = tiny_target()

    def program(rng):
        batch = ContinuousBatch(make_decoder(case, model), max_batch=3)
        batch.add(maker(case, model), PROMPTS[0], rng=SeededRng(11))
        batch.add(maker(case, model), PROMPTS[2], rng=SeededRng(12))
        batch.step()
        batch.step()
        joined = batch.add(maker(case, model), PROMPTS[1], rng=rng)
        run_all(batch)
        assert joined.output.stop_reason == "max_new_tokens" and joined.started_at is not None
        return tuple(joined.output.token_ids)

    law = enumerate_outcomes(program, max_leaves=50_000)
    alone = enumerate_outcomes(lambda rng: tuple(make_decoder(case, model).generate(PROMPTS[1], rng=rng).token_ids),
                               max_leaves=50_000)
    assert len(law) >= 8
    assert max_abs_difference(law, alone) < 1e-12


def test_seeded_sequences_joining_at_different_rounds_give_their_solo_text():
    """q-free + seeded draws is drafter-invariant: a sequence's text is its solo text for its seed,
    whenever it joins and whatever else is in the batch (float64: no batch variance)."""
    model = tiny_target()
    batch = ContinuousBatch(make_decoder("qfree-token-tree", model), max_batch=2)
    made = []
    for round_index, (prompt, seed) in enumerate(zip(PROMPTS * 2, range(6))):
        made.append((prompt, seed, batch.add(maker("qfree-token-tree", model, seed=seed, max_new_tokens=9, top_k=0), prompt)))
        batch.step()  # one join per round: the batch is never the same twice
    run_all(batch)
    for prompt, seed, seq in made:
        alone = make_decoder("qfree-token-tree", model, seed=seed, max_new_tokens=9, top_k=0).generate(prompt)
        assert seq.output.token_ids == alone.token_ids
        assert seq.error is None and seq.stopped is None and seq.exception is None
    assert len({tuple(seq.output.token_ids) for *_, seq in made}) > 1


def test_rounds_are_reported_in_order_and_at_most_max_batch_run():
    model = tiny_target()
    batch = ContinuousBatch(make_decoder("sd", model), max_batch=2)
    seen = {i: [] for i in range(3)}
    seqs = [batch.add(maker("sd", model, max_new_tokens=8, seed=i), prompt,
                      on_round=lambda output, i=i: seen[i].append(output)) for i, prompt in enumerate(PROMPTS)]
    most = 0
    ended = []
    while batch.active:
        ended += batch.step()
        most = max(most, len(batch.running))
    assert most == 2 and batch.runner.kv.slots >= 2
    assert sorted(s.index for s in ended) == [0, 1, 2] and len(ended) == 3  # each reported once
    assert seqs[2].started_at >= min(seqs[0].finished_at, seqs[1].finished_at)  # waited for a free slot
    for i, seq in enumerate(seqs):
        lengths = [len(o.token_ids) for o in seen[i]]
        assert lengths == sorted(lengths) and lengths[-1] == 8  # growing text, one snapshot per round
        assert [o.stop_reason for o in seen[i]][:-1] == ["running"] * (len(lengths) - 1)
        assert seq.rounds == len(seen[i]) and seq.output is seen[i][-1]


def test_cancel_and_round_hook_stop_a_sequence_within_one_round_and_the_others_finish():
    model = tiny_target()
    batch = ContinuousBatch(make_decoder("ar", model), max_batch=4)
    long = maker("ar", model, max_new_tokens=50)
    cancelled = batch.add(long, PROMPTS[0])
    timed = batch.add(long, PROMPTS[1], on_round=lambda output: "time_limit" if len(output.token_ids) >= 3 else None)
    never = batch.add(long, PROMPTS[2])
    normal = batch.add(maker("ar", model, max_new_tokens=6), PROMPTS[2])
    batch.cancel(never)  # before it started: it never runs
    ended = batch.step()  # prefill round
    assert ended == [never] and never.stopped == "cancelled" and never.output is None
    batch.step()
    batch.step()
    rounds_at_cancel = cancelled.rounds
    batch.cancel(cancelled)
    ended = batch.step()
    assert cancelled in ended and cancelled.stopped == "cancelled"
    assert cancelled.rounds == rounds_at_cancel + 1 and cancelled.output.stop_reason == "running"
    run_all(batch)
    assert timed.stopped == "time_limit" and len(timed.output.token_ids) == 3
    assert normal.stopped is None and normal.output.stop_reason == "max_new_tokens"
    assert normal.output.token_ids == make_decoder("ar", model, max_new_tokens=6).generate(PROMPTS[2]).token_ids
    assert batch.runner.slots == []  # every slot freed


def test_bad_input_and_a_crashing_sequence_end_alone():
    model = tiny_llama(0, vocab_size=VOCAB, max_positions=32).double()
    batch = ContinuousBatch(make_decoder("ar", model))
    good = batch.add(maker("ar", model, max_new_tokens=5), [1, 2, 0])
    empty = batch.add(maker("ar", model), [])
    too_long = batch.add(maker("ar", model), [2] * 40)

    def bad_decoder(target):
        raise ConfigError("no such rule")

    unmade = batch.add(bad_decoder, [1, 2])
    crashing = batch.add(maker("ar", model), [1, 2], on_round=lambda output: 1 / 0)
    run_all(batch)
    assert "empty prompt" in empty.error and "context" in too_long.error and unmade.error == "no such rule"
    assert isinstance(crashing.exception, ZeroDivisionError)
    assert good.output.stop_reason == "max_new_tokens" and good.error is None
    assert good.output.token_ids == make_decoder("ar", model, max_new_tokens=5).generate([1, 2, 0]).token_ids
    # the batch keeps working after all that
    again = batch.add(maker("ar", model, max_new_tokens=5), [1, 2, 0])
    run_all(batch)
    assert again.output.token_ids == good.output.token_ids


def test_token_tree_drafter_needs_a_token_tree_decoder():
    with pytest.raises(ConfigError, match="no token-tree drafter"):
        ContinuousBatch(make_decoder("sd")).token_tree_drafter()
    drafter = ContinuousBatch(make_decoder("qfree-token-tree")).token_tree_drafter()
    assert drafter.max_nodes == 6


def test_the_batch_budget_sizes_a_continuous_batch_and_its_decision_is_in_the_stats():
    """Without a budget policy, the continuous batch (the server's) sizes every sequence's rounds by
    the batch budget, as generate_batch does: each speculative round carries the decision of the
    whole forward, a sequence drafts its share (or a probe), and its own cost model stays frozen."""
    model = tiny_target()
    batch = ContinuousBatch(make_decoder("qfree-token-tree", model), max_batch=3)
    seqs = [batch.add(maker("qfree-token-tree", model, temperature=0, max_new_tokens=10), prompt) for prompt in PROMPTS]
    run_all(batch)
    steps = [(seq, step) for seq in seqs for step in seq.output.steps]
    assert steps and all(step.policy is not None and step.policy.batch is not None for _, step in steps)
    for seq, step in steps:
        plan = step.policy.batch
        assert plan.scored_tokens == plan.fixed_tokens + sum(plan.nodes) and plan.measured_target_seconds is not None
    assert all(not seq.decoder.cost_model.learn for seq in seqs)
    assert batch.decoder.batch_cost_model.table(4) is not None

"""Batched decoding with a draft model or an EAGLE-3 head (``engine.batch``): the draft forwards of
all sequences run as one packed forward of a second ``BatchedLlamaRunner`` (a head: each sequence's
features come from the batched target forward, its steps run as one padded head call,
``models.head_batch``), and each sequence keeps its solo law.

Exact law: as tests/engine/test_batch_engine.py (replay enumerator on the middle sequence of a
batch of three, float64 tiny Llama target), with a one-layer tiny Llama draft model: the batch's
law equals the same decoder's solo law (1e-12) and the target's law (float32-row tolerance).

The law cannot see WHICH draft rows a sequence gets: every rule is exact for any draft, so a
draft flush that handed a sequence another sequence's rows would keep the law. What pins the rows
is the seeded comparison: in float64 a batched row equals its solo row, so with a fixed chain
length (``sd``, L = 2: its draws and acceptances read the draft's q) each sequence's tokens, accepted
lengths and draft calls equal its solo run; the negative control rotates the draft flush's rows
between sequences and checks that this comparison fails.
"""

import pytest
import torch

from tests.engine.test_batch_engine import PROMPTS, VOCAB, batch_law, solo_law, tiny_target, tolerance
from tests.engine.tiny import ForwardMemo, exact_target_law, tiny_llama
from verispec.core.sampling import SamplingParams
from verispec.engine.continuous import ContinuousBatch
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.models.batch_runner import BatchedLlamaRunner
from verispec.theory.enumerate import max_abs_difference

CASES = {
    "sd": dict(method="sd", draft_len=2),
    "spectr": dict(method="spectr", num_drafts=2, draft_len=1),
    "sd-adaptive-L": dict(method="sd", max_draft_len=2),  # L per round by the batch budget
}


def tiny_draft():
    return tiny_llama(5, vocab_size=VOCAB, layers=1).double()


def make_decoder(case: str, target, draft, **options) -> SpeculativeDecoder:
    settings = dict(top_k=2, max_new_tokens=3, eos_token_id=[], **CASES[case]) | options
    # no timing decides a chain length (alone or in the batch): a leaf's run is a function of its draws
    decoder = SpeculativeDecoder(target, draft, cost_model=OnlineCostModel(learn=False), **settings)
    decoder.batch_cost_model = OnlineCostModel(learn=False)
    return decoder


def assert_batch_law_is_the_solo_and_target_law(case, target, draft):
    """The exact law of the batch's second sequence equals its law decoded alone (to 1e-12) and the
    target's law (to the model's float tolerance); ``draft``: a draft model or a head."""
    law = batch_law(lambda: make_decoder(case, target, draft))
    assert len(law) >= 8
    alone = solo_law(lambda: make_decoder(case, target, draft), PROMPTS[1])
    assert max_abs_difference(law, alone) < 1e-12
    params = SamplingParams(1.0, 2, 1.0)
    memo = ForwardMemo(target)
    reference = exact_target_law(memo, PROMPTS[1], 3, params)
    assert max_abs_difference(law, reference) < tolerance(memo, PROMPTS[1], params)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_batch_law_with_a_draft_model_equals_solo_law_and_target_law(case):
    assert_batch_law_is_the_solo_and_target_law(case, tiny_target(), tiny_draft())


# prompts of 3, 9, 7 and 2 tokens; the second stops early; with max_batch 2 the third and fourth
# join when slots free up
SEEDED_PROMPTS = [PROMPTS[0], PROMPTS[2], PROMPTS[1], [2, 3]]
LIMITS = [14, 4, 12, 9]
SEEDS = [5, 6, 7, 8]


def _solo(decoder, prompt, seed, limit):
    decoder.seed, decoder.max_new_tokens = seed, limit
    return decoder.generate(prompt)


@pytest.mark.parametrize("rule", ["sd", "gumbel"])
def test_seeded_batch_with_a_draft_model_equals_each_prompt_alone(rule):
    """Token for token (float64): ``sd`` with L = 2 (its output reads the draft's rows: also its
    accepted lengths and draft calls per round) and ``gumbel`` with L chosen per round by the
    batch budget (drafter-invariant: the seed fixes the text whatever L)."""
    options = dict(method="sd", draft_len=2) if rule == "sd" else dict(method="gumbel")
    decoder = SpeculativeDecoder(tiny_target(), tiny_draft(), top_k=0, eos_token_id=[], **options)
    for max_batch in (4, 2):
        outputs = decoder.generate_batch(SEEDED_PROMPTS, seeds=SEEDS, max_new_tokens=LIMITS, max_batch=max_batch)
        assert [o.stop_reason for o in outputs] == ["max_new_tokens"] * 4
        for prompt, seed, limit, output in zip(SEEDED_PROMPTS, SEEDS, LIMITS, outputs):
            alone = _solo(decoder, prompt, seed, limit)
            assert output.token_ids == alone.token_ids
            if rule == "sd":
                assert [(s.accepted_len, s.draft_calls) for s in output.steps] == [(s.accepted_len, s.draft_calls) for s in alone.steps]
        assert len({tuple(o.token_ids) for o in outputs}) == 4
        if rule == "gumbel":  # adaptive L: every round's L was planned by the batch budget
            plans = [step.policy for output in outputs for step in output.steps]
            assert all(plan is not None and plan.batch is not None for plan in plans)
            assert len({plan.draft_len for plan in plans}) > 1


def _record_draft_flushes(monkeypatch) -> list[int]:
    """Sequences in each flush of a batched DRAFT runner (one built over a one-layer model)."""
    sizes = []
    flush = BatchedLlamaRunner.flush

    def recording(self):
        if len(self.base.layers) == 1:
            sizes.append(self.pending)
        flush(self)

    monkeypatch.setattr(BatchedLlamaRunner, "flush", recording)
    return sizes


def test_draft_forwards_of_all_sequences_run_as_one(monkeypatch):
    """The draft forwards are batched (three sequences in one flush), and every draft slot is
    freed when its sequence ends."""
    sizes = _record_draft_flushes(monkeypatch)
    decoder = SpeculativeDecoder(tiny_target(), tiny_draft(), method="sd", draft_len=3, top_k=0, eos_token_id=[],
                                 max_new_tokens=10)
    from verispec.engine.batch import BatchDecoder

    batch = BatchDecoder(decoder)
    outputs = batch.generate(PROMPTS, seeds=[1, 2, 3])
    calls = sum(step.draft_calls for output in outputs for step in output.steps)
    assert max(sizes) == 3 and len(sizes) < calls  # draft calls of several sequences share flushes
    assert batch.draft_runner is not None and batch.draft_runner.slots == [] and batch.runner.slots == []


def test_negative_control_rotated_draft_rows_are_caught(monkeypatch):
    """A draft flush that hands each sequence the rows of the next sequence (the law would not
    change) makes the seeded batch differ from the solo runs: the comparison above catches it."""
    flush = BatchedLlamaRunner.flush

    def rotated(self):
        flush(self)
        if len(self.base.layers) == 1 and len(self._results) > 1:
            slots = sorted(self._results)
            rows = [self._results[slot] for slot in slots]
            self._results = dict(zip(slots, rows[1:] + rows[:1]))

    monkeypatch.setattr(BatchedLlamaRunner, "flush", rotated)
    decoder = SpeculativeDecoder(tiny_target(), tiny_draft(), method="sd", draft_len=2, top_k=0, eos_token_id=[])
    outputs = decoder.generate_batch(SEEDED_PROMPTS[:3], seeds=SEEDS[:3], max_new_tokens=LIMITS[:3])
    differs = [output.token_ids != _solo(decoder, prompt, seed, limit).token_ids
               for prompt, seed, limit, output in zip(SEEDED_PROMPTS, SEEDS, LIMITS, outputs)]
    assert any(differs)


def test_continuous_batch_with_a_draft_model_matches_solo_and_joins_later():
    """``ContinuousBatch(..., draft=adapter)``: sequences added with ``drafts=True`` get a draft
    adapter on a batched slot; one added after two rounds joins the running batch; each decodes
    its solo tokens (gumbel, seeded)."""
    target, draft = tiny_target(), tiny_draft()
    plain = SpeculativeDecoder(target, method="ar")
    reference = SpeculativeDecoder(target, draft, method="gumbel", top_k=0, eos_token_id=[])
    batch = ContinuousBatch(plain, max_batch=4, draft=reference.drafter.adapter)

    def make(seed, limit):
        return lambda slot_target, slot_draft: SpeculativeDecoder(
            slot_target, slot_draft, method="gumbel", top_k=0, eos_token_id=[], seed=seed, max_new_tokens=limit)

    sequences = [batch.add(make(SEEDS[i], LIMITS[i]), SEEDED_PROMPTS[i], drafts=True) for i in range(2)]
    ended = batch.step() + batch.step()
    sequences.append(batch.add(make(SEEDS[2], LIMITS[2]), SEEDED_PROMPTS[2], drafts=True))
    sequences.append(batch.add(lambda slot_target: SpeculativeDecoder(slot_target, method="ar", top_k=0, eos_token_id=[],
                                                                      seed=SEEDS[3], max_new_tokens=LIMITS[3]), SEEDED_PROMPTS[3]))
    while batch.active:
        ended += batch.step()
    assert set(ended) == set(sequences) and all(seq.error is None and seq.exception is None for seq in sequences)
    for index, seq in enumerate(sequences[:3]):
        alone = _solo(reference, SEEDED_PROMPTS[index], SEEDS[index], LIMITS[index])
        assert seq.output.token_ids == alone.token_ids
    assert batch.draft_runner.slots == []
    with pytest.raises(ConfigError, match="no draft model to batch"):
        ContinuousBatch(plain).add(make(1, 3), [1, 2], drafts=True)


def test_a_draft_model_batches_in_fp32_too():
    """fp32 (the CLI's dtype on CPU besides bf16): the batch decodes and stays close to solo
    (greedy: the same tokens unless a float flip changes an argmax)."""
    torch.manual_seed(0)
    target, draft = tiny_llama(0, vocab_size=VOCAB), tiny_llama(5, vocab_size=VOCAB, layers=1)
    decoder = SpeculativeDecoder(target, draft, method="sd", draft_len=3, temperature=0, eos_token_id=[], max_new_tokens=12)
    outputs = decoder.generate_batch(PROMPTS)
    for prompt, output in zip(PROMPTS, outputs):
        assert output.token_ids == decoder.generate(prompt).token_ids


# ----- EAGLE-3 heads: the batched target forward returns each sequence's own features -------------


def tiny_headed_pair():
    """A float64 five-layer tiny Llama (a head needs >= 5 target layers) and a random head over it."""
    from tests.engine.test_head_drafter import tiny_head

    target = tiny_llama(3, vocab_size=VOCAB, layers=5)
    return target.double(), tiny_head(target, list(range(VOCAB))).double()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sd", "spectr"])
def test_batch_law_with_a_head_equals_solo_law_and_target_law(case):
    assert_batch_law_is_the_solo_and_target_law(case, *tiny_headed_pair())


def test_seeded_batch_with_a_head_equals_each_prompt_alone():
    """sd, L = 2, a head: each sequence's tokens, accepted lengths and head calls equal its solo
    run (float64), so each got its own features from the batched target forward."""
    target, head = tiny_headed_pair()
    decoder = SpeculativeDecoder(target, head, method="sd", draft_len=2, top_k=0, eos_token_id=[])
    for max_batch in (4, 2):
        outputs = decoder.generate_batch(SEEDED_PROMPTS, seeds=SEEDS, max_new_tokens=LIMITS, max_batch=max_batch)
        for prompt, seed, limit, output in zip(SEEDED_PROMPTS, SEEDS, LIMITS, outputs):
            alone = _solo(decoder, prompt, seed, limit)
            assert output.token_ids == alone.token_ids
            assert [(s.accepted_len, s.draft_calls) for s in output.steps] == [(s.accepted_len, s.draft_calls) for s in alone.steps]
        assert len({tuple(o.token_ids) for o in outputs}) == 4


def test_batched_features_are_each_sequences_own_rows():
    """The slot features of a batched forward equal the single-sequence runner's for the same
    inputs (float64), one slot capturing and one not."""
    from verispec.models.native_llama import NativeLlamaRunner

    target, _ = tiny_headed_pair()
    solo = NativeLlamaRunner(target)
    solo.feature_layers = (1, 4)
    batch = BatchedLlamaRunner(solo, initial_slots=2)
    first, second = batch.open(wait=lambda: None), batch.open()
    first.feature_layers = (1, 4)
    batch.submit(first.slot, [1, 2, 3], [0, 1, 2], None, 1, first.feature_layers)
    second.forward([3, 0, 1, 2, 0], list(range(5)), None, 1)  # flushes both
    assert second.last_features is None
    first.last_features = batch._features.pop(first.slot)
    logits = batch.take_result(first.slot)
    expected = solo.forward([1, 2, 3], [0, 1, 2], None, 1)
    assert first.last_features.shape == solo.last_features.shape == (3, 2 * target.config.hidden_size)
    assert torch.allclose(first.last_features, solo.last_features, rtol=0, atol=1e-12)
    assert torch.allclose(logits, expected, rtol=0, atol=1e-10)


def test_head_steps_of_all_sequences_run_as_one(monkeypatch):
    """The head steps are batched: three sequences' steps in one padded head call."""
    from verispec.models.head_batch import BatchedHeadSteps

    sizes = []
    flush = BatchedHeadSteps.flush
    monkeypatch.setattr(BatchedHeadSteps, "flush", lambda self: (sizes.append(self.pending), flush(self)))
    target, head = tiny_headed_pair()
    decoder = SpeculativeDecoder(target, head, method="sd", draft_len=3, top_k=0, eos_token_id=[], max_new_tokens=10)
    outputs = decoder.generate_batch(PROMPTS, seeds=[1, 2, 3])
    calls = sum(step.draft_calls for output in outputs for step in output.steps)
    assert max(sizes) == 3 and len(sizes) < calls


def test_the_batch_budget_prices_the_draft_forwards_in_the_round(monkeypatch):
    """The batched draft forwards run between the round's start and its target forward, so each
    planned round's measured overhead (and the batch cost model's overhead readings, which price
    the next rounds' chains) holds them: with every draft flush slowed by 20 ms, a round in which a
    sequence made k draft calls has at least k x 20 ms of overhead."""
    import time

    delay = 0.02
    flush = BatchedLlamaRunner.flush

    def slow(self):
        flush(self)
        if len(self.base.layers) == 1:
            time.sleep(delay)

    monkeypatch.setattr(BatchedLlamaRunner, "flush", slow)
    decoder = SpeculativeDecoder(tiny_target(), tiny_draft(), method="gumbel", max_draft_len=3, top_k=0, eos_token_id=[],
                                 max_new_tokens=8)
    outputs = decoder.generate_batch(PROMPTS, seeds=[1, 2, 3])
    drafting = [step for output in outputs for step in output.steps if step.draft_calls and step.policy.batch is not None]
    assert drafting
    for step in drafting:
        plan = step.policy.batch
        assert plan.measured_round_seconds - plan.measured_target_seconds >= delay * step.draft_calls
    readings = [seconds for bucket in decoder.batch_cost_model.overhead_readings for _, seconds in bucket]
    assert any(seconds >= delay for seconds in readings)

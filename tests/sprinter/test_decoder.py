"""SprinterDecoder on tiny random HF models (issue 5): exact laws of the production decoding loop
by replay enumeration (FPR = 0 lossless; Thm 3.1 mixture; context-only features), the target
KV cache after verifier-accepted runs, statistics, and the error paths."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.engine.tiny import exact_first_tokens_law
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter
from verispec.sprinter.decoder import HiddenStateModelDrafter, SprinterDecoder
from verispec.theory.closed_forms import sprinter_token_law
from verispec.verify.sprinter import acceptable_tokens

PROMPT = [1, 2, 3]
# The laws are exact; the reference vectors come from full float32 forwards while the decoder
# reads KV-cached ones, which differ by ~1e-7 (the negative control is off by > 1e-3).
EXACT = 2e-6


@torch.no_grad()
def full_probs(model, context, temperature=1.0) -> np.ndarray:
    logits = model(torch.tensor([list(context)])).logits[0, -1:]
    return logits_to_probs(logits, SamplingParams(temperature))[0]


class OracleVerifier:
    """Idealised verifier for tests: accepts with probability tpr when x is acceptable
    (q(x) <= p(x), p from a full target forward) and fpr otherwise; ``context_only`` ignores x."""

    def __init__(self, target, tpr, fpr, temperature=1.0, context_only=None):
        self.target, self.tpr, self.fpr, self.temperature = target, tpr, fpr, temperature
        self.context_only = context_only
        self.cache = {}

    def probs(self, context):
        key = tuple(int(t) for t in context)
        if key not in self.cache:
            self.cache[key] = full_probs(self.target, key, self.temperature)
        return self.cache[key]

    def accept_probability(self, state, token):
        if self.context_only is not None:
            return self.context_only
        ok = acceptable_tokens(self.probs(state.context), state.draft_probs)[token]
        return self.tpr if ok else self.fpr


class ConstantVerifier:
    def __init__(self, prob):
        self.prob = prob

    def accept_probability(self, state, token):
        return self.prob


def decoding_law(decoder, num_tokens):
    return enumerate_outcomes(lambda rng: tuple(decoder.generate(PROMPT, rng=rng).token_ids[:num_tokens]))


def max_diff(law, reference):
    return max(abs(law.get(k, 0.0) - reference.get(k, 0.0)) for k in set(law) | set(reference))


# ----- exactness of the decoding loop ------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    "draft_kind, tpr, max_run",
    [("model", 0.7, 2), ("model", 1.0, 1), ("ngram", 0.6, 3)],
)
def test_zero_fpr_verifier_makes_the_decoder_lossless(pair, draft_kind, tpr, max_run):
    target, draft_model = pair
    draft = draft_model if draft_kind == "model" else "ngram"
    verifier = OracleVerifier(target, tpr, 0.0)
    decoder = SprinterDecoder(target, draft, verifier, max_run=max_run, max_new_tokens=2)
    law = decoding_law(decoder, 2)
    assert max_diff(law, exact_first_tokens_law(target, PROMPT, 2)) < EXACT


@pytest.mark.parametrize("tpr, fpr", [(0.8, 0.3), (1.0, 0.5), (0.4, 1.0)])
def test_decoder_token_law_is_the_fpr_mixture(pair, tpr, fpr):
    """Thm 3.1 through the engine: P_S = (1 - beta) p + beta q at the prompt, exactly."""
    target, draft_model = pair
    decoder = SprinterDecoder(target, draft_model, OracleVerifier(target, tpr, fpr), max_new_tokens=1)
    law = decoding_law(decoder, 1)
    measured = np.array([law.get((x,), 0.0) for x in range(6)])
    p, q = full_probs(target, PROMPT), full_probs(draft_model, PROMPT)
    assert np.abs(measured - sprinter_token_law(p, q, fpr)).max() < EXACT


def test_decoder_with_context_only_verifier_gives_the_s_mixture(pair):
    target, draft_model = pair
    s = 0.45
    decoder = SprinterDecoder(target, draft_model, OracleVerifier(target, 0, 0, context_only=s), max_new_tokens=1)
    law = decoding_law(decoder, 1)
    measured = np.array([law.get((x,), 0.0) for x in range(6)])
    p, q = full_probs(target, PROMPT), full_probs(draft_model, PROMPT)
    assert np.abs(measured - ((1 - s) * p + s * q)).max() < EXACT


def test_positive_fpr_decoder_is_not_lossless(pair):
    """Negative control (§14.2): with FPR > 0 the first token's law is off the target's."""
    target, draft_model = pair
    decoder = SprinterDecoder(target, draft_model, OracleVerifier(target, 0.8, 0.5), max_new_tokens=1)
    law = decoding_law(decoder, 1)
    assert max_diff(law, exact_first_tokens_law(target, PROMPT, 1)) > 1e-3


# ----- KV cache and statistics ---------------------------------------------------------------------
@pytest.mark.parametrize("draft_kind", ["model", "ngram"])
def test_target_cache_holds_every_verifier_accepted_token(pair, draft_kind):
    target, draft_model = pair
    draft = draft_model if draft_kind == "model" else "ngram"
    decoder = SprinterDecoder(target, draft, ConstantVerifier(1.0), max_run=3, max_new_tokens=9)
    output = decoder.generate(PROMPT)
    # rounds: 3 verifier-accepted tokens + 1 bonus per target call; the 9th token ends the run early
    assert output.new_tokens == 9 and output.target_calls == 2
    assert output.tokens_per_target_call == pytest.approx(4.5)
    assert [s.capped for s in output.steps] == [True, True, False]
    committed = decoder.target.tokens()
    assert committed == PROMPT + output.token_ids[:8]
    cached = decoder.target.score([-1], [-1])[0]
    with torch.no_grad():
        full = target(torch.tensor([committed])).logits[0, -1]
    assert torch.allclose(cached, full, atol=1e-4)


def test_never_accepting_verifier_calls_the_target_for_every_token(pair):
    target, draft_model = pair
    decoder = SprinterDecoder(target, draft_model, ConstantVerifier(0.0), max_new_tokens=5)
    output = decoder.generate(PROMPT)
    assert output.new_tokens == 5 and output.target_calls == 5
    assert output.verifier_summary()["verifier_accept_rate"] == 0.0
    record = output.to_dict()
    json.dumps(record)
    assert record["tokens_per_target_call"] == pytest.approx(1.0)
    assert record["flops"]["target"] > 0 and record["flops"]["draft"] > 0


def test_hidden_state_tap_reads_the_last_hidden_state(pair):
    _, draft_model = pair
    drafter = HiddenStateModelDrafter(HFModelAdapter(draft_model), SamplingParams())
    drafter.reset(PROMPT)
    draft_fn = drafter.begin_round()
    draft_fn(())
    draft_fn((4,))
    with torch.no_grad():
        for prefix in [(), (4,)]:
            hidden = draft_model.model(torch.tensor([PROMPT + list(prefix)])).last_hidden_state[0, -1]
            assert np.allclose(drafter.hidden[prefix], hidden.numpy(), atol=1e-5)


# ----- errors --------------------------------------------------------------------------------------
@pytest.mark.parametrize("eta", [0.0, 1.0, 2.0])
def test_eta_outside_unit_interval_is_refused(pair, eta):
    target, draft_model = pair
    with pytest.raises(ConfigError, match="eta"):
        SprinterDecoder(target, draft_model, ConstantVerifier(0.5), eta=eta)


def test_missing_verifier_and_bad_max_run_are_refused(pair):
    target, draft_model = pair
    with pytest.raises(ConfigError, match="verifier"):
        SprinterDecoder(target, draft_model, None)
    with pytest.raises(ConfigError, match="max_run"):
        SprinterDecoder(target, draft_model, ConstantVerifier(0.5), max_run=0)


def test_seeded_runs_are_reproducible(pair):
    target, draft_model = pair
    decoder = SprinterDecoder(target, draft_model, OracleVerifier(target, 0.8, 0.2), max_new_tokens=6, seed=7)
    first = decoder.generate(PROMPT).token_ids
    assert decoder.generate(PROMPT).token_ids == first
    assert decoder.generate(PROMPT, rng=SeededRng(7)).token_ids == first

"""Adaptive draft length keeps chain rules exact: the engine's exact law of the first tokens
(replay enumeration, tests/engine/test_engine_exact_law.py) with L chosen every round from past
acceptance equals the target's. The cost table is fixed (``FixedCosts``) so that the choice is a
function of past acceptance alone and the replays are deterministic; a spy checks that the policy
really changed L across rounds (0 after a rejection, 2 after an acceptance), else the test would
be that of a fixed L."""

from unittest import mock

import numpy as np
import torch
import pytest

from tests.engine.test_engine_exact_law import engine_error, tolerance
from verispec.engine.decoder import SpeculativeDecoder


class FixedCosts:
    """A cost table of rounds scoring 1, 2, 3 tokens (1, 1.45, 1.6): with the policy's prior
    acceptance 0.6 the first round drafts L = 2; after tau = 0 the estimate drops to 0.4 and no L
    pays (plain rounds); after tau >= 1 L = 2 pays again. Records the sizes the policy chose."""

    def __init__(self):
        self.chosen: set[int] = set()

    def table(self, n_max):
        return np.array([1.0, 1.45, 1.6][:n_max])

    def round_seconds(self, scored_tokens):
        self.chosen.add(int(scored_tokens))
        return float(self.table(scored_tokens)[-1])

    def record(self, *args):
        pass


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sd", "bv"])
def test_adaptive_draft_length_keeps_chain_rules_exact(method):
    costs = FixedCosts()
    case = dict(method=method, draft_len=None, max_draft_len=2, top_k=2, cost_model=costs)
    error, rounds = engine_error(case)
    assert costs.chosen == {1, 3}  # plain rounds (L = 0) and L = 2, chosen from past rounds
    assert rounds >= 3
    assert error < tolerance(case)


@pytest.mark.slow
def test_a_policy_that_reads_the_current_draws_is_caught():
    """Negative control: a 'policy' that looks at this round's drafted token and, when it is not
    the draft's most likely one, drafts again (a size/draft decision made from the current draw
    rather than the past) makes SD lossy, and the same enumeration sees it."""
    original = SpeculativeDecoder._draft

    def redraft_unlikely(self, rng, draft_fn, draft_len, tree):
        skeleton = original(self, rng, draft_fn, draft_len, tree)
        root_q = draft_fn(())
        if root_q[skeleton.tokens[1]] < root_q.max():
            skeleton = original(self, rng, draft_fn, draft_len, tree)
        return skeleton

    case = dict(method="sd", draft_len=1, top_k=2, num_tokens=2)  # small: the redraws multiply the replays
    with mock.patch.object(SpeculativeDecoder, "_draft", redraft_unlikely):
        error, _ = engine_error(case)
    assert error > 1e3 * tolerance(case)


def _fresh_row(kind, draft, sequence):
    """The draft's q(. | sequence) computed from scratch (greedy-processed at temperature 1)."""
    from tests.engine.test_head_drafter import recompute_row
    from verispec.core.sampling import SamplingParams, logits_to_probs

    params = SamplingParams(1.0, 0, 1.0)
    if kind == "head":
        target, head = draft
        return recompute_row(head, target, list(sequence), [], params)
    with torch.no_grad():
        return logits_to_probs(draft(torch.tensor([list(sequence)])).logits[0, -1:], params)[0]


NEW_TOKENS = 100


@pytest.mark.parametrize("kind", ["ngram", "model", "head"])
def test_drafters_stay_in_sync_across_plain_rounds(kind):
    """L = 0 rounds (the policy's plain rounds) tell the drafter the emitted token: after a run that
    mixes them with L = 2 rounds, the drafter holds the emitted sequence and its next q equals a
    from-scratch computation over it, and the greedy text is plain decoding's. 100 tokens: with these
    costs a probe (L = 2 after a run of plain rounds) costs 0.6 plain rounds, so probes come ~60
    plain rounds apart (at most 1% of plain decoding's time)."""
    from tests.engine.test_head_drafter import pair
    from tests.engine.tiny import tiny_llama

    target, head = pair()
    draft = {"ngram": "ngram", "model": tiny_llama(5, vocab_size=8, layers=1), "head": head}[kind]
    prompt = [1, 5, 2, 7, 3, 0]
    costs = FixedCosts()
    decoder = SpeculativeDecoder(
        target, draft, method="sd", max_draft_len=2, temperature=0, draft_temperature=1.0, max_new_tokens=NEW_TOKENS,
        eos_token_id=[], cost_model=costs,
    )
    output = decoder.generate(prompt)
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=NEW_TOKENS, eos_token_id=[]).generate(prompt)
    assert output.token_ids == plain.token_ids
    lengths = [step.policy.draft_len for step in output.steps]
    assert any(a == 0 and b > 0 for a, b in zip(lengths, lengths[1:]))  # drafting resumed after a plain round
    # the drafter's committed sequence: the emitted tokens, plus those the max_new_tokens cut dropped
    committed = {"ngram": lambda d: d.model.context.tolist(), "model": lambda d: d.adapter.tokens(), "head": lambda d: d._tokens}
    sequence = [int(t) for t in committed[kind](decoder.drafter)]
    assert sequence[: len(prompt) + NEW_TOKENS] == prompt + output.token_ids
    if kind != "ngram":
        row = decoder.drafter.begin_round()(())
        np.testing.assert_allclose(row, _fresh_row(kind, (target, head) if kind == "head" else draft, sequence), atol=1e-4)

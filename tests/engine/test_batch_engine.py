"""Batched decoding (``engine.batch``): each sequence of a batch has the law it has decoded alone.

Exact law: the replay enumerator (``core.rng.enumerate_outcomes``) drives the Rng of the MIDDLE
sequence of a batch of three (the others with fixed seeds, prompts of 3, 7 and 9 tokens) on a tiny
float64 Llama target, once per leaf of its choice tree; the law of its first tokens must equal
(a) the law of the same decoder on the same prompt decoded alone, enumerated the same way (in
float64 the batched rows equal the solo rows: tests/models/test_batch_runner.py; asserted 1e-12),
and (b) the target's own law by every prefix (within ``tolerance``: the rows are float32
logits, as in test_engine_exact_law). One case per rule family: plain (ar), one sampled chain
(sd), several i.i.d. paths (spectr), target modification windows carried between rounds
(gbv-mod), a chain whose L the batch budget chooses each round (sd, adaptive L), the default
token trees + q-free (its trees read an adjacency table shared with the other sequences, sized by
the batch budget at its prior). The sampled drafts are the n-gram draft (the batched drafts).

Greedy on the real default target (slow): the batch gives each prompt's solo tokens, fp32.
"""

import numpy as np
import pytest
import torch

from tests.engine.tiny import ForwardMemo, exact_target_law, tiny_llama
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.rows import LogitRows
from verispec.core.sampling import SamplingParams
from verispec.draft.tree_policy import CostCurve
from verispec.engine.batch import BatchDecoder
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.theory.enumerate import max_abs_difference

VOCAB = 4
PROMPTS = [[1, 2, 0], [3, 1, 2, 0, 3, 1, 2], [0, 1, 2, 3, 0, 1, 2, 3, 0]]
NUM_TOKENS = 3
CASES = {
    "ar": dict(method="ar"),
    "sd": dict(draft="ngram", method="sd", draft_len=2),
    "spectr": dict(draft="ngram", method="spectr", num_drafts=2, draft_len=1),
    "gbv-mod": dict(draft="ngram", method="gbv-mod", draft_len=2),
    "sd-adaptive-L": dict(draft="ngram", method="sd", max_draft_len=2),  # L per round by the batch budget
    "qfree-token-tree": dict(),  # made with a fixed cost curve: see make_decoder
}
# every candidate pays (trees of several nodes) and no timing decides a tree: a leaf's run is a
# function of its random choices alone, as the replay enumerator needs
FREE_TREES = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)


def tiny_target():
    return tiny_llama(0, vocab_size=VOCAB).double()


def make_decoder(case: str, model=None, **options) -> SpeculativeDecoder:
    """A fresh decoder (the token-tree drafter's adjacency table and estimates start empty)."""
    settings = dict(top_k=2, max_new_tokens=NUM_TOKENS, eos_token_id=[], **CASES[case]) | options
    if case == "qfree-token-tree":
        settings["draft"] = TokenTreeDrafter(VOCAB, k=2, max_nodes=6, max_depth=3, cost=FREE_TREES)
    decoder = SpeculativeDecoder(model if model is not None else tiny_target(), **settings)
    # the batch budget at its prior (no timing decides a batched tree either)
    decoder.batch_cost_model = OnlineCostModel(learn=False)
    return decoder


def batch_law(make, middle: int = 1) -> dict:
    """Law of the middle sequence's tokens; ``make()`` gives a fresh decoder per run."""
    def program(rng):
        rngs = [SeededRng(11), rng, SeededRng(12)]
        outputs = make().generate_batch(PROMPTS, rngs=rngs)
        assert [o.stop_reason for o in outputs] == ["max_new_tokens"] * 3
        return tuple(outputs[middle].token_ids)

    return enumerate_outcomes(program, max_leaves=50_000)


def solo_law(make, prompt) -> dict:
    return enumerate_outcomes(lambda rng: tuple(make().generate(prompt, rng=rng).token_ids), max_leaves=50_000)


def tolerance(memo, prompt, params) -> float:
    """4 N δ with δ the largest |Σ p - 1| of the reference's float32-summed rows (as test_engine_exact_law)."""
    law = exact_target_law(memo, prompt, NUM_TOKENS, params)
    prefixes = {seq[:depth] for seq in law for depth in range(NUM_TOKENS)}
    delta = max(abs(LogitRows(memo(tuple(prompt) + p)[None], params).dense()[0].sum() - 1.0) for p in prefixes)
    return 4 * NUM_TOKENS * max(delta, 1e-16)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_batch_law_equals_solo_law_and_target_law(case):
    model = tiny_target()
    law = batch_law(lambda: make_decoder(case, model))
    assert len(law) >= 8  # a real distribution over many sequences, not a point mass
    alone = solo_law(lambda: make_decoder(case, model), PROMPTS[1])
    assert max_abs_difference(law, alone) < 1e-12
    params = SamplingParams(1.0, 2, 1.0)
    memo = ForwardMemo(model)
    reference = exact_target_law(memo, PROMPTS[1], NUM_TOKENS, params)
    assert max_abs_difference(law, reference) < tolerance(memo, PROMPTS[1], params)


def test_the_batch_budget_sizes_trees_and_chains_and_its_decision_is_in_the_stats():
    """Every speculative round of a batch carries the budget's decision for the whole forward;
    each sequence drafts the share it was given (or a probe), and the sizes vary."""
    for case in ("qfree-token-tree", "sd-adaptive-L"):
        decoder = make_decoder(case, temperature=0, max_new_tokens=10)
        outputs = decoder.generate_batch(PROMPTS)
        decisions = [(index, step) for index, output in enumerate(outputs) for step in output.steps]
        assert decisions and all(step.policy is not None and step.policy.batch is not None for _, step in decisions)
        for index, step in decisions:
            plan = step.policy.batch
            assert plan.batch_size == len(plan.nodes) and plan.scored_tokens == plan.fixed_tokens + sum(plan.nodes)
            assert plan.measured_target_seconds is not None and plan.predicted_seconds > 0
            assert step.policy.time_price is None  # the budget prices a batch's time itself
            if not step.policy.probe and plan.batch_size == 3:  # all three planned together: its own share
                assert step.tree_nodes == plan.nodes[index]
        assert len({step.tree_nodes for _, step in decisions}) > 1
        record = outputs[0].to_dict()["steps"][0]["policy"]["batch"]
        assert set(record) >= {"batch_size", "nodes", "scored_tokens", "expected_tokens", "predicted_seconds"}


def test_the_batch_refreshes_the_shared_adjacency_table_once_per_forward(monkeypatch):
    """Every scored row of every sequence reaches the shared table through one ``update_rows`` per
    batched forward (none through the per-sequence ``update``), and the drafters refresh their own
    table again once the batch is over."""
    from verispec.models.token_tree import AdjacencyTable

    calls = []
    batched_update = AdjacencyTable.update_rows
    monkeypatch.setattr(AdjacencyTable, "update", lambda *args: calls.append("update"))
    monkeypatch.setattr(AdjacencyTable, "update_rows", lambda self, tokens, logits, rows: (
        calls.append(len(rows)), batched_update(self, tokens, logits, rows)))
    decoder = make_decoder("qfree-token-tree", temperature=0, max_new_tokens=10)
    outputs = decoder.generate_batch(PROMPTS)
    assert "update" not in calls
    assert sum(calls) == sum(step.tree_nodes for output in outputs for step in output.steps)
    assert len(calls) < sum(len(output.steps) for output in outputs)  # sequences' rows together
    assert (decoder.drafter.adjacency.next_tokens >= 0).any()


def test_a_batch_of_one_is_the_single_sequence_path():
    """One prompt: the decoder's own adapter and cost model, the same tokens and sizes as generate."""
    model = tiny_target()
    alone = make_decoder("qfree-token-tree", model, temperature=0, max_new_tokens=10).generate(PROMPTS[1])
    decoder = make_decoder("qfree-token-tree", model, temperature=0, max_new_tokens=10)
    batched = decoder.generate_batch([PROMPTS[1]])[0]
    assert batched.token_ids == alone.token_ids
    assert [s.tree_nodes for s in batched.steps] == [s.tree_nodes for s in alone.steps]
    assert all(s.policy.batch is None for s in batched.steps)


@pytest.mark.slow
def test_a_lossy_rule_is_caught_by_the_batch_law():
    """Negative control: the test's comparison with the target's law detects a lossy rule
    (GBV-mod without its modification) decoded in a batch."""
    from verispec.verify.registry import get_method

    model = tiny_target()
    decoder = make_decoder("gbv-mod", model)
    decoder.spec = get_method("gbv-mod-nomod", allow_controls=True)
    law = batch_law(lambda: decoder)
    params = SamplingParams(1.0, 2, 1.0)
    memo = ForwardMemo(model)
    reference = exact_target_law(memo, PROMPTS[1], NUM_TOKENS, params)
    assert max_abs_difference(law, reference) > 1e3 * tolerance(memo, PROMPTS[1], params)


def test_seeded_batch_repeats_and_matches_solo_with_the_ngram_draft():
    """Same seeds, same texts on every run; with the n-gram draft (nothing shared between
    sequences) each sequence's sampled tokens equal its solo tokens for the same seed."""
    decoder = make_decoder("sd", top_k=0, max_new_tokens=12)
    first = decoder.generate_batch(PROMPTS, seeds=[5, 6, 7])
    second = decoder.generate_batch(PROMPTS, seeds=[5, 6, 7])
    assert [o.token_ids for o in first] == [o.token_ids for o in second]
    for seed, prompt, output in zip([5, 6, 7], PROMPTS, first):
        decoder.seed = seed
        assert decoder.generate(prompt).token_ids == output.token_ids
    assert len({tuple(o.token_ids) for o in first}) > 1


def test_bad_sequences_fail_alone_and_the_others_finish():
    """An empty prompt, ids outside the vocabulary and a prompt at the context limit each end
    their own sequence; a long one stops at the context; the rest decode as they would alone."""
    model = tiny_llama(0, vocab_size=VOCAB, max_positions=32).double()
    decoder = make_decoder("qfree-token-tree", model, temperature=0, max_new_tokens=8)
    prompts = [[1, 2, 0], [], [1, 9], [2] * 32, [3] * 28, [0, 1, 2, 3, 0, 1]]
    one_at_a_time = decoder.generate_batch(prompts, max_new_tokens=[8, 8, 8, 8, 20, 8], max_batch=1)
    outputs = decoder.generate_batch(prompts, max_new_tokens=[8, 8, 8, 8, 20, 8], max_batch=3)
    reasons = [o.stop_reason for o in outputs]
    assert [(o.stop_reason, o.error) for o in one_at_a_time] == [(o.stop_reason, o.error) for o in outputs]
    assert reasons == ["max_new_tokens", "error", "error", "error", "context", "max_new_tokens"]
    assert "empty prompt" in outputs[1].error
    assert "[0, 4)" in outputs[2].error
    assert "does not fit the model's context" in outputs[3].error
    for index in (0, 4, 5):
        assert outputs[index].error is None
        decoder.max_new_tokens = 20 if index == 4 else 8
        alone = decoder.generate(prompts[index])
        assert (outputs[index].token_ids, outputs[index].stop_reason) == (alone.token_ids, alone.stop_reason)
    assert len(prompts[4]) + len(outputs[4].token_ids) == 33  # the last token is emitted, never scored


def test_budget_policy_limits_tree_nodes():
    """A budget of 0 nodes makes every token-tree round plain (one scored node, the root); the
    greedy output is unchanged."""
    decoder = make_decoder("qfree-token-tree", temperature=0, max_new_tokens=10)
    seen = []

    def no_speculation(sequences):
        seen.append([s.index for s in sequences])
        return [0] * len(sequences)

    budgeted = decoder.generate_batch(PROMPTS, budget=no_speculation)
    free = decoder.generate_batch(PROMPTS)
    assert seen and seen[0] == [0, 1, 2]
    assert all(step.tree_nodes == 1 for output in budgeted for step in output.steps)
    assert any(step.tree_nodes > 1 for output in free for step in output.steps)
    assert [o.token_ids for o in budgeted] == [o.token_ids for o in free]
    with pytest.raises(ConfigError, match="integer >= 0"):
        decoder.generate_batch(PROMPTS, budget=lambda s: [-1] * len(s))


def test_bad_batch_arguments_are_clear_errors():
    decoder = make_decoder("sd")
    with pytest.raises(ConfigError, match="list of prompts"):
        decoder.generate_batch("hello")
    with pytest.raises(ConfigError, match="3 entries for 2 prompts"):
        decoder.generate_batch(PROMPTS[:2], seeds=[1, 2, 3])
    with pytest.raises(ConfigError, match="max_new_tokens must be"):
        decoder.generate_batch(PROMPTS, max_new_tokens=0)
    with pytest.raises(ConfigError, match="max_batch"):
        decoder.generate_batch(PROMPTS, max_batch=0)
    with pytest.raises(ConfigError, match="token-tree draft only"):
        decoder.generate_batch(PROMPTS, budget=lambda s: [None] * len(s))
    from verispec.engine.drafters import NGramDrafter
    from verispec.models.hf import HFModelAdapter

    class OwnDrafter:  # a drafter of the user's own: the batch cannot copy it per sequence
        def __init__(self):
            self.inner = NGramDrafter(VOCAB, SamplingParams(1.0, 0, 1.0))
            self.vocab_size, self.calls = VOCAB, 0
            self.reset, self.begin_round, self.commit = self.inner.reset, self.inner.begin_round, self.inner.commit

    model = tiny_target()
    own = SpeculativeDecoder(model, OwnDrafter(), method="sd")
    with pytest.raises(ConfigError, match="the OwnDrafter draft cannot batch"):
        own.generate_batch(PROMPTS)
    model = tiny_target()
    transformers_draft = HFModelAdapter(tiny_llama(5, vocab_size=VOCAB, layers=1).double(), backend="transformers")
    with pytest.raises(ConfigError, match="batched draft model runs on the native Llama runner; this draft runs on TransformersRunner"):
        SpeculativeDecoder(model, transformers_draft, method="sd").generate_batch(PROMPTS)
    transformers_target = SpeculativeDecoder(model, method="ar", backend="transformers")
    with pytest.raises(ConfigError, match="transformers forward cannot batch"):
        BatchDecoder(transformers_target)


GREEDY_TEXTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three colours of the rainbow.",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
    "Explain in one sentence what a hash table is.",
]


@pytest.mark.slow
@pytest.mark.parametrize("config", ["default", "ar", "sd-ngram"])
def test_greedy_batch_equals_solo_on_the_default_target(config):
    from verispec.models.default import encode_prompt, load_default_target

    torch.manual_seed(0)
    model, tokenizer = load_default_target(torch.float32)
    options = {"default": {}, "ar": dict(method="ar"), "sd-ngram": dict(draft="ngram", method="sd", draft_len=4)}[config]
    decoder = SpeculativeDecoder(model, temperature=0, max_new_tokens=24, eos_token_id=[], **options)
    prompts = [encode_prompt(tokenizer, text) for text in GREEDY_TEXTS]
    batched = decoder.generate_batch(prompts)
    for ids, output in zip(prompts, batched):
        assert output.token_ids == decoder.generate(ids).token_ids
    assert np.mean([o.block_efficiency for o in batched]) >= (1.0 if config == "ar" else 1.2)

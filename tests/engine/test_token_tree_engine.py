"""The token-tree draft through the engine (issue 12): the law of the generated tokens is the
target's at temperature 0.8 (Pearson chi-square on a tiny random Llama, with trees that really
branch), greedy output equals plain decoding on the real default target, and the configuration
errors and defaults."""

import numpy as np
import pytest
import torch

from tests.engine.test_engine_exactness import FALSE_ALARM, chi_square_pvalue
from tests.engine.tiny import exact_first_tokens_law, first_tokens_counts, tiny_llama
from verispec.draft.tree_policy import CostCurve
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import NGramDrafter, TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.token_tree import AdjacencyTable

PROMPT = [1, 2, 3, 4, 1, 2, 3]  # a repeat, so the suffix index offers copies from the start
NUM_TOKENS = 3
SAMPLES = 1500
TEMPERATURE = 0.8
FREE_TREES = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)  # every candidate pays: big trees


@pytest.fixture(scope="module")
def target():
    return tiny_llama(0)


def _warm_table(model, vocab=6) -> AdjacencyTable:
    """The adjacency table after the target has scored every token once (in context [t])."""
    table = AdjacencyTable(vocab, k=3)
    with torch.no_grad():
        for token in range(vocab):
            table.update([token], model(torch.tensor([[token]])).logits[0, -1:])
    return table


@pytest.mark.slow
def test_token_trees_sample_the_target_law_at_temperature_0_8(target):
    law = exact_first_tokens_law(target, PROMPT, NUM_TOKENS, temperature=TEMPERATURE)
    drafter = TokenTreeDrafter(6, k=3, max_nodes=12, max_depth=4, cost=FREE_TREES, adjacency=_warm_table(target))
    decoder = SpeculativeDecoder(target, drafter, temperature=TEMPERATURE, max_new_tokens=NUM_TOKENS, eos_token_id=[])
    assert decoder.method == "qfree"
    counts: dict = {}
    nodes, branching, accepted = [], 0, 0
    for seed in range(SAMPLES):
        decoder.seed = seed
        output = decoder.generate(PROMPT)
        key = tuple(output.token_ids[:NUM_TOKENS])
        counts[key] = counts.get(key, 0) + 1
        nodes.append(output.steps[0].tree_nodes)
        accepted += sum(step.accepted_len for step in output.steps)
    # the test is not vacuous: the first round's tree is a real, branching tree and drafts are accepted
    assert np.mean(nodes) > 6 and accepted > SAMPLES
    assert chi_square_pvalue(counts, law, SAMPLES) > FALSE_ALARM


@pytest.mark.slow
def test_token_trees_detect_a_biased_sampler(target):
    """Power check of the same test: sampling at the wrong temperature (2.0 instead of 0.8) is rejected."""
    law = exact_first_tokens_law(target, PROMPT, NUM_TOKENS, temperature=TEMPERATURE)
    decoder = SpeculativeDecoder(target, "tree", temperature=2.0, max_new_tokens=NUM_TOKENS, eos_token_id=[])
    decoder.drafter.cost = FREE_TREES
    counts = first_tokens_counts(decoder, PROMPT, NUM_TOKENS, SAMPLES)
    assert chi_square_pvalue(counts, law, SAMPLES) < FALSE_ALARM


def test_defaults_pick_token_trees_and_qfree(target):
    decoder = SpeculativeDecoder(target)
    assert decoder.method == "qfree" and isinstance(decoder.drafter, TokenTreeDrafter)
    neural = SpeculativeDecoder(target, tiny_llama(5, layers=1))
    assert neural.method == "gumbel"  # the drafter-invariant chain rule (was "sd")
    explicit = SpeculativeDecoder(target, method="sd")  # an explicit q-based rule keeps the n-gram draft
    assert isinstance(explicit.drafter, NGramDrafter)
    ngram_tree = SpeculativeDecoder(target, "ngram", method="qfree", tree=[2, 1], temperature=0.8, max_new_tokens=4)
    assert len(ngram_tree.generate(PROMPT).token_ids) == 4


@pytest.mark.parametrize("method", ["sd", "bv", "spectr", "rrsw", "traversal", "spechub"])
def test_q_based_rules_refuse_the_token_tree_draft(target, method):
    with pytest.raises(ConfigError, match="chosen deterministically.*use method 'qfree'"):
        SpeculativeDecoder(target, "tree", method=method, num_drafts=1 if method in ("sd", "bv") else 2)


def test_qfree_with_a_sampled_draft_needs_a_shape(target):
    with pytest.raises(ConfigError, match="needs a tree shape"):  # refused at construction, before any round
        SpeculativeDecoder(target, "ngram", method="qfree")
    assert SpeculativeDecoder(target, "ngram", method="qfree", tree=[2, 1], max_new_tokens=4).generate(PROMPT).new_tokens == 4
    with pytest.raises(ConfigError, match="sizes its trees itself"):
        SpeculativeDecoder(target, "tree", tree=[2, 2])


def test_nothing_to_draft_means_plain_rounds(target):
    """With no copy match and an empty adjacency table the tree is the root alone."""
    decoder = SpeculativeDecoder(target, "tree", temperature=0, max_new_tokens=1, eos_token_id=[])
    decoder.drafter.cost = CostCurve()
    output = decoder.generate([5])
    assert output.steps[0].tree_nodes == 1


@pytest.mark.slow
def test_greedy_token_trees_reproduce_plain_decoding_on_the_default_target():
    from verispec.models.default import encode_prompt, load_default_target

    model, tokenizer = load_default_target(torch.float32)
    prompts = [
        "Write a Python function that returns the n-th Fibonacci number.",
        "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
        "Repeat after me: the quick brown fox jumps over the lazy dog, the quick brown fox.",
    ]
    plain = SpeculativeDecoder(model, None, method="ar", temperature=0, max_new_tokens=40, eos_token_id=[])
    trees = SpeculativeDecoder(model, temperature=0, max_new_tokens=40, eos_token_id=[])
    trees.drafter.cost = CostCurve()  # the shipped curve: trees of several nodes, independent of the machine's load
    calls = tokens = 0
    for text in prompts:
        ids = encode_prompt(tokenizer, text)
        output = trees.generate(ids)
        assert output.token_ids == plain.generate(ids).token_ids
        calls, tokens = calls + output.target_calls, tokens + output.new_tokens
    assert tokens / calls > 1.2  # drafts were accepted: the equality is not that of plain decoding with itself

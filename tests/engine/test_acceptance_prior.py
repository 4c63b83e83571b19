"""The token trees' backend-aware acceptance prior and the shadow trials of root-only rounds
(docs/adaptive-speculation.md, "Acceptance prior"): a llama.cpp adapter brings a pessimistic prior,
so a fresh decoder's first round is the root alone where its cost curve is nearly linear, while a
torch target's first round is a tree; root-only rounds still count as trials of their root
candidates (the q-free walk's draw at the root is the same whatever the children), so the
estimates learn without speculating; and the law of the generated tokens stays the target's when
trees grow from that evidence (chi-square at temperature 0.8)."""

import copy

import pytest
import torch

from tests.engine.test_engine_exactness import FALSE_ALARM, chi_square_pvalue
from tests.engine.test_token_tree_engine import _warm_table
from tests.engine.tiny import exact_first_tokens_law, tiny_llama
from verispec.draft.tree_policy import AcceptanceEstimates, CostCurve
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter
from verispec.models.llamacpp import LlamaCppAdapter
from verispec.models.token_tree import AdjacencyTable

VOCAB = 6
PROMPT = [1, 2, 3, 4, 1, 2, 3]  # a repeat: the suffix index offers the copy 4 at once
FREE_TREES = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)


def confident_table(vocab: int = VOCAB) -> AdjacencyTable:
    """Every token's recorded next token is token + 1 at probability ~0.99 (top adjacency bucket)."""
    table = AdjacencyTable(vocab, k=2)
    logits = torch.full((vocab, vocab), -10.0)
    for token in range(vocab):
        logits[token, (token + 1) % vocab] = 10.0
    table.update(list(range(vocab)), logits)
    return table


def first_round_nodes(cost, prior_scale: float, prompt=PROMPT) -> int:
    drafter = TokenTreeDrafter(VOCAB, k=2, adjacency=confident_table(), prior_scale=prior_scale)
    drafter.reset(prompt)
    return drafter.propose(cost=cost).num_nodes


def test_estimates_scale_their_prior():
    optimistic, pessimistic = AcceptanceEstimates(), AcceptanceEstimates(prior_scale=0.0)
    cls = ("adj", 7, 0)
    shipped = AcceptanceEstimates.prior(cls)
    assert optimistic.rate(cls) == pytest.approx(shipped)
    assert pessimistic.rate(cls) == 0.0  # no hit seen yet
    pessimistic.record([(cls, True)] * 4)
    assert pessimistic.rate(cls) == pytest.approx(4 / 8)  # hits / (trials + prior weight)
    assert AcceptanceEstimates(prior_scale=0.5).rate(cls) == pytest.approx(shipped / 2)
    for bad in (-0.1, 1.5):
        with pytest.raises(ConfigError, match="prior_scale in \\[0, 1\\]"):
            AcceptanceEstimates(prior_scale=bad)


def test_llamacpp_prior_makes_a_fresh_first_round_root_only_and_torch_prior_does_not():
    llama_cost = OnlineCostModel(prior_points=LlamaCppAdapter.cost_prior)
    assert LlamaCppAdapter.acceptance_prior_scale < 1.0
    assert first_round_nodes(llama_cost, LlamaCppAdapter.acceptance_prior_scale) == 1
    # the shipped prior on the same steep curve drafts at once where a long copy match continues
    # (what the pessimistic one prevents)
    long_repeat = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3, 4]
    assert first_round_nodes(llama_cost, 1.0, long_repeat) > 1
    assert first_round_nodes(llama_cost, LlamaCppAdapter.acceptance_prior_scale, long_repeat) == 1
    assert first_round_nodes(OnlineCostModel(), 1.0) > 1  # torch: shipped curve, prior scale 1


def test_the_decoder_takes_the_targets_acceptance_prior():
    target = HFModelAdapter(tiny_llama(0))
    assert SpeculativeDecoder(target).drafter.estimates.prior_scale == 1.0  # torch: no attribute
    target.acceptance_prior_scale = 0.25
    assert SpeculativeDecoder(target).drafter.estimates.prior_scale == 0.25


def root_only_round(drafter: TokenTreeDrafter, next_token: int, cost=FREE_TREES):
    """One round whose tree is the root alone (asserted), committing ``next_token``."""
    tree = drafter.propose(cost=cost)
    assert tree.num_nodes == 1
    drafter.observe_walk(tree, [0])
    drafter.commit([], next_token)
    return tree


@pytest.mark.parametrize("emitted, hit", [(4, True), (5, False)])
def test_a_root_only_round_records_its_root_candidates_as_trials(emitted, hit):
    drafter = TokenTreeDrafter(VOCAB, k=2, adjacency=AdjacencyTable(VOCAB, k=2), prior_scale=0.0)
    drafter.reset(PROMPT)
    root_only_round(drafter, emitted)  # every rate is 0: the root alone; the copy 4 is its candidate
    copy_classes = [cls for cls in drafter.estimates.trials if cls[0] == "copy"]
    assert len(copy_classes) == 1
    cls = copy_classes[0]
    assert drafter.estimates.trials[cls] == 1.0
    assert drafter.estimates.hits.get(cls, 0.0) == (1.0 if hit else 0.0)
    assert (drafter.estimates.rate(cls) > 0) == hit


def test_shadow_trials_off_record_nothing_and_one_decay_per_round():
    off = TokenTreeDrafter(VOCAB, k=2, adjacency=AdjacencyTable(VOCAB, k=2), prior_scale=0.0, shadow_trials=False)
    off.reset(PROMPT)
    root_only_round(off, 4)
    assert off.estimates.trials == {}
    steep = CostCurve(((1, 1.0), (2, 2.0)), overhead=0.0)  # no node ever pays: every round is the root alone
    on = TokenTreeDrafter(VOCAB, k=2, adjacency=confident_table(), prior_scale=0.0)
    on.reset(PROMPT)
    root_only_round(on, 4, steep)  # the copy 4 (and the adjacency 4) is hit
    before = dict(on.estimates.trials)
    tree = on.propose(cost=steep)
    shadow = [candidate.cls for candidate in on._shadow]
    assert tree.num_nodes == 1 and shadow
    on.observe_walk(tree, [0])
    on.commit([], 0)
    # one decay of the old trials per round, then this round's shadow trials (not two decays)
    for cls, trials in on.estimates.trials.items():
        assert trials == pytest.approx(on.estimates.decay * before.get(cls, 0.0) + shadow.count(cls))


def test_a_real_tree_round_records_only_its_walk():
    drafter = TokenTreeDrafter(VOCAB, k=2, adjacency=confident_table())
    drafter.reset(PROMPT)
    tree = drafter.propose(cost=FREE_TREES)
    assert tree.num_nodes > 1
    drafter.observe_walk(tree, [0])  # rejected at the root
    children = sum(1 for node in range(1, tree.num_nodes) if tree.parents[node] == 0)
    drafter.commit([], 0)
    assert sum(drafter.estimates.trials.values()) == pytest.approx(children)


def test_shadow_evidence_turns_root_only_rounds_into_trees():
    """Greedy, the prior at 0: the first rounds are the root alone; once the shadow trials of the
    confident adjacency class have hits, the policy drafts trees, which are accepted."""
    target = tiny_llama(0)
    drafter = TokenTreeDrafter(VOCAB, k=3, max_nodes=8, max_depth=4, cost=FREE_TREES, prior_scale=0.0)
    decoder = SpeculativeDecoder(target, drafter, temperature=0, max_new_tokens=24, eos_token_id=[])
    output = decoder.generate(PROMPT)
    nodes = [step.tree_nodes for step in output.steps]
    assert nodes[0] == 1 and max(nodes) > 1
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=24, eos_token_id=[])
    assert output.token_ids == plain.generate(PROMPT).token_ids


@pytest.mark.slow
def test_trees_grown_from_shadow_evidence_sample_the_target_law():
    """Chi-square of the first 3 tokens at temperature 0.8 when the first round is the root alone
    (prior at 0) and later rounds draft whatever the shadow trials of the earlier ones allow."""
    target = tiny_llama(0)
    tokens, samples = 3, 1500
    law = exact_first_tokens_law(target, PROMPT, tokens, temperature=0.8)
    warm = _warm_table(target)  # every token has adjacency candidates: root-only rounds have trials
    counts: dict = {}
    later_trees = 0
    for seed in range(samples):
        drafter = TokenTreeDrafter(VOCAB, k=3, max_nodes=12, max_depth=4, cost=FREE_TREES, prior_scale=0.0,
                                   adjacency=copy.deepcopy(warm))
        decoder = SpeculativeDecoder(target, drafter, temperature=0.8, max_new_tokens=tokens, eos_token_id=[], seed=seed)
        output = decoder.generate(PROMPT)
        assert output.steps[0].tree_nodes == 1
        later_trees += any(step.tree_nodes > 1 for step in output.steps[1:])
        key = tuple(output.token_ids[:tokens])
        counts[key] = counts.get(key, 0) + 1
    assert later_trees > samples // 4  # trees really grew from the evidence in many runs
    assert chi_square_pvalue(counts, law, samples) > FALSE_ALARM

"""A seed gives one text whatever the draft (core.noise, docs/drafter-invariance.md): on tiny
random Llamas in float64 (KV-cached tree forwards, so rows agree with 1-token forwards far below
the float32 rounding of the processed rows), every drafter-invariant configuration emits exactly
plain sampling's tokens (``method="ar"``), seed by seed, for chains and trees of every shape, at
every temperature, with top-k and top-p. Negative control: target noise keyed by the round
instead of the absolute position breaks the equality. The law of the seeded plain draws is the
target's (chi-square, false alarm 1e-3), which with the equality gives every rule's law."""

import copy
import json

import numpy as np
import pytest
import torch

from tests.engine.test_head_drafter import pair as head_pair
from tests.engine.tiny import ForwardMemo, exact_target_law, tiny_llama
from tests.verify.mc import chi_square_pvalue
from verispec.core.noise import GumbelNoise, NoiseAt, noise_of
from verispec.core.sampling import SamplingParams
from verispec.draft.tree_policy import CostCurve
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.token_tree import AdjacencyTable

VOCAB = 12
PROMPT = [1, 2, 3]
NEW_TOKENS = 16
SEEDS = range(8)
FALSE_ALARM = 1e-3

SAMPLING = {
    "T0.8": dict(temperature=0.8),
    "T1-top-k3": dict(temperature=1.0, top_k=3),
    "T0.7-top-p0.8": dict(temperature=0.7, top_p=0.8),
    "greedy": dict(temperature=0.0),
}

# (draft, decoder arguments): every drafter-invariant rule, chains and trees of several shapes
CONFIGS = {
    "token-trees (default)": (None, {}),
    "token-trees-big": ("big-trees", {}),
    "token-trees-warm-table": ("warm-table", {}),
    "qfree-ngram-tree-1": ("ngram", dict(method="qfree", tree=[1])),
    "qfree-ngram-tree-2,2,1": ("ngram", dict(method="qfree", tree=[2, 2, 1])),
    "qfree-model-tree-4,1,1,1": ("model", dict(method="qfree", tree=[4, 1, 1, 1])),
    "nss-model-tree-2,2": ("model", dict(method="nss", tree=[2, 2])),
    "gumbel-ngram-L1 (default)": ("ngram", dict(draft_len=1)),
    "gumbel-ngram-L5": ("ngram", dict(method="gumbel", draft_len=5)),
    "gumbel-model-L4 (default)": ("model", dict(draft_len=4)),
    "gumbel-model-L8": ("model", dict(method="gumbel", draft_len=8)),
}


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0, vocab_size=VOCAB).double(), tiny_llama(5, vocab_size=VOCAB, layers=1).double()


def _decoder(models, draft, **kwargs):
    target, draft_model = models
    if draft == "big-trees":  # every candidate pays: trees of up to 12 nodes, 4 deep
        draft = TokenTreeDrafter(VOCAB, k=3, max_nodes=12, max_depth=4, cost=CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0))
    if draft == "warm-table":  # started from a table of arbitrary rows (adjacency=): drafts only
        draft, kwargs = None, dict(kwargs, adjacency=_random_table(VOCAB))
    draft = draft_model if draft == "model" else draft
    return SpeculativeDecoder(target, draft, max_new_tokens=NEW_TOKENS, eos_token_id=[], **kwargs)


def _random_table(vocab: int) -> AdjacencyTable:
    """Every row filled with a random ranking of the vocabulary and high recorded probabilities, so
    its candidates are drafted from the first round, right or wrong."""
    table, generator = AdjacencyTable(vocab, k=3), torch.Generator().manual_seed(11)
    logits = 6.0 * torch.randn(vocab, vocab, generator=generator)
    table.update(list(range(vocab)), logits)
    return table


def _outputs(decoder, seeds=SEEDS):
    outputs = []
    for seed in seeds:
        decoder.seed = seed
        outputs.append(decoder.generate(PROMPT))
    return outputs


@pytest.fixture(scope="module")
def plain(models):
    return {name: [o.token_ids for o in _outputs(_decoder(models, None, method="ar", **params))] for name, params in SAMPLING.items()}


@pytest.mark.parametrize("sampling", SAMPLING)
@pytest.mark.parametrize("config", CONFIGS)
def test_drafter_invariant_rules_emit_plain_sampling_tokens(models, plain, config, sampling):
    draft, kwargs = CONFIGS[config]
    decoder = _decoder(models, draft, **kwargs, **SAMPLING[sampling])
    outputs = _outputs(decoder)
    assert [o.token_ids for o in outputs] == plain[sampling]
    if sampling != "greedy" and config not in ("qfree-ngram-tree-1", "token-trees (default)"):
        assert sum(o.mean_accepted_len for o in outputs) > 0  # the drafts were used, not all rejected


def test_default_method_of_a_sampled_chain_draft_is_gumbel(models):
    assert _decoder(models, "ngram").method == "gumbel"
    assert _decoder(models, "model").method == "gumbel"


@pytest.mark.parametrize("sampling", ["T0.8", "greedy"])
def test_gumbel_with_a_draft_head_emits_plain_sampling_tokens(sampling):
    # a copy: head_pair() is cached and shared with other tests, and .double() converts in place
    target, head = copy.deepcopy(head_pair())
    target = target.double()
    head = head.double()
    params = dict(max_new_tokens=NEW_TOKENS, eos_token_id=[], **SAMPLING[sampling])
    plain = SpeculativeDecoder(target, None, method="ar", **params)
    decoder = SpeculativeDecoder(target, head, draft_len=3, **params)
    assert decoder.method == "gumbel"
    for seed in range(4):
        plain.seed = decoder.seed = seed
        assert decoder.generate([1, 5, 2, 7]).token_ids == plain.generate([1, 5, 2, 7]).token_ids


def test_same_seed_same_text_and_threads_do_not_matter(models):
    decoder = _decoder(models, "model", temperature=0.9)
    decoder.seed = 3
    first = decoder.generate(PROMPT).token_ids
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1 if threads > 1 else 2)
        assert decoder.generate(PROMPT).token_ids == first
    finally:
        torch.set_num_threads(threads)


class RoundKeyedDecoder(SpeculativeDecoder):
    """Negative control: the target's noise keyed by the round number instead of the position."""

    rounds = 0

    def _draws(self, rng):
        draws = super()._draws(rng)
        if isinstance(draws, NoiseAt):
            self.rounds += 1
            return NoiseAt(draws.noise, self.rounds)
        return draws


def test_noise_keyed_by_round_breaks_the_equality(models, plain):
    target, draft = models
    decoder = RoundKeyedDecoder(target, draft, draft_len=4, temperature=0.8, max_new_tokens=NEW_TOKENS, eos_token_id=[])
    outputs = [o.token_ids for o in _outputs(decoder)]
    assert sum(out != ref for out, ref in zip(outputs, plain["T0.8"])) >= len(SEEDS) // 2


def test_the_first_token_is_the_gumbel_max_at_its_absolute_position(models):
    """Pins "position" to the token's index in prompt + generated text (the documented layout)."""
    target, _ = models
    with torch.no_grad():
        logits = target(torch.tensor([PROMPT])).logits[0, -1].double()
    probs = torch.softmax(logits / 0.8, dim=-1).numpy()
    for seed in range(6):
        expected = int(np.argmax(np.log(probs) + GumbelNoise(seed).gumbel(len(PROMPT), np.arange(VOCAB))))
        decoder = _decoder(models, None, method="ar", temperature=0.8, seed=seed)
        assert decoder.generate(PROMPT).token_ids[0] == expected


@pytest.mark.parametrize("sampling", ["T0.8", "T0.7-top-p0.8"])
def test_seeded_plain_sampling_has_the_targets_law(models, sampling):
    """Chi-square of the first 2 tokens over 3,000 seeds against the exact law (rows as the engine
    builds them: ``exact_target_law``). Catches a truncation applied after the draw."""
    target, _ = models
    params = SAMPLING[sampling]
    law = exact_target_law(ForwardMemo(target), PROMPT, 2, SamplingParams(**params))
    decoder = SpeculativeDecoder(target, None, method="ar", max_new_tokens=2, eos_token_id=[], **params)
    counts: dict = {}
    for output in _outputs(decoder, range(3000)):
        key = tuple(output.token_ids)
        counts[key] = counts.get(key, 0) + 1
    assert chi_square_pvalue(counts, law) > FALSE_ALARM


def test_an_explicit_rng_draws_without_the_noise(models):
    from verispec.core.rng import SeededRng

    assert noise_of(SeededRng(0)) is None
    output = _decoder(models, "ngram", temperature=0.8).generate(PROMPT, rng=SeededRng(0))
    assert len(output.token_ids) == NEW_TOKENS


@pytest.mark.parametrize("bad", [-1, 1.5, "3", 2**63])
def test_bad_seeds_are_refused_at_construction(models, bad):
    with pytest.raises(ConfigError, match="seed must be an integer"):
        _decoder(models, "ngram", seed=bad)


@pytest.mark.slow
def test_cli_same_seed_same_text_with_any_draft_and_threads(tmp_path):
    """The real default target in fp32 at T = 0.8, seed 3: the default run twice, at 1 and 2
    threads, the n-gram draft (gumbel) and ``--method ar`` give the same token ids (a mismatch
    here would have to be a batch-variance flip; none was seen in the measurements of
    docs/drafter-invariance.md)."""
    from verispec.cli.main import main

    def run(threads: int, *extra: str) -> list[int]:
        stats = tmp_path / "stats.json"
        args = ["generate", "Explain what a hash table is, in two sentences.", "--temperature", "0.8", "--seed", "3",
                "--dtype", "fp32", "--max-new-tokens", "24", "--stats-json", str(stats), *extra]
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            assert main(args) == 0
        finally:
            torch.set_num_threads(before)
        return json.loads(stats.read_text())["token_ids"]

    first = run(1)
    assert len(first) == 24
    assert run(1) == first
    assert run(2) == first
    assert run(1, "--draft", "ngram") == first
    assert run(1, "--method", "ar") == first

"""EAGLE-3 draft heads in the engine (issue 13 item 2): ``engine.head_drafter.HeadDrafter`` on tiny
random fp32 Llama targets (8 layers, so the default feature layers (2, 4, 5) exist) with a random
tiny head whose draft vocabulary leaves out one target token (q = 0 there exactly).

* ``test_q_rows_equal_a_from_scratch_recompute``: over many rounds of chains, i.i.d. paths and
  trees with commits of every length (target trees rolled back and rescored in between), every q
  row the drafter reports equals a from-scratch computation: a full causal head pass over the
  reference features of the committed positions, then one step per drafted token. Catches a stale
  or misaligned head cache, features off by a position, a wrong sibling/ancestor mask.
* greedy equality (T = 0, sampled draft so trees really branch) for every lossless rule of the
  registry that the head supports; the lossy ones run.
* exact law of ``generate()`` by replay enumeration (as tests/engine/test_engine_exact_law.py, with a
  target whose features come from memoised full forwards) for sd, spectr and a rrsw tree (traversal
  on the same tree enumerated exact too, 1.3e-8, in 2 minutes: left out for time). gbv-mod and
  SpecTr-GBV* are NOT exact with a head: their modification assumes q of a prefix is a function of
  the tokens alone, but a head's q of a prefix changes once the prefix is committed (target features
  replace its own). With V = 3, full q (a residual y has q(y) > 0, so windows really modify rows),
  L = 2, their enumerated laws are off by 3.6e-2 (gbv-mod) and 5.4e-2 (★), sd in the same setting
  1.6e-8; the decoder refuses them with a head. (With top-2 rows at L = 2 no window ever modifies a
  row, and gbv-mod enumerates "exact", 8.7e-9: such a case cannot decide it.)

Mutants tried by hand (each one-line edit, then ``pytest -k recompute`` / test_head_features.py),
every one caught: a committed feature paired with its own token instead of the next one
(``_tokens[start:last + 1]``); stale speculative entries kept as committed after ``commit``;
siblings of a tree level attending to each other (mask over every new entry); speculative RoPE
positions one too far; in the adapter, feature rows moved from the wrong index on commit
(``index - 1``; caught by tests/models/test_head_features.py).
"""

from functools import cache

import numpy as np
import pytest
import torch

from tests.engine.tiny import ExactForwardAdapter, ForwardMemo, exact_target_law, tiny_llama
from verispec.core.rng import SeededRng, enumerate_outcomes
from verispec.core.rows import LogitRows
from verispec.core.sampling import SamplingParams, logits_to_probs
from verispec.draft.samplers import sample_iid_paths, sample_tree
from verispec.engine import head_drafter as head_drafter_module
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.head_drafter import HeadDrafter
from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, HeadConfig, save_head, target_features
from verispec.models.hf import HFModelAdapter
from verispec.theory.enumerate import max_abs_difference
from verispec.verify.registry import METHODS, get_method

LAYERS = 8


def tiny_head(target, draft_ids, seed: int = 1, std: float = 0.3) -> Eagle3Head:
    """A random head of the EAGLE-3 shape for ``target`` (fp32) over the draft vocabulary ``draft_ids``."""
    torch.manual_seed(seed)
    head = Eagle3Head(HeadConfig.for_target(target.config, len(draft_ids)), torch.tensor(draft_ids))
    with torch.no_grad():
        for parameter in head.parameters():
            torch.nn.init.normal_(parameter, std=std)
    return head.eval()


@cache
def pair(vocab: int = 8):
    target = tiny_llama(3, vocab_size=vocab, layers=LAYERS)
    draft_ids = [t for t in range(vocab) if t != vocab - 2]  # one target token outside the draft vocabulary
    return target, tiny_head(target, draft_ids)


# ------------------------------------------------------------------ cache against a recompute


@torch.no_grad()
def recompute_row(head, target, committed, prefix, params) -> np.ndarray:
    """q(. | committed, prefix) from scratch: entries 0..t over reference features of x_0..x_t
    paired with x_1..x_{t+1} (causal), then one entry per drafted token fed its parent's output."""
    t = len(committed) - 2
    features, _ = target_features(target, torch.tensor([committed[: t + 1]]), head.config.aux_layer_ids)
    embed = target.get_input_embeddings()
    result = head.step(head.project(features), embed(torch.tensor([committed[1:]])), torch.arange(t + 1)[None])
    keys, values, out = result.keys, result.values, result.out[:, -1:]
    for depth, token in enumerate(prefix, start=1):
        result = head.step(out, embed(torch.tensor([[token]])), torch.tensor([[t + depth]]), keys, values)
        keys, values, out = torch.cat([keys, result.keys], 2), torch.cat([values, result.values], 2), result.out
    return logits_to_probs(head.target_logits(out[0]), params)[0]


@pytest.mark.parametrize("backend, head_capacity", [("native", 256), ("transformers", 256), ("native", 2)])
def test_q_rows_equal_a_from_scratch_recompute(backend, head_capacity):
    """head_capacity 2: the head's KV buffers grow many times, in begin_round and in deeper levels."""
    target, head = pair()
    adapter = HFModelAdapter(target, backend=backend)
    params = SamplingParams(1.0, 0, 1.0)
    drafter = HeadDrafter(head, adapter, params, initial_capacity=head_capacity)
    rng = SeededRng(7)
    checked = 0
    for prompt in ([1, 5, 2, 7, 3], [4, 0]):
        adapter.reset(prompt)
        drafter.reset(prompt)
        for round_index in range(9):
            draft_fn = drafter.begin_round()
            kind = round_index % 3
            if kind == 0:
                skeleton = sample_iid_paths(rng, draft_fn, 1, 3)  # chain
            elif kind == 1:
                skeleton = sample_iid_paths(rng, draft_fn, 3, 2)  # i.i.d. paths (trie)
            else:
                skeleton = sample_tree(rng, draft_fn, [2, 2, 1], get_method("rrsw").tree_scheme)  # siblings share positions
            committed = adapter.tokens()
            for node, prefix in enumerate(skeleton.prefixes):
                if node in set(skeleton.parents):
                    expected = recompute_row(head, target, committed, prefix, params)
                    np.testing.assert_allclose(skeleton.draft.row(node), expected, atol=1e-5)
                    checked += 1
            adapter.score([-1, 3], [-1, 0])  # a stray tree, rolled back by the next score
            adapter.score([-1, *skeleton.tokens[1:]], list(skeleton.parents))
            # commit a path of every length in turn: none, a prefix, a whole path
            leaf = skeleton.paths[0][-1] if skeleton.paths else len(skeleton.tokens) - 1
            path = []
            while leaf > 0:
                path.insert(0, leaf)
                leaf = skeleton.parents[leaf]
            path = path[: round_index % (len(path) + 1)]
            accepted = [skeleton.tokens[n] for n in path]
            next_token = int(rng.categorical(np.full(8, 1 / 8)))
            adapter.commit(path, next_token)
            drafter.commit(accepted, next_token)
    assert checked > 60


def test_draft_rows_have_exact_zeros_outside_the_draft_vocabulary():
    target, head = pair()
    adapter = HFModelAdapter(target)
    drafter = HeadDrafter(head, adapter, SamplingParams(1.0, 0, 1.0))
    adapter.reset([1, 2, 3])
    drafter.reset([1, 2, 3])
    row = drafter.begin_round()(())
    assert row[6] == 0.0 and (row[[0, 1, 2, 3, 4, 5, 7]] > 0).all()


def test_one_token_prompt_drafts_from_a_uniform_row():
    target, head = pair()
    decoder = SpeculativeDecoder(target, head, method="sd", draft_len=1, temperature=0, max_new_tokens=6, eos_token_id=[])
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=6, eos_token_id=[])
    assert decoder.generate([5]).token_ids == plain.generate([5]).token_ids


# ------------------------------------------------------------------ greedy equality, every rule

LOSSLESS = [n for n, s in METHODS.items() if s.lossless and n not in head_drafter_module.CONTEXT_ONLY_Q_RULES]
LOSSY = [n for n, s in METHODS.items() if not s.lossless and n != "sprinter"]


def _shape(name):
    spec = METHODS[name]
    if spec.tree_scheme is not None and spec.tree_scheme.value == "deterministic":
        return dict(tree=[2, 2, 1])
    if spec.draft == "chain":
        return dict(draft_len=4)
    if spec.draft == "tree":
        return dict(num_drafts=2, draft_len=3)
    return dict(num_drafts=2 if name == "otm" else 3, draft_len=3)


@pytest.mark.parametrize("method", LOSSLESS + LOSSY)
def test_every_rule_runs_and_lossless_ones_reproduce_greedy_output(method):
    target, head = pair()
    prompt = [1, 5, 2, 7, 3, 0]
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=20, eos_token_id=[]).generate(prompt)
    decoder = SpeculativeDecoder(
        target, head, method=method, temperature=0, draft_temperature=1.0, max_new_tokens=20, eos_token_id=[],
        seed=2, **_shape(method),
    )
    output = decoder.generate(prompt)
    assert len(output.token_ids) == 20
    # one head call per round for the committed entries + depth-1 q, then one per deeper tree level
    assert all(step.draft_calls == decoder.draft_len for step in output.steps)
    if method in LOSSLESS:
        assert output.token_ids == plain.token_ids


def test_greedy_draft_chain_and_directory_loading(tmp_path):
    """A greedy draft head (chain) equals greedy decoding, loaded from a directory or given as an instance."""
    target, head = pair()
    save_head(head, tmp_path / "head")
    prompt = [3, 1, 4, 1, 5]
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=16, eos_token_id=[]).generate(prompt)
    outputs = [
        SpeculativeDecoder(target, draft, method="sd", draft_len=3, temperature=0, max_new_tokens=16, eos_token_id=[]).generate(prompt)
        for draft in (head, str(tmp_path / "head"))
    ]
    assert outputs[0].token_ids == outputs[1].token_ids == plain.token_ids
    assert outputs[0].mean_accepted_len == outputs[1].mean_accepted_len


# ------------------------------------------------------------------ configuration errors


def test_missing_shipped_head_and_mismatched_heads_are_refused(monkeypatch, tmp_path):
    target, head = pair()
    monkeypatch.setattr(head_drafter_module, "SHIPPED_HEAD_DIR", tmp_path / "absent")
    with pytest.raises(ConfigError, match="ships no trained draft head"):
        SpeculativeDecoder(target, "head", method="sd")
    other = tiny_llama(4, vocab_size=6, layers=LAYERS)
    with pytest.raises(ConfigError, match="head vocabulary 8 != target vocabulary 6"):
        SpeculativeDecoder(other, head, method="sd")
    shallow = tiny_llama(4, vocab_size=8, layers=4)
    with pytest.raises(ConfigError, match=r"outside the target's layer inputs \[0, 3\] \(the target has 4 layers\)"):
        SpeculativeDecoder(shallow, head, method="sd")


@pytest.mark.parametrize("method", ["gbv-mod", "spectr-gbv-star"])
def test_target_modifying_rules_are_refused(method):
    target, head = pair()
    with pytest.raises(ConfigError, match="q of a prefix depends on the tokens alone"):
        SpeculativeDecoder(target, head, method=method, num_drafts=1 if method == "gbv-mod" else 2, draft_len=2)


# ------------------------------------------------------------------ exact law

VOCAB = 4
PROMPT = (1, 2, 0)
NUM_TOKENS = 4


class FeatureExactAdapter(ExactForwardAdapter):
    """``ExactForwardAdapter`` (rows from memoised full forwards) whose committed features also come
    from memoised full forwards (``target_features``), so the enumerated law has no KV rounding."""

    def __init__(self, model, memo):
        super().__init__(model, memo)
        self._feature_rows: dict[tuple[int, ...], torch.Tensor] = {}

    def enable_features(self, layer_ids):
        self._exact_layers = tuple(layer_ids)  # not ``feature_layers``: there is no runner to capture from

    def committed_features(self, start, end):
        sequence = tuple(self._tokens[:end])
        if sequence not in self._feature_rows:
            self._feature_rows[sequence] = target_features(self.model, torch.tensor([sequence]), self._exact_layers)[0][0]
        return self._feature_rows[sequence][start:end]


@cache
def exact_pair(vocab: int = VOCAB):
    """V = 4: the draft vocabulary leaves token 2 out; V = 3 (deep-window cases): the full vocabulary,
    so a residual token y has q(y) > 0 and a window really modifies rows (test_engine_exact_law.py)."""
    target = tiny_llama(0, vocab_size=vocab, layers=LAYERS)
    return ForwardMemo(target), tiny_head(target, [0, 1, 3] if vocab == 4 else list(range(vocab)), seed=2, std=0.5)


LAW_CASES = {
    "sd": dict(method="sd", draft_len=2, top_k=2),
    "spectr": dict(method="spectr", num_drafts=2, draft_len=1, top_k=2, num_tokens=3),
    "rrsw-tree": dict(method="rrsw", tree=[2, 1], top_k=2, num_tokens=3),
    # the configuration of UNSUPPORTED_CASES["gbv-mod"] with a rule that needs no context-only q
    # (spectr in the ★ configuration also enumerates exact, 1.5e-8, but takes ~4 minutes here)
    "sd-full-q": dict(method="sd", draft_len=2, top_k=0, vocab=3, num_tokens=2),
}
UNSUPPORTED_CASES = {
    "gbv-mod": dict(method="gbv-mod", draft_len=2, top_k=0, vocab=3, num_tokens=2),
    "spectr-gbv-star": dict(method="spectr-gbv-star", num_drafts=2, draft_len=2, top_k=0, vocab=3, num_tokens=2),
}


def law_error(case: dict) -> tuple[float, float, int]:
    """(max |engine law - target law|, tolerance (4 N δ as test_engine_exact_law.tolerance), most rounds)."""
    case = dict(case)
    method, num_tokens = case.pop("method"), case.pop("num_tokens", NUM_TOKENS)
    memo, head = exact_pair(case.pop("vocab", VOCAB))
    # the target-modifying rules are refused at construction: bypass that to measure their law
    decoder = SpeculativeDecoder(
        FeatureExactAdapter(memo.model, memo), head,
        method=method if method not in head_drafter_module.CONTEXT_ONLY_Q_RULES else "spectr" if case.get("num_drafts", 1) > 1 else "sd",
        max_new_tokens=num_tokens, eos_token_id=[], **case,
    )
    decoder.spec = get_method(method)
    rounds = [0]

    def program(rng):
        output = decoder.generate(list(PROMPT), rng=rng)
        rounds[0] = max(rounds[0], len(output.steps))
        return tuple(output.token_ids[:num_tokens])

    law = enumerate_outcomes(program, max_leaves=200_000)
    params = SamplingParams(1.0, case.get("top_k", 0), 1.0)
    reference = exact_target_law(memo, PROMPT, num_tokens, params)
    prefixes = {seq[:depth] for seq in reference for depth in range(num_tokens)}
    delta = max(abs(LogitRows(memo(PROMPT + prefix)[None], params).dense()[0].sum() - 1.0) for prefix in prefixes)
    return max_abs_difference(law, reference), 4 * num_tokens * max(delta, 1e-16), rounds[0]


@pytest.mark.slow
@pytest.mark.parametrize("case", list(LAW_CASES))
def test_engine_law_with_a_head_is_the_target_law(case):
    error, tolerance, rounds = law_error(LAW_CASES[case])
    assert rounds >= min(3, LAW_CASES[case].get("num_tokens", NUM_TOKENS))
    assert error < tolerance


@pytest.mark.slow
@pytest.mark.parametrize("case", list(UNSUPPORTED_CASES))
def test_target_modifying_rules_are_lossy_with_a_head(case):
    """Why the decoder refuses them: their modification assumes a context-only q."""
    error, tolerance, _ = law_error(UNSUPPORTED_CASES[case])
    assert error > 1e3 * tolerance


def test_a_shared_target_captures_features_only_for_the_head_decoder():
    target, head = pair()
    adapter = HFModelAdapter(target)
    prompt = [2, 4, 6, 1]
    with_head = SpeculativeDecoder(adapter, head, method="sd", draft_len=2, temperature=0, max_new_tokens=8, eos_token_id=[])
    plain = SpeculativeDecoder(adapter, None, method="ar", temperature=0, max_new_tokens=8, eos_token_id=[])
    first = with_head.generate(prompt).token_ids
    assert plain.generate(prompt).token_ids == first
    assert adapter.runner.feature_layers is None  # the plain decoder turned the capture off
    assert with_head.generate(prompt).token_ids == first
    assert adapter.runner.feature_layers == head.config.aux_layer_ids


def test_head_sources_are_recognised(tmp_path):
    from verispec.engine.head_drafter import is_head_source

    target, head = pair()
    save_head(head, tmp_path / "native")
    (tmp_path / "eagle3").mkdir()
    (tmp_path / "eagle3" / "config.json").write_text('{"architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 7}')
    target.save_pretrained(tmp_path / "model")
    assert is_head_source("head") and is_head_source(head)
    assert is_head_source(str(tmp_path / "native")) and is_head_source(tmp_path / "eagle3")
    assert not any(is_head_source(d) for d in ("ngram", "tree", None, str(tmp_path / "model"), str(tmp_path / "absent")))


def test_bench_sweep_with_a_head_directory(tmp_path):
    """The benchmark harness takes a head directory as its draft (as ``verispec bench --draft DIR``);
    greedy rows of every rule equal plain decoding's."""
    import json

    from tests.bench.conftest import VOCAB as BENCH_VOCAB, CharTokenizer
    from verispec.bench.config import make_config
    from verispec.bench.runner import run_sweep

    target = tiny_llama(0, vocab_size=BENCH_VOCAB, layers=LAYERS, logit_scale=2.0)
    save_head(tiny_head(target, list(range(0, BENCH_VOCAB, 2))), tmp_path / "head")
    dataset = tmp_path / "prompts.jsonl"
    dataset.write_text(json.dumps({"question_id": 1, "category": "writing", "turns": ["Write a poem."]}) + "\n")
    config = make_config(None, dict(
        methods="sd,spectr", dataset=[str(dataset)], K="1,2", L="2", temperatures="0", max_new_tokens=8,
        seeds="0", out=str(tmp_path / "out"), progress=False, warmup=False,
    ))
    result = run_sweep(config, target, CharTokenizer(), str(tmp_path / "head"))
    assert {(r.method, r.K) for r in result.records} == {("ar", 0), ("sd", 1), ("spectr", 1), ("spectr", 2)}
    assert len({r.text for r in result.records}) == 1

"""The llama.cpp backend (``models.llamacpp.LlamaCppAdapter``) on tiny random Llama GGUFs written
by the test itself (``tests/models/tiny_gguf.py``, F32, the weights of tests/engine/tiny.py's
torch models), and on the real default GGUF (slow):

* a tree scored in one ``llama_decode`` equals each of its root paths scored as a chain;
* after commits and rollbacks the next scores equal those of a fresh prefill of the same text;
* the logits equal the torch runner's on the same weights (tolerance measured, see LOGIT_TOLERANCE);
* the exact-law engine test (``enumerate_outcomes``) for SD with a GGUF draft, SpecTr (K = 2)
  and q-free token trees: the engine's law of the first tokens is the target's, up to the
  rows' normalisation and the measured batch-size variance of llama.cpp's kernels (``tolerance``);
* greedy output of every lossless rule equals plain llama.cpp decoding on the default GGUF;
* bad input: a missing / non-GGUF file, an unknown architecture, a tree wider than n_seq_max,
  a draft of another vocabulary, a transformers model or a draft head on this backend, and the
  extra not installed.

Skipped only when llama-cpp-python is not installed (``make test`` installs it).
"""

from __future__ import annotations

import copy
import importlib.util
from dataclasses import dataclass
from functools import cache

import gguf
import numpy as np
import pytest
import torch

from tests.engine.test_greedy_default import LOSSLESS  # the same rules as on torch
from tests.engine.tiny import exact_target_law, greedy_draft_shape, tiny_llama  # and the same draft shapes
from tests.models.tiny_gguf import write_llama_gguf
from verispec.core.rng import enumerate_outcomes
from verispec.core.rows import LogitRows
from verispec.core.sampling import SamplingParams
from verispec.draft.tree_policy import AcceptanceEstimates, CostCurve, RestSchedule
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter
from verispec.models.llamacpp import LlamaCppAdapter, llamacpp_available
from verispec.models.token_tree import AdjacencyTable
from verispec.theory.enumerate import max_abs_difference

pytestmark = pytest.mark.skipif(llamacpp_available() is not None, reason=str(llamacpp_available()))

VOCAB = 16
PROMPT = [1, 5, 9, 3, 7, 2, 11]
# a tree with shared nodes: 1 -> {3 -> {5, 6}, 4}, 2 -> {7}
TREE_TOKENS = [-1, 4, 8, 12, 0, 6, 9, 10]
TREE_PARENTS = [-1, 0, 0, 1, 1, 3, 3, 2]
# the largest |llama.cpp - torch| logit difference allowed on the same F32 weights; measured
# 2.4e-7 on logits of magnitude ~5 (AMD EPYC Zen 4, 1 thread, F32 KV cache)
LOGIT_TOLERANCE = 1e-5


@cache
def tiny_models(vocab: int) -> tuple:
    """(torch target, torch draft) of tests/engine/tiny.py for this vocabulary size."""
    return tiny_llama(0, vocab_size=vocab), tiny_llama(5, vocab_size=vocab, layers=1)


@pytest.fixture(scope="module")
def gguf_files(tmp_path_factory):
    """{(role, vocab): path} of the tiny models written as F32 GGUFs."""
    folder = tmp_path_factory.mktemp("gguf")
    files = {}
    for vocab in (4, VOCAB):
        for role, model in zip(("target", "draft"), tiny_models(vocab)):
            files[role, vocab] = write_llama_gguf(model, folder / f"{role}-{vocab}.gguf")
    return files


def open_adapter(path, **options) -> LlamaCppAdapter:
    """float32 throughout (F32 KV cache, no flash attention), so that rows can be compared tightly."""
    return LlamaCppAdapter(path, n_threads=1, kv_type="f32", flash_attn=False, **options)


def root_paths(parents):
    """Root-to-node paths (node numbers) of every node."""
    paths = [[0]]
    for node in range(1, len(parents)):
        paths.append(paths[parents[node]] + [node])
    return paths


# ----------------------------------------------------------------- tree scoring and the cache


def test_tree_scores_equal_each_root_path_scored_as_a_chain(gguf_files):
    adapter = open_adapter(gguf_files["target", VOCAB])
    adapter.reset(PROMPT)
    tree = adapter.score(TREE_TOKENS, TREE_PARENTS)
    tokens = [PROMPT[-1]] + TREE_TOKENS[1:]
    leaves = [n for n in range(len(TREE_PARENTS)) if n not in TREE_PARENTS]
    assert len(leaves) == 4  # the tree really branches, with shared inner nodes
    checked = set()
    for leaf in leaves:
        path = root_paths(TREE_PARENTS)[leaf]
        chain = adapter.score([-1] + [tokens[n] for n in path[1:]], list(range(-1, len(path) - 1)))
        torch.testing.assert_close(chain, tree[path], atol=1e-5, rtol=0)
        checked.update(path)
    assert checked == set(range(len(TREE_TOKENS)))


def test_scores_after_commits_and_rollbacks_equal_a_fresh_prefill(gguf_files):
    adapter = open_adapter(gguf_files["target", VOCAB])
    adapter.reset(PROMPT)
    adapter.score(TREE_TOKENS, TREE_PARENTS)
    adapter.commit([1, 3, 6], 13)  # a path off the first chain: nodes 3 and 6 are re-fed by the next forward
    adapter.score([-1, 2], [-1, 0])
    adapter.rollback()
    adapter.score(TREE_TOKENS, TREE_PARENTS)
    adapter.commit([2, 7], 14)
    adapter.score([-1, 3, 4], [-1, 0, 0])
    adapter.commit([], 5)  # nothing accepted
    adapter.append_committed([6, 7], 8)  # committed without a forward: rides along the next one
    committed = adapter.tokens()
    assert committed == PROMPT + [4, 12, 9, 13, 8, 10, 14, 5, 6, 7, 8]
    after = adapter.score(TREE_TOKENS, TREE_PARENTS)
    fresh = open_adapter(gguf_files["target", VOCAB])
    fresh.reset(committed)
    torch.testing.assert_close(after, fresh.score(TREE_TOKENS, TREE_PARENTS), atol=1e-5, rtol=0)


def test_incremental_extends_equal_one_tree_forward(gguf_files):
    """The draft side adds a tree level by level (``ModelDrafter``): nodes given in several
    ``extend`` calls, including a second child of a node cached by an earlier call."""
    adapter = open_adapter(gguf_files["target", VOCAB])
    adapter.reset(PROMPT)
    whole = adapter.score(TREE_TOKENS, TREE_PARENTS)
    adapter.rollback()
    parts = [adapter.extend(TREE_TOKENS[:3], TREE_PARENTS[:3]), adapter.extend(TREE_TOKENS[3:5], TREE_PARENTS[3:5]),
             adapter.extend(TREE_TOKENS[5:], TREE_PARENTS[5:])]
    torch.testing.assert_close(torch.cat(parts), whole, atol=1e-5, rtol=0)
    adapter.commit([2, 7], 3)
    fresh = open_adapter(gguf_files["target", VOCAB])
    fresh.reset(PROMPT + [8, 10, 3])
    torch.testing.assert_close(adapter.score([-1, 1], [-1, 0]), fresh.score([-1, 1], [-1, 0]), atol=1e-5, rtol=0)


def test_the_prompt_is_prefilled_in_large_batches_and_rounds_in_small_ones(gguf_files, monkeypatch):
    """The prefill (``reset``) uses PREFILL_BATCH-token forwards (fast; the same for plain and
    speculative decoding); a round's forward stays below 64 tokens (batch-invariant rows)."""
    import llama_cpp

    from verispec.models.llamacpp import BATCH_INVARIANT_TOKENS, PREFILL_BATCH

    sizes = []
    real = llama_cpp.llama_decode
    monkeypatch.setattr(llama_cpp, "llama_decode", lambda ctx, batch: sizes.append(batch.n_tokens) or real(ctx, batch))
    long_prompt = [(3 * i) % VOCAB for i in range(101)]
    adapter = open_adapter(gguf_files["target", VOCAB])
    assert (adapter.prefill_batch, adapter.n_batch) == (min(PREFILL_BATCH, 128), BATCH_INVARIANT_TOKENS)  # tiny context: 128
    adapter.reset(long_prompt)
    assert sizes == [100]  # one forward, not chunks of 63
    adapter.reset(long_prompt[:41])
    adapter.append_committed(list(range(3, 13)) * 7, 4)  # 70 committed tokens ride along the next forward: split
    sizes.clear()
    adapter.score([-1, 5], [-1, 0])
    assert sizes == [63, 10]  # the old root, 70 tokens, the new root and one node
    small = open_adapter(gguf_files["target", VOCAB], prefill_batch=20)
    sizes.clear()
    small.reset(long_prompt)
    assert sizes == [20] * 5
    adapter.reset(long_prompt)  # the prefill's batch size moves F32 rows by float rounding only
    torch.testing.assert_close(small.score([-1, 5], [-1, 0]), adapter.score([-1, 5], [-1, 0]), atol=1e-5, rtol=0)


def test_logits_match_the_torch_runner_on_the_same_weights(gguf_files):
    torch_model, _ = tiny_models(VOCAB)
    reference = HFModelAdapter(torch_model, backend="native")
    adapter = open_adapter(gguf_files["target", VOCAB])
    worst = 0.0
    for target in (reference, adapter):
        target.reset(PROMPT)
    for path, next_token in (([1, 3, 5], 2), ([], 6), ([2, 7], 1)):
        rows = [target.score(TREE_TOKENS, TREE_PARENTS) for target in (reference, adapter)]
        worst = max(worst, float((rows[0] - rows[1]).abs().max()))
        for target in (reference, adapter):
            target.commit(path, next_token)
    assert worst < LOGIT_TOLERANCE, worst


# ------------------------------------------------------------------------ exact law, engine

LAW_PROMPT = (1, 2, 0)
LAW_TOKENS = 4
FREE_TREES = CostCurve(((1, 1.0), (64, 1.0)), overhead=0.0)  # every candidate pays: trees branch


class LlamaCppMemo:
    """Next-token logits after a whole sequence, from a fresh prefill of it on llama.cpp (memoised):
    the reference rows of the target law."""

    def __init__(self, path):
        self.adapter = open_adapter(path)
        self.rows: dict[tuple[int, ...], torch.Tensor] = {}

    def __call__(self, sequence) -> torch.Tensor:
        sequence = tuple(int(t) for t in sequence)
        if sequence not in self.rows:
            self.adapter.reset(list(sequence))
            self.rows[sequence] = self.adapter.score([-1], [-1])[0]
        return self.rows[sequence]


class RowSpy:
    """Wraps a target adapter's ``score``: the largest |engine row - reference row| over every
    scored node, in probability space under ``params`` (llama.cpp's batch-size variance)."""

    def __init__(self, adapter, memo: LlamaCppMemo, params: SamplingParams):
        self.adapter, self.memo, self.params = adapter, memo, params
        self.worst = 0.0
        self.nodes = 0
        self._score = adapter.score
        adapter.score = self.score

    def score(self, tokens, parents):
        logits = self._score(tokens, parents)
        context = tuple(self.adapter.tokens())
        node_tokens = [context[-1]] + list(tokens[1:])
        for node, path in enumerate(root_paths(list(parents))):
            sequence = context + tuple(node_tokens[n] for n in path[1:])
            rows = LogitRows(torch.stack([logits[node], self.memo(sequence)]), self.params).dense()
            self.worst = max(self.worst, float(np.abs(rows[0] - rows[1]).max()))
        self.nodes += len(tokens)
        return logits


@dataclass
class EngineLaw:
    """The engine's exact law of the first LAW_TOKENS tokens next to the target's (both as
    {tokens: probability}), with the tolerance 4 N (δ + ε): δ the rows' normalisation error (as in
    tests/engine/test_engine_exact_law.py), ε the largest row difference the spy saw."""

    law: dict
    reference: dict
    tolerance: float
    rounds: int  # most rounds on a path

    @property
    def error(self) -> float:
        return max_abs_difference(self.law, self.reference)


def engine_law(target_path, make_decoder, params: SamplingParams) -> EngineLaw:
    """Enumerates the law of ``make_decoder(target)`` on LAW_PROMPT over a llama.cpp target."""
    target = open_adapter(target_path)
    memo = LlamaCppMemo(target_path)
    spy = RowSpy(target, memo, params)
    rounds = [0]

    def program(rng):
        output = make_decoder(target).generate(list(LAW_PROMPT), rng=rng)
        rounds[0] = max(rounds[0], len(output.steps))
        return tuple(output.token_ids[:LAW_TOKENS])

    law = enumerate_outcomes(program, max_leaves=200_000)
    reference = exact_target_law(memo, LAW_PROMPT, LAW_TOKENS, params)
    delta = max(abs(LogitRows(row[None], params).dense()[0].sum() - 1.0) for row in memo.rows.values())
    assert spy.nodes > 0
    return EngineLaw(law, reference, 4 * LAW_TOKENS * (max(delta, 1e-16) + spy.worst), rounds[0])


def _warm_table(path, vocab: int) -> AdjacencyTable:
    """The adjacency table after the target has scored every token once (in context [t])."""
    table = AdjacencyTable(vocab, k=2)
    memo = LlamaCppMemo(path)
    for token in range(vocab):
        table.update([token], memo([token])[None])
    return table


@pytest.mark.slow
@pytest.mark.parametrize("case", ["sd-gguf-draft", "spectr", "qfree-token-trees"])
def test_engine_law_on_llamacpp_is_the_target_law(gguf_files, case):
    target_path, draft_path = gguf_files["target", 4], gguf_files["draft", 4]
    params = SamplingParams(1.0, 2, 1.0)
    if case == "qfree-token-trees":
        table = _warm_table(target_path, 4)

        def make_decoder(target):  # a fresh drafter per run: its estimates must not leak between leaves
            drafter = TokenTreeDrafter(4, k=2, max_nodes=6, max_depth=2, cost=FREE_TREES, adjacency=copy.deepcopy(table))
            return SpeculativeDecoder(target, drafter, top_k=2, max_new_tokens=LAW_TOKENS, eos_token_id=[])
    else:
        draft = open_adapter(draft_path)
        shape = dict(method="sd", draft_len=2) if case == "sd-gguf-draft" else dict(method="spectr", num_drafts=2, draft_len=1)

        def make_decoder(target):
            return SpeculativeDecoder(target, draft, top_k=2, max_new_tokens=LAW_TOKENS, eos_token_id=[], **shape)

    result = engine_law(target_path, make_decoder, params)
    assert result.rounds >= 2
    assert result.tolerance < 1e-4  # the check keeps its power: the mutants of the torch law test err by 1e-3 .. 1e-2
    assert result.error < result.tolerance, (result.error, result.tolerance)


# ------------------------------------------------------- greedy equality on the real default GGUF

GREEDY_PROMPTS = ["Write a Python function that returns the n-th Fibonacci number.", "List three colours of the rainbow."]
GREEDY_TOKENS = 20


# The default Q4_1 GGUF's tree rows are bit-identical to one-token rows (docs/llamacpp.md, Numerics), so
# its speculative greedy output must equal plain output token for token. Gemma 3 270M's are not: a row
# scored alone and inside a tree forward differ by up to ~1.0 logit, so where plain decoding's top
# logits lie closer than this, a tree round may take another token (a flip of batch variance)
TIE_LOGITS = 1.1


@dataclass
class GreedyReference:
    """Plain greedy llama.cpp output, with each position's near ties: the tokens whose logit in the
    plain one-token row lies within TIE_LOGITS of the top one."""

    token_ids: list[int]
    near_ties: list[set[int]]


def plain_greedy(target, ids: list[int]) -> GreedyReference:
    """Plain greedy decoding of GREEDY_TOKENS tokens through the decoder (``--method ar``), and the
    near ties along it from the same one-token rows."""
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=GREEDY_TOKENS, eos_token_id=[])
    token_ids = plain.generate(ids).token_ids
    target.reset(ids)
    near_ties = []
    for token in token_ids:
        row = target.score([-1], [-1])[0]
        assert int(row.argmax()) == token  # the same rows as the decoder's
        near_ties.append({int(t) for t in torch.nonzero(row >= row.max() - TIE_LOGITS).flatten()})
        target.commit([], token)
    return GreedyReference(token_ids, near_ties)


def assert_follows(output_ids: list[int], reference: GreedyReference) -> int:
    """``output_ids`` equals the plain greedy reference, or first differs where the reference had a
    near tie and took one of its tied tokens (the rest then continues another text, not compared).
    Returns the number of positions compared equal."""
    assert len(output_ids) == len(reference.token_ids)
    for position, (token, expected) in enumerate(zip(output_ids, reference.token_ids)):
        if token != expected:
            assert token in reference.near_ties[position], (
                f"position {position}: {token} instead of {expected}, not within {TIE_LOGITS} logits of it in the plain row")
            return position
    return len(output_ids)


def greedy_references(name: str):
    """(llama.cpp target ``name``, GREEDY_PROMPTS as its token ids, the plain greedy reference of each)."""
    from verispec.models.default import encode_prompt
    from verispec.models.llamacpp import load_gguf_tokenizer, load_llamacpp_adapter

    tokenizer = load_gguf_tokenizer(name)
    target = load_llamacpp_adapter(name, n_threads=1)
    prompts = [encode_prompt(tokenizer, text) for text in GREEDY_PROMPTS]
    return target, prompts, [plain_greedy(target, ids) for ids in prompts]


@pytest.fixture(scope="module")
def default_gguf():
    return greedy_references("default")


@pytest.mark.slow
@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_rules_reproduce_greedy_llamacpp_output(default_gguf, method):
    target, prompts, references = default_gguf
    decoder = SpeculativeDecoder(
        target, "ngram", method=method, temperature=0, draft_temperature=1.0, max_new_tokens=GREEDY_TOKENS,
        eos_token_id=[], seed=3, **greedy_draft_shape(method),
    )
    for ids, reference in zip(prompts, references):
        assert decoder.generate(ids).token_ids == reference.token_ids  # bit-identical rows: no near tie can flip


@pytest.mark.slow
def test_default_token_trees_reproduce_greedy_llamacpp_output(default_gguf):
    target, prompts, references = default_gguf
    decoder = SpeculativeDecoder(target, None, temperature=0, max_new_tokens=GREEDY_TOKENS, eos_token_id=[])
    assert decoder.method == "qfree"
    # trees priced as free, so that they really branch (the measured llama.cpp cost curve may
    # well choose the root alone, which would make this test vacuous)
    decoder.drafter.cost = FREE_TREES
    decoder.drafter.rest = RestSchedule(after=0)  # propose every round (llama.cpp's trees rest after 8 root-only ones)
    # the shipped acceptance prior, not llama.cpp's zero one: with 20 tokens per prompt the zero
    # prior learns from a handful of shadow trials, and whether any draft token is accepted is luck
    decoder.drafter.estimates = AcceptanceEstimates()
    accepted = 0
    for ids, reference in zip(prompts, references):
        output = decoder.generate(ids)
        assert output.token_ids == reference.token_ids
        accepted += sum(step.accepted_len for step in output.steps)
        assert max(step.tree_nodes for step in output.steps) > 4
    assert accepted > 0  # draft tokens were really accepted


@pytest.mark.slow
@pytest.mark.parametrize("path", [[1, 3], [2], [2, 4]])
def test_commits_off_the_first_chain_leave_exact_rows_on_the_default_gguf(default_gguf, path):
    """Regression: re-tagging the cells of an accepted path that skips a node put the next token's
    cell before a committed one, and llama.cpp's attention then moved the default target's logits by
    up to 1.1; the adapter keeps cells in position order, so the rows stay bit-identical."""
    from verispec.models.llamacpp import load_llamacpp_adapter

    target, prompts, _ = default_gguf
    fresh = load_llamacpp_adapter("default", n_threads=1)
    target.reset(prompts[0])
    # root -> {1 -> 3, 2 -> 4}, numbered level by level: every path skips a node
    target.score([-1, 100, 101, 102, 103], [-1, 0, 0, 1, 2])
    target.commit(path, 7)
    for _ in range(3):
        row = target.score([-1], [-1])[0]
        fresh.reset(target.tokens())
        assert torch.equal(row, fresh.score([-1], [-1])[0])
        target.commit([], 9)


@pytest.mark.slow
def test_a_long_prompt_prefilled_in_one_batch_keeps_speculative_output_equal_to_plain(default_gguf):
    """A prompt beyond 63 tokens is prefilled in one large batch (other kernels than the rounds'),
    the same for both decoders: greedy token trees still reproduce plain decoding, and the rows
    after the commits equal a fresh prefill of the prompt followed by the generated tokens."""
    from verispec.models.llamacpp import load_llamacpp_adapter

    target, prompts, _ = default_gguf
    ids = (prompts[0] + prompts[1]) * 3
    assert len(ids) > 100
    plain = SpeculativeDecoder(target, None, method="ar", temperature=0, max_new_tokens=GREEDY_TOKENS, eos_token_id=[])
    spec = SpeculativeDecoder(target, None, temperature=0, max_new_tokens=GREEDY_TOKENS, eos_token_id=[])
    spec.drafter.cost = FREE_TREES
    spec.drafter.rest = RestSchedule(after=0)  # propose every round: the test needs branching trees
    reference = plain.generate(ids).token_ids
    output = spec.generate(ids)
    assert output.token_ids == reference
    assert max(step.tree_nodes for step in output.steps) > 4
    committed = target.tokens()
    fresh = load_llamacpp_adapter("default", n_threads=1)
    fresh.reset(ids)
    fresh.append_committed(committed[len(ids):-1], committed[-1])
    assert torch.equal(target.score([-1], [-1])[0], fresh.score([-1], [-1])[0])


@pytest.mark.slow
def test_auto_runs_the_default_target_on_llamacpp_on_a_cpu_without_native_bf16(monkeypatch, capsys):
    """The CLI's ``--backend auto`` end to end: on a CPU without native bf16 (faked) the default
    target's GGUF runs through llama.cpp, with no torch model loaded."""
    import verispec.models.default as default
    from verispec.cli.main import main

    monkeypatch.setattr(default, "fast_dtype_name", lambda cpuinfo=None: "fp32")
    monkeypatch.setattr(default, "load_model", lambda *a, **k: pytest.fail("auto loaded a torch model"))
    resets = []
    real_reset = LlamaCppAdapter.reset
    monkeypatch.setattr(LlamaCppAdapter, "reset", lambda self, ids: resets.append(len(ids)) or real_reset(self, ids))
    assert main(["generate", "Name three colours.", "--max-new-tokens", "4", "--temperature", "0", "--threads", "1"]) == 0
    assert resets and "4 tokens" in capsys.readouterr().err


# ----------------------------------------------------------------------- Gemma 3 270M's GGUF


@pytest.fixture(scope="module")
def gemma_gguf():
    from verispec.models.gemma import gemma_available

    reason = gemma_available()
    if reason is not None:
        pytest.skip(reason)
    return greedy_references("gemma3-270m")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["qfree", "sd", "spectr"])
def test_lossless_rules_reproduce_greedy_llamacpp_output_on_gemma(gemma_gguf, method):
    """Gemma 3 270M (Q4_K_M, sliding-window layers) through llama.cpp: token trees (priced free, so
    that they branch), SD and SpecTr reproduce plain greedy decoding token for token up to a near tie.
    Its rows are not batch-invariant (up to ~1 logit between tree sizes, docs/llamacpp.md): on an
    AVX2-only EPYC the first prompt's 14th token (plain margin 0.017 logits) flips in tree rounds."""
    target, prompts, references = gemma_gguf
    assert target.architecture == "gemma3" and target.vocab_size == 262144
    shape = {"qfree": {}, "sd": dict(draft_len=3), "spectr": dict(num_drafts=2, draft_len=2)}[method]
    decoder = SpeculativeDecoder(target, None if method == "qfree" else "ngram", method=method, temperature=0,
                                 max_new_tokens=GREEDY_TOKENS, eos_token_id=[], seed=3, **shape)
    if method == "qfree":
        decoder.drafter.cost = FREE_TREES
    decoder.drafter.rest = RestSchedule(after=0)  # propose every round (llama.cpp's trees rest after 8 root-only ones)
    # the shipped acceptance prior, not llama.cpp's zero one: with 20 tokens per prompt the zero
    # prior learns from a handful of shadow trials, and whether any draft token is accepted is luck
    decoder.drafter.estimates = AcceptanceEstimates()
    accepted = compared = 0
    for ids, reference in zip(prompts, references):
        output = decoder.generate(ids)
        compared += assert_follows(output.token_ids, reference)
        accepted += sum(step.accepted_len for step in output.steps)
    assert accepted > 0
    assert compared >= GREEDY_TOKENS // 2


@pytest.mark.slow
def test_the_cli_runs_gemma_on_llamacpp(gemma_gguf, capsys):
    from verispec.cli.main import main

    code = main(["generate", "Name three colours.", "--target", "gemma3-270m", "--backend", "llamacpp",
                 "--max-new-tokens", "6", "--temperature", "0", "--threads", "1"])
    assert code == 0
    assert "6 tokens" in capsys.readouterr().err


# ------------------------------------------------------------------------------------ bad input


def test_missing_and_non_gguf_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match="nothere.gguf.*does not exist"):
        LlamaCppAdapter(tmp_path / "nothere.gguf")
    fake = tmp_path / "fake.gguf"
    fake.write_text("not a model")
    with pytest.raises(ConfigError, match="fake.gguf.*is not a GGUF file"):
        LlamaCppAdapter(fake)


def test_unknown_architecture_is_named(tmp_path):
    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, "nosucharch")
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ConfigError, match="odd.gguf.*unknown architecture 'nosucharch'"):
        LlamaCppAdapter(path)


def test_a_tree_wider_than_the_sequence_limit_names_it_and_leaves_the_cache_usable(gguf_files):
    adapter = open_adapter(gguf_files["target", VOCAB], n_seq_max=2)
    adapter.reset(PROMPT)
    with pytest.raises(ConfigError, match=r"more than 2 root-to-leaf paths.*n_seq_max=2.*larger n_seq_max"):
        adapter.score([-1, 1, 2, 3], [-1, 0, 0, 0])
    fresh = open_adapter(gguf_files["target", VOCAB])
    fresh.reset(PROMPT)
    torch.testing.assert_close(adapter.score([-1, 1, 2], [-1, 0, 0]), fresh.score([-1, 1, 2], [-1, 0, 0]), atol=1e-5, rtol=0)


def test_a_draft_of_another_vocabulary_is_refused(gguf_files):
    with pytest.raises(ConfigError, match="draft vocabulary has 4 tokens but the target has 16"):
        SpeculativeDecoder(str(gguf_files["target", VOCAB]), str(gguf_files["draft", 4]), method="sd")


def test_gguf_paths_run_on_llamacpp_and_other_models_are_refused(gguf_files):
    decoder = SpeculativeDecoder(str(gguf_files["target", VOCAB]), str(gguf_files["draft", VOCAB]), method="sd",
                                 max_new_tokens=5, eos_token_id=[])
    assert decoder.target.backend == "llamacpp" and decoder.drafter.adapter.backend == "llamacpp"
    assert decoder.generate(PROMPT).new_tokens == 5
    torch_model, _ = tiny_models(VOCAB)
    with pytest.raises(ConfigError, match="backend 'llamacpp' runs GGUF files, not a LlamaForCausalLM"):
        SpeculativeDecoder(torch_model, "ngram", backend="llamacpp")
    with pytest.raises(ConfigError, match="runs on backend 'llamacpp' \\(or 'auto'\\), not 'native'"):
        SpeculativeDecoder(str(gguf_files["target", VOCAB]), "ngram", backend="native")
    with pytest.raises(ConfigError, match="draft head reads the target's hidden states.*'llamacpp'"):
        SpeculativeDecoder(str(gguf_files["target", VOCAB]), "head", method="sd")


def test_sprinter_and_the_transformers_anchor_refuse_the_llamacpp_backend(gguf_files, tmp_path, capsys):
    from verispec.bench.config import make_config
    from verispec.bench.runner import Sweep
    from verispec.cli.main import main
    from verispec.sprinter.decoder import SprinterDecoder

    with pytest.raises(ConfigError, match="SPRINTER's verifier reads the target's hidden states.*llamacpp"):
        SprinterDecoder(str(gguf_files["target", VOCAB]), "ngram", verifier=None)
    assert main(["generate", "hi", "--method", "sprinter", "--backend", "llamacpp"]) == 2
    assert "SPRINTER's verifier reads the target's hidden states" in capsys.readouterr().err
    config = make_config(None, dict(methods="sd", dataset=["humaneval"], anchor=True, progress=False, backend="llamacpp"))
    with pytest.raises(ConfigError, match="--anchor runs transformers' own generate.*llamacpp"):
        Sweep(config, str(gguf_files["target", VOCAB]), None, str(gguf_files["draft", VOCAB]))


def test_batched_decoding_with_a_gguf_draft_model_is_refused_clearly(gguf_files):
    """Batches run on llama.cpp (tests/models/test_llamacpp_batch.py), but draft models do not batch."""
    decoder = SpeculativeDecoder(str(gguf_files["target", VOCAB]), str(gguf_files["draft", VOCAB]), method="sd",
                                 max_new_tokens=3, eos_token_id=[])
    with pytest.raises(ConfigError, match="cannot batch yet"):
        decoder.generate_batch([PROMPT, PROMPT[:4]])


def test_the_extra_not_installed_says_how_to_install(monkeypatch, gguf_files):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'verispec\[llamacpp\]'.*make setup-llamacpp"):
        LlamaCppAdapter(gguf_files["target", VOCAB])

"""Batch-invariant row shapes of the native runner (models.row_shape): same function as the plain
forward, rows bit-identical whatever the grouping, a probe that finds a shape and rejects a broken
kernel, and its on-disk cache."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.errors import ConfigError
from verispec.models import native_llama, row_shape
from verispec.models.hf import HFModelAdapter
from verispec.models.row_shape import RowShape, invariant_row_shape, probe_key, probe_row_shape, rows_invariant

VOCAB = 256
SHAPE = RowShape(4, 8)


def small_llama(dtype):
    """A random Llama wide enough (hidden 128) for bf16 batch variance to show."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    return LlamaForCausalLM(config).eval().to(dtype)


CHAIN = [(7919 * i + 13) % VOCAB for i in range(120)]
PROMPT = 59  # the decode crosses the key-alignment boundary at 64


def plain_rows(adapter, count):
    """Rows of the chain decoded one token per forward after a prompt of PROMPT tokens."""
    adapter.reset(CHAIN[:PROMPT])
    rows = []
    for t in range(PROMPT, PROMPT + count):
        rows.append(adapter.score([CHAIN[t - 1]], [-1])[0])
        adapter.commit([], CHAIN[t])
    return torch.stack(rows)


def chunked_rows(adapter, sizes):
    """Rows of the chain scored as chains of ``sizes`` tokens (root included), each fully committed."""
    adapter.reset(CHAIN[:PROMPT])
    rows, t = [], PROMPT
    for size in sizes:
        tokens = CHAIN[t - 1 : t - 1 + size]
        rows.append(adapter.score(tokens, [-1] + list(range(size - 1))))
        adapter.commit(list(range(1, size)), CHAIN[t - 1 + size])
        t += size
    return torch.cat(rows)


def tree_rows(adapter, depths, decoys=2):
    """Rows of the chain's path inside trees where every path node has ``decoys`` sibling decoys added
    before it (the path's keys are not contiguous in the cache); the path is committed."""
    adapter.reset(CHAIN[:PROMPT])
    rows, t = [], PROMPT
    for depth in depths:
        tokens, parents, path = [CHAIN[t - 1]], [-1], [0]
        for d in range(depth):
            for k in range(decoys):
                tokens.append((CHAIN[t + d] + 1 + k) % VOCAB)
                parents.append(path[-1])
            tokens.append(CHAIN[t + d])
            parents.append(path[-1])
            path.append(len(tokens) - 1)
        rows.append(adapter.score(tokens, parents)[path])
        adapter.commit(path[1:], CHAIN[t + depth])
        t += depth + 1
    return torch.cat(rows)


def test_row_shape_arithmetic_and_errors():
    shape = RowShape(4, 8, 64)
    assert shape.chunks(19) == [(0, 8), (8, 16), (16, 19)]
    assert shape.chunks(0) == []
    assert [shape.padded(n) for n in (1, 4, 7)] == [4, 4, 7]
    assert [shape.key_length(e) for e in (1, 64, 65)] == [64, 64, 128]
    for bad in (dict(min_rows=0, max_rows=8), dict(min_rows=4, max_rows=True), dict(min_rows=4, max_rows=8, key_align=2.0)):
        with pytest.raises(ConfigError, match="RowShape"):
            RowShape(**bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_shaped_forward_computes_the_same_function(dtype):
    """Tree rounds with the mode give the unshaped logits to float tolerance (same function)."""
    model = small_llama(dtype)
    plain, shaped = HFModelAdapter(model, backend="native"), HFModelAdapter(model, backend="native")
    shaped.runner.row_shape = RowShape(4, 3)  # a cap below the tree: the forward is split into chunks
    tolerance = 1e-4 if dtype == torch.float32 else 0.1
    for adapter in (plain, shaped):
        adapter.reset(CHAIN[:PROMPT])
    for _ in range(3):
        tokens, parents = [-1] + CHAIN[PROMPT : PROMPT + 6], [-1, 0, 0, 1, 2, 3, 3]
        expected, actual = plain.score(tokens, parents), shaped.score(tokens, parents)
        assert actual.shape == expected.shape
        torch.testing.assert_close(actual, expected, atol=tolerance, rtol=0)
        for adapter in (plain, shaped):
            adapter.commit([1, 3], CHAIN[PROMPT + 7])
    assert shaped.runner.length == plain.runner.length


def test_shaped_forward_returns_features_of_real_rows():
    model = small_llama(torch.float32)
    plain, shaped = HFModelAdapter(model, backend="native"), HFModelAdapter(model, backend="native")
    shaped.runner.row_shape = RowShape(4, 2)
    for adapter in (plain, shaped):
        adapter.enable_features([0, 1])
        adapter.reset(CHAIN[:10])
        adapter.score(CHAIN[9:14], [-1, 0, 1, 2, 3])
    torch.testing.assert_close(shaped.node_features(), plain.node_features(), atol=1e-5, rtol=0)


def test_bf16_rows_are_bit_identical_in_every_grouping():
    """bf16 with the forced shape: a plain padded decode, chains of 1..8 tokens and trees with decoy
    siblings give the same rows bit for bit; without the mode they do not."""
    adapter = HFModelAdapter(small_llama(torch.bfloat16), backend="native")
    adapter.runner.row_shape = SHAPE
    sizes = [8, 1, 7, 2, 6, 3, 5, 4]
    plain = plain_rows(adapter, sum(sizes))
    assert torch.equal(chunked_rows(adapter, sizes), plain)
    depths = [2, 1, 2, 2]  # trees of 7, 4, 7, 7 nodes (root + 3 per depth)
    trees = tree_rows(adapter, depths)
    expected = plain[: sum(d + 1 for d in depths)]
    assert torch.equal(trees, expected)
    adapter.runner.row_shape = None  # control: the mode off
    assert not torch.equal(chunked_rows(adapter, sizes), plain_rows(adapter, sum(sizes)))


def test_fp32_chain_rows_are_bit_identical():
    adapter = HFModelAdapter(small_llama(torch.float32), backend="native")
    adapter.runner.row_shape = SHAPE
    sizes = [8, 1, 7, 2, 6, 3, 5, 4]
    assert torch.equal(chunked_rows(adapter, sizes), plain_rows(adapter, sum(sizes)))


def test_probe_finds_a_shape_and_rejects_a_row_count_dependent_kernel(monkeypatch):
    runner = HFModelAdapter(small_llama(torch.bfloat16), backend="native").runner
    assert rows_invariant(runner, SHAPE, VOCAB)
    original = native_llama._Linear.__call__

    def wide_products_differ(self, x):  # a kernel whose rows change with M > 8 (a second kernel class)
        out = original(self, x)
        return out * (1 + 2 ** -6) if x.shape[-2] > 8 else out

    monkeypatch.setattr(native_llama._Linear, "__call__", wide_products_differ)
    assert probe_row_shape(runner, VOCAB) == RowShape(4, 8)  # the first candidate with every M in 4..8
    assert runner.row_shape is None and runner.length == 0  # the probe leaves the runner as it found it

    def rows_differ_by_index(self, x):  # no shape can help: a row's result depends on where it sits
        out = original(self, x)
        return out * (1 + 2 ** -6 * torch.arange(x.shape[-2], dtype=out.dtype)[:, None])

    monkeypatch.setattr(native_llama._Linear, "__call__", rows_differ_by_index)
    assert probe_row_shape(runner, VOCAB) is None


def test_invariant_row_shape_is_cached_per_machine_and_refused_without_one(monkeypatch, tmp_path):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    runner = HFModelAdapter(small_llama(torch.bfloat16), backend="native").runner
    calls = []
    monkeypatch.setattr(row_shape, "probe_row_shape", lambda r, v: calls.append(v) or RowShape(4, 8))
    assert invariant_row_shape(runner, VOCAB) == RowShape(4, 8)
    assert invariant_row_shape(runner, VOCAB) == RowShape(4, 8)
    assert len(calls) == 1  # the second call read the cache
    files = list((tmp_path / "row-shapes").glob("*.json"))
    assert [f.stem for f in files] == [probe_key(runner)]
    files[0].write_text("{broken")  # a damaged cache: probed again
    assert invariant_row_shape(runner, VOCAB) == RowShape(4, 8) and len(calls) == 2
    files[0].write_text(json.dumps({"shape": None}))
    with pytest.raises(ConfigError, match="--dtype fp32"):
        invariant_row_shape(runner, VOCAB)
    monkeypatch.setattr(row_shape, "probe_row_shape", lambda r, v: None)
    with pytest.raises(ConfigError, match="no row shape"):
        invariant_row_shape(runner, VOCAB, use_cache=False)


def test_probe_key_names_what_chooses_the_kernels():
    bf16 = HFModelAdapter(small_llama(torch.bfloat16), backend="native").runner
    fp32 = HFModelAdapter(small_llama(torch.float32), backend="native").runner
    assert probe_key(bf16) != probe_key(fp32)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        other_threads = probe_key(bf16)
    finally:
        torch.set_num_threads(threads)
    assert other_threads != probe_key(bf16)


def test_probe_checks_trees_whose_path_keys_are_apart(monkeypatch):
    """An attention kernel whose result changes when a row's visible keys are not contiguous (bf16
    dot products pair neighbouring keys; fp32 SDPA differs too here). Each row's keys are gathered in
    position order, so trees stay invariant under it; with the keys left in place (a tree's ancestors
    apart in the cache) chains still pass and trees do not, and the probe must say so."""
    adapter = HFModelAdapter(small_llama(torch.bfloat16), backend="native")
    runner = adapter.runner
    attention = native_llama.NativeLlamaRunner._row_attention

    def gaps_change_the_result(self, q, key_cache, value_cache, row_keys, mask):
        out = attention(self, q, key_cache, value_cache, row_keys, mask)
        gaps = (~mask[:, :-1] & mask[:, 1:]).any(-1)  # a hidden key before a visible one
        return out * (1 + 2 ** -6 * gaps.to(out.dtype))[:, None, None]

    def keys_in_place(allowed, key_end):
        real, columns = allowed.shape
        mask = torch.zeros(real, key_end, dtype=torch.bool)
        mask[:, :columns] = allowed
        return torch.arange(key_end).expand(real, key_end), mask

    monkeypatch.setattr(native_llama.NativeLlamaRunner, "_row_attention", gaps_change_the_result)
    assert rows_invariant(runner, SHAPE, VOCAB, prefix_len=40)
    monkeypatch.setattr(native_llama, "_row_keys", keys_in_place)
    assert not rows_invariant(runner, SHAPE, VOCAB, prefix_len=40)
    runner.row_shape = SHAPE
    sizes = [8, 1, 7, 2]
    assert torch.equal(chunked_rows(adapter, sizes), plain_rows(adapter, sum(sizes)))  # chains alone pass


def test_masked_padding_keys_are_zeroed_so_stale_nan_cannot_leak():
    """Entries past the cache length may hold anything (a stale NaN): masked keys get weight 0 and
    0 * NaN = NaN, so the padding up to key_align must be zeroed before attention reads it."""
    model = small_llama(torch.float32)
    clean, dirty = HFModelAdapter(model, backend="native"), HFModelAdapter(model, backend="native")
    for adapter in (clean, dirty):
        adapter.runner.row_shape = SHAPE
        adapter.reset(CHAIN[:PROMPT])
    for cache in dirty.runner.kv.keys + dirty.runner.kv.values:
        cache[:, :, dirty.runner.length:] = float("nan")
    tokens, parents = [-1] + CHAIN[PROMPT : PROMPT + 3], [-1, 0, 1, 1]
    assert torch.equal(dirty.score(tokens, parents), clean.score(tokens, parents))

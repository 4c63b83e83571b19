"""The llama.cpp context parameters the adapter asks for (``models.llamacpp_context``), checked
without loading llama.cpp: a prefill chunk and a round fit one physical batch, the logits buffer
holds a round's rows and at least n_seq_max of them, and the flags the tree layout needs (one
unified cell buffer, full sliding-window caches) are set."""

from types import SimpleNamespace

import pytest

from verispec.models.llamacpp_context import KV_TYPES, ContextSettings

LIB = SimpleNamespace(LLAMA_FLASH_ATTN_TYPE_AUTO=-1, LLAMA_FLASH_ATTN_TYPE_ENABLED=1, LLAMA_FLASH_ATTN_TYPE_DISABLED=0)


def test_one_physical_batch_holds_a_prefill_chunk_or_a_round_within_the_context():
    assert ContextSettings.choose(8192, 63, 512, 64, 1).n_batch == 512
    assert ContextSettings.choose(8192, 600, 512, 64, 1).n_batch == 600
    assert ContextSettings.choose(256, 63, 512, 64, 1).n_batch == 256  # never beyond the context


@pytest.mark.parametrize("round_batch, seqs, outputs", [(63, 64, 64), (63, 8, 63), (100, 1, 100)])
def test_the_logits_buffer_holds_a_round_and_at_least_n_seq_max_rows(round_batch, seqs, outputs):
    assert ContextSettings.choose(8192, round_batch, 512, seqs, 1).n_outputs_max == outputs


@pytest.mark.parametrize("flash, expected", [(None, -1), (True, 1), (False, 0)])
def test_fill_writes_every_setting(flash, expected):
    params = SimpleNamespace()
    ContextSettings.choose(4096, 63, 512, 16, 2, kv_type="f32", flash_attn=flash).fill(LIB, params)
    assert (params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max, params.n_outputs_max) == (4096, 512, 512, 16, 63)
    assert (params.n_threads, params.n_threads_batch) == (2, 2)
    assert params.kv_unified and params.swa_full and params.no_perf
    assert params.type_k == params.type_v == KV_TYPES["f32"]
    assert params.flash_attn_type == expected

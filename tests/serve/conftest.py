"""A real server on a loopback port over tiny random Llamas with the real SmolLM2 tokenizer."""

from __future__ import annotations

import openai
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from verispec.models.default import load_default_tokenizer
from verispec.serve.requests import ServerConfig
from verispec.serve.launch import ServerThread, build_server

MODEL = "tiny-test"


def tiny_llama(seed: int, vocab_size: int, max_positions: int = 4096, logit_scale: float = 3.0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


@pytest.fixture(scope="session")
def tokenizer():
    return load_default_tokenizer()


@pytest.fixture(scope="session")
def tiny_pair(tokenizer):
    vocab = len(tokenizer)
    return tiny_llama(1, vocab), tiny_llama(2, vocab)


def start_server(tiny_pair, tokenizer, workers=2, max_queue=4, method="sd", num_drafts=3, draft_len=4,
                 request_timeout=60.0, on_finished=None, max_context=None, graceful_seconds=5.0, max_request_bytes=4 * 2**20,
                 scheduler="workers", max_batch=8, replicas=1):
    """A server over the tiny pair; the worker threads by default (these tests were written for
    them), ``scheduler="batch"`` for continuous batching (tests/serve/test_batching.py)."""
    target, draft = tiny_pair
    config = ServerConfig(MODEL, method, num_drafts, draft_len, None, max_context or target.config.max_position_embeddings,
                          target.config.vocab_size, default_max_tokens=32, request_timeout=request_timeout, shutdown_grace=5.0,
                          max_request_bytes=max_request_bytes)
    app, pool = build_server(target, draft, tokenizer, config, workers=workers, max_queue=max_queue, threads_per_worker=1,
                             scheduler=scheduler, max_batch=max_batch, replicas=replicas)
    if on_finished is not None:
        pool.on_finished = on_finished  # create_app already chained the metrics hook; wrap it
    return ServerThread(app, graceful_seconds=graceful_seconds).start(), pool


@pytest.fixture(scope="module")
def server(tiny_pair, tokenizer):
    """2 workers, queue 4, default rule sd, largest K = 3, L = 4."""
    handle, pool = start_server(tiny_pair, tokenizer)
    yield handle
    handle.stop()


@pytest.fixture(scope="module")
def client(server):
    """The official ``openai`` client of the module's server."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)

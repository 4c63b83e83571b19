"""The continuous-batching scheduler over a llama.cpp target (the default GGUF): requests sent
together are decoded in the batch (one shared llama.cpp context) and give the text each gives
sent alone, greedy and plain; a request longer than the context fails alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from verispec.models.llamacpp import llamacpp_available
from verispec.serve.launch import ServerThread, build_server
from verispec.serve.requests import ServerConfig

pytestmark = pytest.mark.skipif(llamacpp_available() is not None, reason=str(llamacpp_available()))

MODEL = "default-gguf"
PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time"]


@pytest.fixture(scope="module")
def llamacpp_server(tokenizer):
    config = ServerConfig(MODEL, "qfree", 1, 4, None, 8192, len(tokenizer), default_max_tokens=16, request_timeout=120,
                          shutdown_grace=5.0, max_request_bytes=2**20)
    app, pool = build_server("default", None, tokenizer, config, max_queue=8, threads_per_worker=1, backend="llamacpp",
                             scheduler="batch", max_batch=3)
    handle = ServerThread(app, graceful_seconds=5.0).start()
    yield handle, pool
    handle.stop()


def complete(url: str, prompt, **fields):
    return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 12, **fields}, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("fields", [{"temperature": 0}, {"temperature": 0, "speculative": {"method": "ar"}}])
def test_llamacpp_requests_in_a_batch_give_their_text_alone(llamacpp_server, fields):
    handle, pool = llamacpp_server
    alone = [complete(handle.url, prompt, **fields).json()["choices"][0]["text"] for prompt in PROMPTS]
    rounds_before = pool.batch.rounds
    with ThreadPoolExecutor(4) as executor:
        together = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS + [[1] * 9000]))
    assert [r.status_code for r in together] == [200, 200, 200, 400]
    assert [r.json()["choices"][0]["text"] for r in together[:3]] == alone
    assert all(r.json()["speculative"]["worker"] == 0 for r in together[:3])  # decoded in the batch
    assert pool.batch.rounds > rounds_before
    assert len(set(alone)) > 1

"""Workers, the bounded queue (429 + Retry-After), cancellation on disconnect, the per-request time
limit, graceful shutdown and weight sharing, on real servers over tiny random Llamas."""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from tests.serve.conftest import MODEL, start_server

# plain decoding of a long answer: thousands of rounds, far longer than any wait below
LONG = {"model": MODEL, "prompt": "Go on and on", "max_tokens": 3000, "seed": 4, "speculative": {"method": "ar"}}


def wait_for(condition, timeout: float = 10.0, step: float = 0.01) -> float:
    """Seconds until condition() held; fails the test after ``timeout``."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(step)
    return time.monotonic() - start


def health(url: str) -> dict:
    return httpx.get(url + "/health").json()


@pytest.fixture
def events():
    return []


@pytest.fixture
def single_worker(tiny_pair, tokenizer, events):
    """1 worker, queue 1; records (job, event) of every finished or failed job."""
    handle, pool = start_server(tiny_pair, tokenizer, workers=1, max_queue=1)
    metrics_hook = pool.on_finished
    pool.on_finished = lambda job, event: (metrics_hook(job, event), events.append((job, event)))
    yield handle, pool
    handle.stop()


def test_full_queue_is_429_and_disconnect_frees_the_worker(single_worker, events):
    handle, pool = single_worker
    url = handle.url
    queued_answer = {}

    def queued_request():
        queued_answer["response"] = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 5, "stream": False}, timeout=60)

    with httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as running:
        lines = running.iter_lines()
        assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")  # decoding has begun
        assert health(url)["busy_workers"] == 1
        waiter = threading.Thread(target=queued_request)
        waiter.start()
        wait_for(lambda: health(url)["queue_depth"] == 1)

        refused = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 5})
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        assert refused.json()["error"]["type"] == "rate_limit_error" and refused.json()["error"]["code"] == "rate_limit_exceeded"
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.RateLimitError):
            client.completions.create(model=MODEL, prompt="x", max_tokens=2)
        disconnected_at = time.monotonic()
    # leaving the block closed the connection mid-answer: the decode stops after its round
    wait_for(lambda: any(event.__class__.__name__ == "JobFailed" for _, event in events), timeout=5)
    freed_after = time.monotonic() - disconnected_at
    job, cancelled = next((job, event) for job, event in events if event.__class__.__name__ == "JobFailed")
    assert cancelled.kind == "cancelled" and job.rounds < LONG["max_tokens"]
    assert freed_after < 2.0
    waiter.join(30)
    assert queued_answer["response"].status_code == 200  # the queued request ran next
    assert queued_answer["response"].json()["usage"]["completion_tokens"] == 5
    wait_for(lambda: health(url)["busy_workers"] == 0 and health(url)["queue_depth"] == 0)
    page = httpx.get(url + "/metrics").text
    assert 'verispec_cancellations_total{stream="true"} 1.0' in page  # a disconnect is a cancellation...
    assert 'verispec_errors_total{type="cancelled"}' not in page  # ...not an error


def test_time_limit_returns_the_answer_so_far(tiny_pair, tokenizer):
    handle, _ = start_server(tiny_pair, tokenizer, workers=1, request_timeout=0.3)
    try:
        response = httpx.post(handle.url + "/v1/completions", json=LONG, timeout=60).json()
    finally:
        handle.stop()
    assert response["choices"][0]["finish_reason"] == "length"
    assert response["speculative"]["stop_reason"] == "time_limit"
    assert 0 < response["usage"]["completion_tokens"] < LONG["max_tokens"]
    assert response["speculative"]["decode_seconds"] < 5


def test_graceful_shutdown_finishes_in_flight_requests(tiny_pair, tokenizer):
    handle, pool = start_server(tiny_pair, tokenizer, workers=1)
    answer = {}
    request = {**LONG, "max_tokens": 150}
    worker = threading.Thread(target=lambda: answer.setdefault("r", httpx.post(handle.url + "/v1/completions", json=request, timeout=60)))
    worker.start()
    wait_for(lambda: pool.busy_workers == 1)
    handle.stop()  # uvicorn stops accepting, waits for the request, then the pool shuts down
    worker.join(30)
    assert answer["r"].status_code == 200 and answer["r"].json()["usage"]["completion_tokens"] == 150
    assert not pool.accepting and pool._threads == []
    assert not any(thread.name.startswith("verispec-worker") for thread in threading.enumerate())
    with pytest.raises(httpx.ConnectError):
        httpx.get(handle.url + "/health")


def test_workers_share_weights_but_not_caches(tiny_pair, tokenizer):
    from verispec.serve.launch import build_workers

    target, draft = tiny_pair
    workers = build_workers(target, draft, tokenizer, 3)
    weight = target.model.layers[0].self_attn.q_proj.weight
    for worker in workers:
        assert worker.target.model is target and worker.draft.model is draft
        assert worker.target.model.model.layers[0].self_attn.q_proj.weight.data_ptr() == weight.data_ptr()
    assert len({id(worker.target.runner) for worker in workers}) == 3  # one KV cache each
    assert len({id(worker.draft.runner) for worker in workers}) == 3
    assert len({id(worker.tokenizer) for worker in workers}) == 3


def test_a_workers_requests_share_its_cost_model_and_a_batch_slot_gets_its_own(tiny_pair, tokenizer):
    """The round timings describe the machine: a worker's requests size their drafts from what the
    earlier ones measured; each worker has its own model, and a batch slot's decoder (other adapters)
    starts from the prior."""
    from verispec.serve.launch import build_workers
    from verispec.serve.workers import DecodeSettings

    target, draft = tiny_pair
    first, second = build_workers(target, draft, tokenizer, 2)
    settings = DecodeSettings("sd", 1, 3, None, 0.8, 0, 1.0, 8, (), 0)
    decoder = first.decoder(settings)
    assert decoder.cost_model is first.cost_model is not second.cost_model
    decoder.generate([1, 2, 3, 1, 2, 3])
    assert first.cost_model.readings > 0
    later = first.decoder(settings)
    assert later.cost_model is first.cost_model and later.cost_model.readings > 0
    other_rule = first.decoder(DecodeSettings("bv", 1, 2, None, 0.0, 0, 1.0, 8, (), 3))
    assert other_rule.cost_model is first.cost_model
    slot = first.decoder(settings, target=second.target, draft=second.draft)
    assert slot.cost_model is not first.cost_model and slot.cost_model.readings == 0


def test_workers_share_prepacked_bf16_weights(tokenizer):
    """Where the native runner packs bf16 weights for oneDNN, workers share one packed set."""
    import torch

    from tests.serve.conftest import tiny_llama
    from verispec.models.native_llama import _can_prepack
    from verispec.serve.launch import build_workers

    if not _can_prepack(torch.bfloat16, torch.device("cpu")):
        pytest.skip("this CPU has no oneDNN bf16 weight prepacking (needs AVX-NE-CONVERT or AVX512 BW/VL/DQ): no packed copies to share")
    model = tiny_llama(3, len(tokenizer)).to(torch.bfloat16)
    first, second = build_workers(model, "ngram", tokenizer, 2)
    assert first.target.runner.prepacked and second.target.runner.linears is first.target.runner.linears
    first.target.reset([1, 2, 3])
    second.target.reset([1, 2, 3])
    assert torch.equal(first.target.score([-1], [-1]), second.target.score([-1], [-1]))


def test_non_streamed_client_that_gives_up_frees_the_worker(single_worker, events):
    handle, pool = single_worker
    with pytest.raises(httpx.ReadTimeout):  # the client stops waiting and closes the connection
        httpx.post(handle.url + "/v1/completions", json=LONG, timeout=httpx.Timeout(60, read=1.0))
    gave_up = time.monotonic()
    wait_for(lambda: events, timeout=5)
    job, event = events[0]
    assert event.kind == "cancelled" and job.rounds < LONG["max_tokens"]
    assert time.monotonic() - gave_up < 3.0 and pool.busy_workers == 0


def test_shutdown_cancels_what_outlives_the_grace_period(tiny_pair, tokenizer):
    handle, pool = start_server(tiny_pair, tokenizer, workers=1, graceful_seconds=0.5)
    outcome = {}

    def long_request():
        try:
            outcome["status"] = httpx.post(handle.url + "/v1/completions", json=LONG, timeout=60).status_code
        except httpx.HTTPError as error:  # the server closed the connection
            outcome["error"] = error

    client = threading.Thread(target=long_request)
    client.start()
    wait_for(lambda: pool.busy_workers == 1)
    started = time.monotonic()
    handle.stop()
    assert time.monotonic() - started < 10  # far less than the uncancelled decode
    client.join(30)
    assert outcome.get("status") != 200  # cut off, not answered as if complete
    assert pool.busy_workers == 0 and pool._threads == []

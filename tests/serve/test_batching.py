"""The continuous-batching scheduler (``serve.batching``) on real servers over tiny random Llamas:
requests join the running batch and leave it, stream in order, are cancelled within a round,
hit their time limit, get 429 on a full queue, fail alone on bad input, and give the text the
same request gives alone (seeded and greedy)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve.conftest import MODEL, start_server
from tests.serve.test_concurrency import LONG, health, wait_for
from verispec.errors import ConfigError
from verispec.serve.batching import BatchScheduler

PROMPTS = ["The capital of France is", "def add(a, b):", "Once upon a time", "1, 2, 3, 4,", "Dear Sir,", "import numpy as"]


@pytest.fixture
def events():
    return []


def batch_server(tiny_pair, tokenizer, events=None, draft=None, **options):
    """A batch server over the tiny target; draft None: the engine's drafts (token trees for qfree,
    n-gram for the sampled-draft rules), which batch; the default rule qfree."""
    options = {"method": "qfree", "max_queue": 4, **options}
    handle, pool = start_server((tiny_pair[0], draft), tokenizer, scheduler="batch", **options)
    if events is not None:
        hook = pool.on_finished
        pool.on_finished = lambda job, event: (hook(job, event), events.append((job, event)))
    return handle, pool


@pytest.fixture(scope="module")
def shared(tiny_pair, tokenizer):
    handle, pool = batch_server(tiny_pair, tokenizer, max_batch=4, max_queue=8)
    yield handle, pool
    handle.stop()


def complete(url: str, prompt: str, **fields) -> dict:
    response = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 16, **fields}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("fields", [{"seed": 7, "temperature": 1.0}, {"temperature": 0},
                                    {"seed": 3, "speculative": {"method": "sd"}}, {"seed": 3, "speculative": {"method": "ar"}}])
def test_requests_in_a_batch_give_their_text_alone(shared, fields):
    """Four requests at once (one batch) give each the text it gives sent alone: greedy, and
    seeded with the drafter-invariant q-free rule (token trees), plain decoding (ar), and sd with
    the n-gram draft (nothing shared between sequences)."""
    handle, pool = shared
    alone = [complete(handle.url, prompt, **fields)["choices"][0]["text"] for prompt in PROMPTS[:4]]
    rounds_before = pool.batch.rounds
    with ThreadPoolExecutor(4) as executor:
        together = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS[:4]))
    assert [r["choices"][0]["text"] for r in together] == alone
    assert all(r["speculative"]["worker"] == 0 for r in together)  # decoded in the batch
    assert pool.batch.rounds > rounds_before
    assert len(set(alone)) > 1


def test_batch_rounds_serve_several_requests_and_show_in_metrics(shared):
    handle, pool = shared
    with ThreadPoolExecutor(4) as executor:
        answers = list(executor.map(lambda p: complete(handle.url, p, max_tokens=24, seed=1), PROMPTS[:4]))
    assert all(a["usage"]["completion_tokens"] == 24 for a in answers)
    page = httpx.get(handle.url + "/metrics").text
    sizes = {}
    for line in page.splitlines():
        if line.startswith("verispec_batch_size_bucket"):
            sizes[float(line.split('le="')[1].split('"')[0].replace("+Inf", "inf"))] = float(line.split()[-1])
    assert sizes[1.0] < sizes[float("inf")]  # some rounds decoded more than one request
    assert "verispec_batch_rounds_total" in page and "verispec_batch_last_size" in page
    body = health(handle.url)
    assert body["scheduler"] == "batch" and body["max_batch"] == 4 and body["busy_workers"] == 0


def test_a_request_joins_while_another_runs_and_leaves_first(shared):
    handle, pool = shared
    long_answer = {}
    runner = threading.Thread(target=lambda: long_answer.setdefault("r", complete(handle.url, "Go on", max_tokens=400, seed=2,
                                                                                    speculative={"method": "ar"})))
    runner.start()
    wait_for(lambda: pool.busy_workers == 1)
    started = time.monotonic()
    short = complete(handle.url, "Hi", max_tokens=4, seed=2)
    assert short["usage"]["completion_tokens"] == 4 and runner.is_alive()  # in and out while the long one runs
    runner.join(120)
    assert long_answer["r"]["usage"]["completion_tokens"] == 400
    assert time.monotonic() - started < 120


def test_streamed_deltas_arrive_in_order_and_equal_the_answer(shared):
    handle, _ = shared
    fields = {"seed": 11, "max_tokens": 24}
    plain = complete(handle.url, PROMPTS[2], **fields)["choices"][0]["text"]
    pieces = []
    with httpx.stream("POST", handle.url + "/v1/completions", json={"model": MODEL, "prompt": PROMPTS[2], "stream": True, **fields},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                import json

                chunk = json.loads(line[6:])
                pieces.append(chunk["choices"][0]["text"])
    assert "".join(pieces) == plain and len([p for p in pieces if p]) > 1


def test_full_queue_is_429_and_a_disconnect_leaves_within_a_round(tiny_pair, tokenizer, events):
    handle, pool = batch_server(tiny_pair, tokenizer, events, max_batch=1, max_queue=1)
    url = handle.url
    try:
        queued = {}
        waiter = threading.Thread(target=lambda: queued.setdefault("r", httpx.post(url + "/v1/completions",
                                                                                    json={**LONG, "max_tokens": 5}, timeout=60)))
        with httpx.stream("POST", url + "/v1/completions", json={**LONG, "stream": True}, timeout=60) as running:
            lines = running.iter_lines()
            assert next(line for line in lines if line.startswith("data: ")).startswith("data: {")
            assert health(url)["busy_workers"] == 1
            waiter.start()
            wait_for(lambda: health(url)["queue_depth"] == 1)
            refused = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 5})
            assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["code"] == "rate_limit_exceeded"
            disconnected_at = time.monotonic()
        wait_for(lambda: any(type(event).__name__ == "JobFailed" for _, event in events), timeout=5)
        assert time.monotonic() - disconnected_at < 2.0
        job, failed = next((job, event) for job, event in events if type(event).__name__ == "JobFailed")
        assert failed.kind == "cancelled" and job.rounds < LONG["max_tokens"]
        waiter.join(30)
        assert queued["r"].status_code == 200 and queued["r"].json()["usage"]["completion_tokens"] == 5
        wait_for(lambda: pool.busy_workers == 0 and pool.queue_depth == 0)
        assert 'verispec_cancellations_total{stream="true"} 1.0' in httpx.get(url + "/metrics").text
        assert pool.batch.runner.slots == []  # the cancelled request's slot is free again
    finally:
        handle.stop()


def test_time_limit_returns_the_answer_so_far_and_the_others_finish(tiny_pair, tokenizer):
    handle, _ = batch_server(tiny_pair, tokenizer, request_timeout=0.5)
    try:
        with ThreadPoolExecutor(2) as executor:
            limited = executor.submit(lambda: httpx.post(handle.url + "/v1/completions", json=LONG, timeout=60).json())
            short = executor.submit(complete, handle.url, "Hi", max_tokens=3)
            limited, short = limited.result(), short.result()
    finally:
        handle.stop()
    assert limited["choices"][0]["finish_reason"] == "length" and limited["speculative"]["stop_reason"] == "time_limit"
    assert 0 < limited["usage"]["completion_tokens"] < LONG["max_tokens"]
    assert short["usage"]["completion_tokens"] == 3


def test_bad_prompts_are_refused_alone(shared):
    handle, _ = shared
    with ThreadPoolExecutor(3) as executor:
        good = executor.submit(complete, handle.url, PROMPTS[0], seed=5)
        empty = executor.submit(complete, handle.url, "", max_tokens=3)
        too_long = executor.submit(lambda: httpx.post(handle.url + "/v1/completions",
                                                      json={"model": MODEL, "prompt": [1] * 5000, "max_tokens": 3}, timeout=60))
        good, empty, too_long = good.result(), empty.result(), too_long.result()
    assert too_long.status_code == 400 and too_long.json()["error"]["code"] == "context_length_exceeded"
    assert empty["usage"]["completion_tokens"] == 3  # an empty prompt starts from BOS
    assert good["usage"]["completion_tokens"] == 16


def transformers_draft(tiny_pair):
    """The tiny draft model on the transformers forward, which the batched runner cannot run."""
    from verispec.models.hf import HFModelAdapter

    return HFModelAdapter(tiny_pair[1], backend="transformers")


def test_a_draft_model_request_joins_the_batch(tiny_pair, tokenizer):
    """A draft model on the native runner shares the batch: its requests' draft forwards are
    packed into one forward of the batched draft runner, their target forwards into the batch's;
    each gives the text the worker design gives it alone (sd, L = 4, seeded), and the rounds
    are shared (fewer batched rounds than the requests' rounds together)."""
    handle, pool = batch_server(tiny_pair, tokenizer, draft=tiny_pair[1], method="sd", max_batch=4)
    workers, _ = start_server(tiny_pair, tokenizer, workers=1, method="sd")
    try:
        assert pool.batch.draft_batches
        fields = {"seed": 9, "max_tokens": 12}
        with ThreadPoolExecutor(3) as executor:
            answers = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS[:3]))
        assert all(a["speculative"]["worker"] == 0 and a["usage"]["completion_tokens"] == 12 for a in answers)
        assert [a["choices"][0]["text"] for a in answers] == [complete(workers.url, p, **fields)["choices"][0]["text"] for p in PROMPTS[:3]]
        assert pool.batch.draft_runner is not None and pool.batch.draft_runner.slots == []
        plain = complete(handle.url, PROMPTS[0], speculative={"method": "ar"}, **fields)
        assert plain["speculative"]["worker"] == 0
    finally:
        handle.stop()
        workers.stop()


def test_a_draft_model_off_the_native_runner_is_served_beside_the_batch(tiny_pair, tokenizer):
    """A draft model on the transformers forward cannot share a batched forward: its requests are
    decoded on the side worker, with the same text as the worker design gives them."""
    draft = transformers_draft(tiny_pair)
    handle, pool = batch_server(tiny_pair, tokenizer, draft=draft, method="sd")
    workers, _ = start_server((tiny_pair[0], draft), tokenizer, workers=1, method="sd")
    try:
        assert not pool.batch.draft_batches
        fields = {"seed": 9, "max_tokens": 12}
        with ThreadPoolExecutor(3) as executor:
            answers = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS[:3]))
        assert all(a["speculative"]["worker"] == 1 and a["usage"]["completion_tokens"] == 12 for a in answers)
        assert [a["choices"][0]["text"] for a in answers] == [complete(workers.url, p, **fields)["choices"][0]["text"] for p in PROMPTS[:3]]
        plain = complete(handle.url, PROMPTS[0], speculative={"method": "ar"}, **fields)
        assert plain["speculative"]["worker"] == 0  # plain decoding needs no draft: it batches
    finally:
        handle.stop()
        workers.stop()


def test_targets_the_batch_cannot_run_are_refused_with_advice(tiny_pair, tokenizer):
    from verispec.serve.launch import build_batch_scheduler

    with pytest.raises(ConfigError, match="--scheduler workers"):
        build_batch_scheduler(tiny_pair[0], None, tokenizer, 4, 4, backend="transformers")
    assert isinstance(build_batch_scheduler(tiny_pair[0], None, tokenizer, 2, 4), BatchScheduler)


def test_shutdown_stops_running_requests_and_frees_the_loop(tiny_pair, tokenizer):
    handle, pool = batch_server(tiny_pair, tokenizer, graceful_seconds=30)
    answer = {}
    worker = threading.Thread(target=lambda: answer.setdefault("r", httpx.post(handle.url + "/v1/completions",
                                                                                json={**LONG, "max_tokens": 30}, timeout=60)))
    worker.start()
    wait_for(lambda: pool.busy_workers == 1)
    loop = pool._thread
    handle.stop()  # uvicorn waits for the in-flight request, then the scheduler shuts down
    worker.join(30)
    assert answer["r"].status_code == 200 and answer["r"].json()["usage"]["completion_tokens"] == 30
    assert not pool.accepting and pool._thread is None and not loop.is_alive()
    assert pool.batch.running == [] and pool.batch.waiting == []


def test_qfree_requests_default_to_one_draft_under_a_server_k_of_one():
    """The default rule must be servable with the default -K 1: the token trees size themselves."""
    from types import SimpleNamespace

    from verispec.serve.requests import ServerConfig, resolve_speculative

    config = ServerConfig(MODEL, "qfree", 1, 4, None, 4096, 100)
    assert resolve_speculative(SimpleNamespace(speculative=None), config) == ("qfree", 1, 4, None)


def test_a_side_request_whose_client_left_while_waiting_never_starts(tiny_pair, tokenizer, events):
    handle, pool = batch_server(tiny_pair, tokenizer, events, draft=transformers_draft(tiny_pair), method="sd")
    on_round = pool._on_round

    def slow_round(running, output):  # the tiny pair decodes 3000 tokens in a second or two: slow it down
        time.sleep(0.02)
        return on_round(running, output)

    pool._on_round = slow_round
    try:
        side_long = {**LONG, "speculative": {"method": "sd"}, "stream": True}
        with httpx.stream("POST", handle.url + "/v1/completions", json=side_long, timeout=60) as running:
            lines = running.iter_lines()  # kept: a dropped iterator closes the stream, a disconnect
            next(line for line in lines if line.startswith("data: {"))  # the first side request decodes
            with pytest.raises(httpx.ReadTimeout):  # the second waits behind it; its client gives up
                httpx.post(handle.url + "/v1/completions", json={**side_long, "stream": False, "max_tokens": 5}, timeout=0.5)
            wait_for(lambda: len(pool._side_waiting) == 1 and pool._side_waiting[0].cancelled.is_set())
        wait_for(lambda: len(events) == 2, timeout=10)
        messages = sorted(event.message for _, event in events)
        assert all(type(event).__name__ == "JobFailed" and event.kind == "cancelled" for _, event in events)
        assert messages == ["the client went away", "the client went away before the request started"]
    finally:
        handle.stop()


def test_a_head_request_joins_the_batch(tokenizer, tmp_path):
    """A draft head (``--draft DIR``) batches: its slot of the packed target forward returns its own
    hidden states; each request gives the text the worker design gives it alone (sd, seeded)."""
    from tests.engine.test_head_drafter import tiny_head
    from tests.engine.tiny import tiny_llama
    from verispec.models.eagle_head import save_head

    target = tiny_llama(4, vocab_size=len(tokenizer), layers=5, max_positions=4096)
    head_dir = save_head(tiny_head(target, list(range(len(tokenizer)))), tmp_path / "head")
    pair = (target, str(head_dir))
    handle, pool = batch_server(pair, tokenizer, draft=str(head_dir), method="sd", max_batch=4)
    workers, _ = start_server(pair, tokenizer, workers=1, method="sd")
    try:
        fields = {"seed": 9, "max_tokens": 12}
        with ThreadPoolExecutor(3) as executor:
            answers = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS[:3]))
        assert all(a["speculative"]["worker"] == 0 and a["usage"]["completion_tokens"] == 12 for a in answers)
        assert [a["choices"][0]["text"] for a in answers] == [complete(workers.url, p, **fields)["choices"][0]["text"] for p in PROMPTS[:3]]
    finally:
        handle.stop()
        workers.stop()

"""Property-style fuzzing of both endpoints of a real loopback server (hypothesis): random JSON
bodies, mutated well-formed requests (wrong types, huge ints, NaN, lone surrogates, nested junk,
unknown keys) and raw bytes. Every answer must be < 500; afterwards /health answers within a
second and a well-formed request still succeeds.

CI runs a seeded (derandomized) 240 examples; a long run:
``VERISPEC_FUZZ_EXAMPLES=3000 pytest tests/serve/test_fuzz.py -s`` (prints the tally).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import MODEL, start_server

EXAMPLES = int(os.environ.get("VERISPEC_FUZZ_EXAMPLES", "240"))
ENDPOINTS = ("/v1/completions", "/v1/chat/completions")

# text with everything: lone surrogates, NUL, emoji, combining marks
TEXT = st.text(st.characters(blacklist_categories=()), max_size=40)
NUMBERS = st.one_of(st.integers(), st.sampled_from([2**63, 2**63 - 1, -(2**63), 10**30, -1, 0, 1]),
                    st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, TEXT)
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
                    max_leaves=12)

FIELDS = ["model", "prompt", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "stop",
          "seed", "n", "stream", "stream_options", "speculative", "logprobs", "top_logprobs", "echo", "suffix", "best_of",
          "presence_penalty", "frequency_penalty", "logit_bias", "user", "metadata", "tools", "tool_choice",
          "response_format", "max_token", "speculative.method", "speculative.num_drafts", "speculative.draft_len",
          "speculative.tree", "messages.role", "messages.content"]
PLAUSIBLE = {  # values of the right shape, so mutations reach the deeper checks too
    "prompt": st.one_of(TEXT, st.lists(st.integers(-5, 60000), max_size=6), st.lists(TEXT, max_size=2)),
    "max_tokens": st.integers(-3, 6),
    "temperature": st.floats(-1, 3),
    "stop": st.one_of(TEXT, st.lists(TEXT, max_size=5)),
    "speculative.method": st.sampled_from(["sd", "spectr", "gmpbv", "rrsw", "spechub", "ar", "bv", "qfree", "nope", "sprinter"]),
    "speculative.num_drafts": st.integers(-1, 5),
    "speculative.draft_len": st.integers(-1, 6),
    "speculative.tree": st.lists(st.integers(-1, 4), max_size=6),
    "messages.role": st.sampled_from(["user", "system", "assistant", "developer", "tool", "wizard"]),
    "messages.content": st.one_of(TEXT, st.none(), st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=2)),
}


def base_request(chat: bool) -> dict:
    body = {"model": MODEL, "max_tokens": 4, "seed": 1}
    if chat:
        body["messages"] = [{"role": "user", "content": "hello"}]
    else:
        body["prompt"] = "hello"
    return body


@st.composite
def mutated_request(draw, chat: bool) -> dict:
    body = base_request(chat)
    for _ in range(draw(st.integers(1, 4))):
        field = draw(st.sampled_from(FIELDS))
        value = draw(PLAUSIBLE.get(field, JSON) if draw(st.booleans()) else JSON)
        if draw(st.integers(0, 9)) == 0:
            body.pop(field.split(".")[0], None)  # a required field may go missing
        elif field.startswith("speculative."):
            speculative = body.setdefault("speculative", {})
            if isinstance(speculative, dict):
                speculative[field.split(".")[1]] = value
        elif field.startswith("messages."):
            messages = body.get("messages")
            if isinstance(messages, list) and messages and isinstance(messages[0], dict):
                messages[0][field.split(".")[1]] = value
        else:
            body[field] = value
    return body


def body_bytes(value) -> bytes:
    # ASCII JSON: lone surrogates travel as \\ud800 escapes; NaN / Infinity as Python's json writes them
    return json.dumps(value, ensure_ascii=True).encode("ascii")


REQUESTS = st.tuples(
    st.sampled_from(ENDPOINTS),
    st.one_of(
        st.sampled_from([False, True]).flatmap(lambda chat: mutated_request(chat)).map(body_bytes),
        JSON.map(body_bytes),
        st.binary(max_size=200),
    ),
)


class Probe:
    """/health latencies measured every 0.25 s from a thread while the fuzzing runs."""

    def __init__(self, url: str):
        self.url, self.latencies, self.stop = url, [], threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                client.get(self.url + "/health")
                self.latencies.append(time.monotonic() - started)
                self.stop.wait(0.25)


@pytest.fixture(scope="module", params=["workers", "batch"])
def fuzzed_server(request, tiny_pair, tokenizer):
    """2 workers (or the continuous batch, with the engine's drafts so that requests batch), queue 8,
    decodes cut at 1 s (a valid fuzzed request may ask for many tokens)."""
    if request.param == "batch":
        handle, _ = start_server((tiny_pair[0], None), tokenizer, max_queue=8, request_timeout=1.0, scheduler="batch")
    else:
        handle, _ = start_server(tiny_pair, tokenizer, workers=2, max_queue=8, request_timeout=1.0)
    probe = Probe(handle.url)
    probe.thread.start()
    tally = {"status": Counter(), "slowest": 0.0, "probe": probe}
    yield handle, tally
    probe.stop.set()
    probe.thread.join(5)
    handle.stop()


def test_fuzzed_requests_never_get_a_5xx(fuzzed_server):
    handle, tally = fuzzed_server
    client = httpx.Client(base_url=handle.url, timeout=120)

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example])
    @given(REQUESTS)
    def check(request):
        path, content = request
        started = time.monotonic()
        response = client.post(path, content=content, headers={"content-type": "application/json"})
        tally["slowest"] = max(tally["slowest"], time.monotonic() - started)
        tally["status"][response.status_code] += 1
        assert response.status_code < 500, (path, content[:300], response.text[:500])
        if response.status_code >= 400:
            error = response.json()["error"]
            assert error["message"] and error["type"], response.text

    started = time.monotonic()
    check()
    client.close()
    latencies = tally["probe"].latencies
    print(f"\nfuzz: {sum(tally['status'].values())} requests in {time.monotonic() - started:.0f} s, statuses "
          f"{dict(sorted(tally['status'].items()))}, slowest answer {tally['slowest']:.2f} s, /health probes "
          f"{len(latencies)} (max {max(latencies, default=0):.3f} s)")


def test_server_is_healthy_and_serves_after_fuzzing(fuzzed_server):
    handle, tally = fuzzed_server
    started = time.monotonic()
    assert httpx.get(handle.url + "/health", timeout=5).status_code == 200
    assert time.monotonic() - started < 1.0
    for path in ENDPOINTS:
        response = httpx.post(handle.url + path, json=base_request(chat=path.endswith("chat/completions")), timeout=60)
        assert response.status_code == 200, response.text
        assert response.json()["usage"]["completion_tokens"] >= 1
    metrics = httpx.get(handle.url + "/metrics").text
    assert 'status="5' not in metrics  # no 5xx in the server's own count either

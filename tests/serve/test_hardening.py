"""Hostile input at the real loopback server: lone surrogates, unknown and unsupported fields,
seeds, empty messages, bodies over the size limit, a huge prompt while /health is probed, and
metrics that keep status codes, error types and cancellations apart."""

from __future__ import annotations

import json
import socket
import threading
import time

import httpx
import pytest

from tests.serve.conftest import MODEL, start_server
from tests.serve.test_server import metric_samples

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
USER_HI = [{"role": "user", "content": "hi"}]


def post_raw(url: str, path: str, text: str) -> httpx.Response:
    """POST a JSON text as written (escapes such as \\ud800 reach the server untouched)."""
    return httpx.post(url + path, content=text.encode("ascii"), headers={"content-type": "application/json"}, timeout=60)


def assert_400(response: httpx.Response, param, *fragments: str, code: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error
    assert all(fragment in error["message"] for fragment in fragments), error
    if code is not None:
        assert error["code"] == code, error
    return error


# ------------------------------------------------------------------------------ lone surrogates
SURROGATES = [
    (COMPLETIONS, '{"model": "tiny-test", "prompt": "a\\ud800b", "max_tokens": 2}', "prompt"),
    (COMPLETIONS, '{"model": "tiny-test", "prompt": ["a\\udfffb"], "max_tokens": 2}', "prompt.0"),
    (COMPLETIONS, '{"model": "tiny-test", "prompt": "ok", "stop": ["x", "\\ud800"], "max_tokens": 2}', "stop.1"),
    (COMPLETIONS, '{"model": "tiny-\\ud800", "prompt": "x"}', "model"),
    (CHAT, '{"model": "tiny-test", "messages": [{"role": "user", "content": "hi\\ud800"}]}', "messages.0.content"),
    (CHAT, '{"model": "tiny-test", "messages": [{"role": "user", "content": [{"type": "text", "text": "\\udc00"}]}]}',
     "messages.0.content.0.text"),
    (CHAT, '{"model": "tiny-test", "messages": [{"role": "user", "content": "x"}], "user": "\\ud800"}', "user"),
    (CHAT, '{"model": "tiny-test", "messages": [{"role": "user", "content": "x"}], "metadata": {"k": "\\ud800"}}', "metadata.k"),
]


@pytest.mark.parametrize("path,text,param", SURROGATES, ids=[p for _, _, p in SURROGATES])
def test_lone_surrogate_is_400_naming_the_field(server, path, text, param):
    assert_400(post_raw(server.url, path, text), param, "lone UTF-16 surrogate", code="invalid_text")


def test_unknown_field_named_by_a_surrogate_is_still_a_clean_400(server):
    response = post_raw(server.url, COMPLETIONS, '{"model": "tiny-test", "prompt": "x", "a\\ud800": 1}')
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_surrogate_pair_is_fine(server):
    response = post_raw(server.url, COMPLETIONS, '{"model": "tiny-test", "prompt": "smile \\ud83d\\ude00", "max_tokens": 2}')
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"model": "tiny-test", "prompt": "x", "max_tokens": ' + "9" * 5000 + "}",
                                  '{"model": "tiny-test", "prompt": "x", "metadata": ' + '{"a": ' * 3000 + "1" + "}" * 3001])
def test_unparsable_json_is_400(server, text):
    response = post_raw(server.url, COMPLETIONS, text)
    assert_400(response, None, "could not be parsed", code="invalid_json")


# ---------------------------------------------------------------------------- unknown fields
@pytest.mark.parametrize("path,change,param", [
    (COMPLETIONS, {"max_token": 5}, "max_token"),
    (CHAT, {"max_token": 5}, "max_token"),
    (COMPLETIONS, {"speculative": {"methd": "sd"}}, "speculative.methd"),
    (CHAT, {"messages": [{"role": "user", "content": "x", "colour": "red"}]}, "messages.0.colour"),
    (CHAT, {"stream_options": {"include_usage": True, "extra": 1}}, "stream_options.extra"),
    (COMPLETIONS, {"Str": 1}, "Str"),  # looks like a pydantic type tag: still named
])
def test_unknown_fields_are_400_as_openai_words_it(server, path, change, param):
    body = {"model": MODEL, "max_tokens": 2, **({"prompt": "hi"} if path == COMPLETIONS else {"messages": USER_HI}), **change}
    assert_400(httpx.post(server.url + path, json=body, timeout=60), param, f"Unrecognized request argument supplied: {param}",
               code="unknown_parameter")


def test_openai_client_fields_that_cannot_change_the_answer_are_accepted(client):
    response = client.chat.completions.create(
        model=MODEL, messages=USER_HI, max_tokens=2, seed=1, user="someone", metadata={"run": "a"}, store=False, n=1,
        presence_penalty=0, frequency_penalty=0.0, logprobs=False, tool_choice="none", response_format={"type": "text"},
        stream_options=None, extra_body={"service_tier": "auto", "parallel_tool_calls": True})
    assert response.usage.completion_tokens >= 1
    assert client.completions.create(model=MODEL, prompt="hi", max_tokens=2, user="someone", echo=False, best_of=1).usage


@pytest.mark.parametrize("change,param", [
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"presence_penalty": 0.5}, "presence_penalty"),
])
def test_fields_that_would_change_the_answer_are_400(server, change, param):
    body = {"model": MODEL, "messages": USER_HI, "max_tokens": 2, **change}
    assert_400(httpx.post(server.url + CHAT, json=body, timeout=60), param, param, "not supported", code="unsupported_parameter")


@pytest.mark.parametrize("message", [{"role": "user"}, {"role": "user", "content": None}, {"role": "assistant", "content": None}])
def test_message_without_content_is_400(server, message):
    body = {"model": MODEL, "messages": [*USER_HI, message], "max_tokens": 2}
    assert_400(httpx.post(server.url + CHAT, json=body, timeout=60), f"messages.1.content")


# ------------------------------------------------------------------------------------- seeds
@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, True, 1.5, "7", None], ids=repr)
def test_bad_seed_is_400(server, seed):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "seed": seed}
    if seed is None:  # null is "no seed": a random one
        response = httpx.post(server.url + COMPLETIONS, json=body, timeout=60)
        assert response.status_code == 200 and 0 <= response.json()["speculative"]["seed"] < 2**63
        return
    assert_400(httpx.post(server.url + COMPLETIONS, json=body, timeout=60), "seed")


def test_largest_seed_is_kept_exactly(client):
    for seed in (0, 2**63 - 1):
        response = client.completions.create(model=MODEL, prompt="hi", max_tokens=2, seed=seed)
        assert response.model_extra["speculative"]["seed"] == seed


# -------------------------------------------------------------------------------- body limit
@pytest.fixture(scope="module")
def small_limit_server(tiny_pair, tokenizer):
    handle, _ = start_server(tiny_pair, tokenizer, workers=1, max_request_bytes=4096)
    yield handle
    handle.stop()


def raw_exchange(handle, head: bytes, body_parts=(), wait: float = 10.0) -> bytes:
    """Send a request head and body parts on a raw socket and read until the server closes."""
    with socket.create_connection((handle.host, handle.port), timeout=wait) as sock:
        sock.sendall(head)
        for part in body_parts:
            sock.sendall(part)
        received = b""
        while chunk := sock.recv(65536):
            received += chunk
    return received


def check_413(answer: bytes) -> None:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), answer[:200]
    error = json.loads(body)["error"]
    assert "4096 bytes" in error["message"] and "--max-request-bytes" in error["message"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"


def test_declared_length_over_the_limit_is_413_before_reading(small_limit_server):
    head = (f"POST {COMPLETIONS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {20 * 2**20}\r\n\r\n").encode()
    started = time.monotonic()
    check_413(raw_exchange(small_limit_server, head))  # not one byte of the 20 MB body was sent
    assert time.monotonic() - started < 5


def test_chunked_body_over_the_limit_is_413_while_reading(small_limit_server):
    head = f"POST {COMPLETIONS} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode()
    chunk = b"x" * 1000
    # 5 chunks (5000 bytes) and no terminating chunk: the server answers without waiting for the end
    check_413(raw_exchange(small_limit_server, head, [b"%x\r\n%s\r\n" % (len(chunk), chunk)] * 5))


def test_body_within_the_limit_still_works(small_limit_server):
    response = httpx.post(small_limit_server.url + COMPLETIONS, json={"model": MODEL, "prompt": "hi " * 500, "max_tokens": 2}, timeout=60)
    assert response.status_code == 200, response.text
    too_big = httpx.post(small_limit_server.url + COMPLETIONS, json={"model": MODEL, "prompt": "hi " * 2000, "max_tokens": 2}, timeout=60)
    assert too_big.status_code == 413
    samples = metric_samples(small_limit_server.url)
    assert samples[("verispec_requests_total", frozenset({"endpoint": COMPLETIONS, "status": "413"}.items()))] >= 1
    assert samples[("verispec_errors_total", frozenset({"type": "request_too_large"}.items()))] >= 1


# ---------------------------------------------------------------- the event loop stays free
def test_health_answers_while_a_huge_prompt_is_tokenized(tiny_pair, tokenizer):
    handle, _ = start_server(tiny_pair, tokenizer, workers=1, max_request_bytes=16 * 2**20)
    prompt = "word " * 300_000  # 1.5M characters: seconds of tokenization on a busy 2-core machine
    answer = {}

    def big_request():
        answer["response"] = httpx.post(handle.url + COMPLETIONS, json={"model": MODEL, "prompt": prompt, "max_tokens": 2}, timeout=300)

    try:
        sender = threading.Thread(target=big_request)
        sender.start()
        latencies, small_answered_during = [], False
        while sender.is_alive():
            started = time.monotonic()
            assert httpx.get(handle.url + "/health", timeout=10).status_code == 200
            latencies.append(time.monotonic() - started)
            if len(latencies) == 3:  # another request is prepared (tokenized) meanwhile too
                small = httpx.post(handle.url + COMPLETIONS, json={"model": MODEL, "prompt": "hi", "max_tokens": 2}, timeout=60)
                assert small.status_code == 200, small.text
                small_answered_during = sender.is_alive()
            time.sleep(0.05)
        sender.join()
    finally:
        handle.stop()
    assert_400(answer["response"], "prompt", code="context_length_exceeded")
    assert len(latencies) >= 3, "the big request ended too fast to probe /health while it was prepared"
    assert max(latencies) < 1.0, latencies
    assert small_answered_during, "a small request waited for the huge prompt's tokenization"


# ------------------------------------------------------------------------------------ metrics
def test_error_metrics_carry_types_and_disconnects_are_cancellations(server):
    assert httpx.get(server.url + "/v1/nowhere").status_code == 404
    assert httpx.get(server.url + COMPLETIONS).status_code == 405
    # a non-streamed request whose client gives up: its decode is cancelled, nobody gets an error
    long_body = {"model": MODEL, "prompt": "Go on", "max_tokens": 3000, "seed": 4, "speculative": {"method": "ar"}}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + COMPLETIONS, json=long_body, timeout=httpx.Timeout(60, read=1.0))
    deadline = time.monotonic() + 20
    while True:
        samples = metric_samples(server.url)
        if samples.get(("verispec_cancellations_total", frozenset({"stream": "false"}.items())), 0) >= 1:
            break
        assert time.monotonic() < deadline, "the disconnect was not counted as a cancellation"
        time.sleep(0.1)
    error_types = {dict(labels)["type"] for name, labels in samples if name == "verispec_errors_total"}
    assert {"not_found", "method_not_allowed"} <= error_types
    assert not any(t.isdigit() for t in error_types) and "cancelled" not in error_types

"""The real server on a loopback port (tiny random Llamas, the real SmolLM2 tokenizer), called with
the official ``openai`` client and raw HTTP: answers, streams, the speculative block, errors."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import MODEL

SPECULATIVE_KEYS = {"method", "num_drafts", "draft_len", "block_efficiency", "target_calls", "draft_calls",
                    "accepted_lengths", "accepted_length_histogram", "draft_seconds", "target_seconds",
                    "verify_seconds", "stop_reason", "seed"}


def metric_samples(url: str) -> dict:
    """{(name, frozenset(labels)): value} of the /metrics page."""
    text = httpx.get(url + "/metrics").text
    return {(s.name, frozenset(s.labels.items())): s.value for family in text_string_to_metric_families(text) for s in family.samples}


def check_speculative(block: dict, completion_tokens: int, method: str):
    assert SPECULATIVE_KEYS <= set(block)
    assert block["method"] == method
    taus = block["accepted_lengths"]
    assert len(taus) == block["target_calls"] == sum(block["accepted_length_histogram"])
    assert len(block["accepted_length_histogram"]) == block["draft_len"] + 1
    assert all(0 <= tau <= block["draft_len"] for tau in taus)
    assert block["block_efficiency"] == pytest.approx(completion_tokens / block["target_calls"])
    # each round emits tau + 1 tokens; the last round may be cut at max_tokens / EOS
    assert sum(taus) + len(taus) >= completion_tokens > sum(taus[:-1]) + len(taus) - 1
    assert min(block["draft_seconds"], block["target_seconds"], block["verify_seconds"]) >= 0


# ------------------------------------------------------------------------------- happy paths
def test_health_and_models(server, client):
    health = httpx.get(server.url + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok" and health.json()["workers"] == 2
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL


def test_completion_fields(client):
    response = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, seed=5)
    assert response.object == "text_completion" and response.id.startswith("cmpl-") and response.model == MODEL
    assert response.created > 0
    (choice,) = response.choices
    assert choice.index == 0 and choice.finish_reason in ("stop", "length") and isinstance(choice.text, str)
    usage = response.usage
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens and 1 <= usage.completion_tokens <= 12
    assert (choice.finish_reason == "length") == (usage.completion_tokens == 12)
    check_speculative(response.model_extra["speculative"], usage.completion_tokens, "sd")


def test_chat_fields_and_per_request_rule(client):
    response = client.chat.completions.create(
        model=MODEL, messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}],
        max_tokens=10, seed=2, temperature=0.8, top_p=0.9, extra_body={"top_k": 50, "speculative": {"method": "spectr", "num_drafts": 3, "draft_len": 2}},
    )
    assert response.object == "chat.completion" and response.id.startswith("chatcmpl-")
    (choice,) = response.choices
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    block = response.model_extra["speculative"]
    assert (block["num_drafts"], block["draft_len"]) == (3, 2)
    check_speculative(block, response.usage.completion_tokens, "spectr")


@pytest.mark.parametrize("speculative", [{"method": "ar"}, {"method": "gmpbv", "num_drafts": 2}, {"method": "rrsw", "tree": [2, 2, 1]},
                                          {"method": "spechub"}, {"method": "bv", "draft_len": 1}])
def test_rules_and_shapes(client, speculative):
    response = client.completions.create(model=MODEL, prompt="abc", max_tokens=8, seed=1, extra_body={"speculative": speculative})
    block = response.model_extra["speculative"]
    check_speculative(block, response.usage.completion_tokens, speculative["method"])
    if speculative["method"] == "ar":
        assert block["target_calls"] == response.usage.completion_tokens and block["block_efficiency"] == 1.0
    if "tree" in speculative:
        assert block["tree"] == speculative["tree"]


def test_same_seed_same_answer_on_either_worker(client):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:  # 4 at once on 2 workers: both decode
        responses = list(pool.map(lambda _: client.completions.create(model=MODEL, prompt="x y z", max_tokens=16, seed=11), range(4)))
    assert len({r.choices[0].text for r in responses}) == 1
    assert {r.model_extra["speculative"]["worker"] for r in responses} == {0, 1}


def collect_stream(stream, chat: bool):
    pieces, last = [], None
    for chunk in stream:
        if not chunk.choices:  # the usage chunk
            last = chunk
            continue
        choice = chunk.choices[0]
        pieces.append((choice.delta.content if chat else choice.text) or "")
        if choice.finish_reason is not None:
            finished = chunk
    return "".join(pieces), finished, last


@pytest.mark.parametrize("chat", [False, True])
@pytest.mark.parametrize("stop", [None, [" a", "e"]])
def test_streamed_deltas_equal_the_answer(client, chat, stop):
    kwargs = dict(model=MODEL, max_tokens=40, seed=9, stop=stop, extra_body={"speculative": {"method": "gmpbv", "num_drafts": 3}})
    if chat:
        create, kwargs["messages"] = client.chat.completions.create, [{"role": "user", "content": "Tell me something"}]
    else:
        create, kwargs["prompt"] = client.completions.create, "Tell me something"
    whole = create(**kwargs)
    text, finished, usage_chunk = collect_stream(create(stream=True, stream_options={"include_usage": True}, **kwargs), chat)
    expected = whole.choices[0].message.content if chat else whole.choices[0].text
    assert text == expected
    assert finished.choices[0].finish_reason == whole.choices[0].finish_reason
    assert finished.object == ("chat.completion.chunk" if chat else "text_completion")
    assert finished.model_extra["speculative"]["accepted_lengths"] == whole.model_extra["speculative"]["accepted_lengths"]
    assert usage_chunk.usage.completion_tokens == whole.usage.completion_tokens
    if stop:
        assert not any(s in text for s in stop)


def test_raw_sse_format(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hey"}], "max_tokens": 6, "stream": True, "seed": 1}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in lines[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert len({c["id"] for c in chunks}) == 1 and all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] in ("stop", "length")
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


# ---------------------------------------------------------------------------------- errors
BAD_REQUESTS = [
    ({"speculative": {"method": "nope"}}, "speculative.method"),
    ({"speculative": {"method": "spectr", "num_drafts": 4}}, "speculative.num_drafts"),  # server's K is 3
    ({"speculative": {"method": "spectr", "num_drafts": 0}}, "speculative.num_drafts"),
    ({"speculative": {"draft_len": 5}}, "speculative.draft_len"),  # server's L is 4
    ({"speculative": {"method": "sd", "num_drafts": 2}}, "speculative"),  # a chain rule with K = 2 (engine check)
    ({"speculative": {"method": "sprinter"}}, "speculative.method"),
    ({"speculative": {"methd": "sd"}}, "speculative.methd"),
    ({"temperature": -0.5}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"temperature": "hot"}, "temperature"),
    ({"stop": 7}, "stop"),
    ({"n": 2}, "n"),
    ({"logprobs": 2}, "logprobs"),
    ({"prompt": [1, 2, 10**9]}, "prompt"),
    ({"prompt": list(range(100, 4195))}, "prompt"),  # 4095 tokens: no room left in the 4096-token context
    ({"prompt": None}, "prompt"),
]


@pytest.mark.parametrize("change,param", BAD_REQUESTS, ids=[p for _, p in BAD_REQUESTS])
def test_bad_parameters_are_400(server, change, param):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 4, **change}
    response = httpx.post(server.url + "/v1/completions", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"]


def test_openai_client_raises_bad_request_with_the_message(client):
    with pytest.raises(openai.BadRequestError, match="num_drafts must lie in"):
        client.completions.create(model=MODEL, prompt="hi", extra_body={"speculative": {"method": "spectr", "num_drafts": 9}})
    with pytest.raises(openai.BadRequestError, match="context"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "word " * 5000}])


@pytest.mark.parametrize("content,headers", [(b'{"model": "tiny-test", "prompt": ', {"content-type": "application/json"}),
                                             (b"[1, 2]", {"content-type": "application/json"}),
                                             (b"not json", {})])
def test_malformed_json_is_400(server, content, headers):
    response = httpx.post(server.url + "/v1/completions", content=content, headers=headers)
    assert response.status_code == 400 and response.json()["error"]["type"] == "invalid_request_error"


def test_chat_wrong_types_are_400(server):
    for messages in ("hello", [{"role": "user", "content": 5}], [{"role": "wizard", "content": "x"}], []):
        response = httpx.post(server.url + "/v1/chat/completions", json={"model": MODEL, "messages": messages})
        assert response.status_code == 400, (messages, response.text)


def test_unknown_model_is_404(server, client):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt="hi")
    response = httpx.post(server.url + "/v1/chat/completions", json={"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
    assert httpx.get(server.url + "/v1/nowhere").status_code == 404


def test_metrics_page(server, client):
    client.completions.create(model=MODEL, prompt="metrics", max_tokens=5, seed=3, extra_body={"speculative": {"method": "gmpbv", "num_drafts": 2}})
    samples = metric_samples(server.url)

    def value(name, **labels):
        return samples.get((name, frozenset(labels.items())), 0.0)

    assert value("verispec_requests_total", endpoint="/v1/completions", status="200") >= 1
    assert value("verispec_requests_total", endpoint="/v1/completions", status="400") >= len(BAD_REQUESTS)
    assert value("verispec_block_efficiency_count", method="gmpbv") >= 1
    assert value("verispec_accepted_length_count", method="gmpbv") >= 1
    assert value("verispec_completion_tokens_total", method="gmpbv") >= 1
    assert value("verispec_errors_total", type="out_of_range") >= 1
    assert value("verispec_queue_depth") == 0 and value("verispec_busy_workers") == 0
    # bad input never made a 500
    assert not any(name == "verispec_requests_total" and dict(labels)["status"].startswith("5") for name, labels in samples)

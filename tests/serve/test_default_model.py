"""The server over the embedded default target (SmolLM2-135M-Instruct) and its default draft."""

from __future__ import annotations

import openai
import pytest

from verispec.cli.generate import load_pair
from verispec.cli.serve import served_name
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt
from verispec.serve.requests import ServerConfig
from verispec.serve.launch import ServerThread, build_server

QUESTION = "What is the capital of France?"


@pytest.mark.slow
def test_default_model_chat_stream_and_speculative_block():
    target, tokenizer, draft = load_pair(None, None, "fp32", "cpu")
    name = served_name(None)
    config = ServerConfig(name, "sd", 2, 4, None, target.config.max_position_embeddings, target.config.vocab_size)
    app, _ = build_server(target, draft, tokenizer, config, workers=1, max_queue=2, threads_per_worker=1)
    handle = ServerThread(app).start()
    try:
        client = openai.OpenAI(base_url=handle.url + "/v1", api_key="unused", max_retries=0, timeout=120)
        kwargs = dict(model=name, messages=[{"role": "user", "content": QUESTION}], max_tokens=12, temperature=0)
        whole = client.chat.completions.create(**kwargs)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(stream=True, **kwargs))
    finally:
        handle.stop()
    answer = whole.choices[0].message.content
    assert "Paris" in answer and streamed == answer
    block = whole.model_extra["speculative"]
    assert block["method"] == "sd" and block["target_calls"] >= 1 and block["block_efficiency"] >= 1
    # the server's answer is the engine's answer for the same prompt and rule (greedy: seed-free)
    engine = SpeculativeDecoder(target, draft, tokenizer=tokenizer, method="sd", draft_len=4, temperature=0, max_new_tokens=12)
    assert engine.generate(encode_prompt(tokenizer, QUESTION)).text == answer

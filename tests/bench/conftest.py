"""Fixtures of the benchmark tests: the tiny random Llama pair, a character tokenizer for it and a
hand-made two-prompt Spec-Bench-format dataset."""

import json

import pytest

from tests.engine.tiny import tiny_llama

VOCAB = 16


class CharTokenizer:
    """Maps characters onto the tiny models' vocabulary (prompts truncated to 24 tokens)."""

    eos_token_id = None
    chat_template = None

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % VOCAB for c in text[:24]]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + int(i)) for i in ids)


@pytest.fixture(scope="session")
def tiny_pair():
    """(target, draft, tokenizer): fp32 random Llamas sharing a 16-token vocabulary."""
    target = tiny_llama(0, vocab_size=VOCAB, layers=2, logit_scale=2.0)
    draft = tiny_llama(1, vocab_size=VOCAB, layers=1, logit_scale=2.0)
    return target, draft, CharTokenizer()


@pytest.fixture
def two_prompt_jsonl(tmp_path):
    path = tmp_path / "two_prompts.jsonl"
    records = [
        {"question_id": 1, "category": "writing", "turns": ["Write a short poem about the sea.", "again"]},
        {"question_id": 2, "category": "math", "turns": ["What is 17 times 23?"]},
    ]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    return path

"""Greedy decoding (temperature 0): every lossless rule returns exactly the target's own greedy
output, token for token, on the real default target in fp32 (issue 3). The default n-gram draft
is used greedily and with its own temperature 1 (so multi-draft rules draw distinct drafts)."""

import pytest
import torch

from tests.engine.tiny import greedy_draft_shape, plain_greedy_outputs
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_default_target
from verispec.verify.registry import METHODS

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "List three colours of the rainbow.",
    "def is_prime(n):\n    \"\"\"Return True if n is prime.\"\"\"\n",
]
NEW_TOKENS = 24
LOSSLESS = [name for name, spec in METHODS.items() if spec.lossless and name != "otm"]


@pytest.fixture(scope="module")
def default_target():
    torch.manual_seed(0)
    model, tokenizer = load_default_target(torch.float32)
    prompts = [encode_prompt(tokenizer, text) for text in PROMPTS]
    return model, prompts, plain_greedy_outputs(model, prompts, NEW_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("draft_temperature", [None, 1.0], ids=["greedy-draft", "sampled-draft"])
@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_rules_reproduce_greedy_target_output(default_target, method, draft_temperature):
    model, prompts, references = default_target
    decoder = SpeculativeDecoder(
        model, "ngram", method=method, temperature=0, draft_temperature=draft_temperature,
        max_new_tokens=NEW_TOKENS, eos_token_id=[], seed=3, **greedy_draft_shape(method),
    )
    for ids, reference in zip(prompts, references):
        assert decoder.generate(ids).token_ids == reference

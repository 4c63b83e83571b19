"""The engine on Gemma 3 (sliding-window layers, issue 14).

* Greedy: every lossless rule returns exactly the target's own greedy output on the real Gemma 3
  270M in fp32 (V = 262,144), with the n-gram draft; few prompts and tokens, since each round
  verifies dense rows of 262k entries. Skipped, saying why, without the optional ``gemma`` extra.
* Sampling: the law of the first tokens of three lossless rules (chain, multi-path, tree) on a
  tiny random Gemma 3 pair whose window (2) is shorter than the prompt matches plain sampling, by
  the chi-square test of test_engine_exactness.py; the published SpecTr-GBV must be rejected.
"""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from tests.engine.test_engine_exactness import FALSE_ALARM, chi_square_pvalue
from tests.engine.tiny import exact_first_tokens_law, greedy_draft_shape, plain_greedy_outputs, sample_first_tokens
from verispec.engine.decoder import SpeculativeDecoder
from verispec.models.default import encode_prompt, load_model
from verispec.models.gemma import gemma_available
from verispec.verify.registry import METHODS

PROMPTS = [
    "The three primary colours are",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]
NEW_TOKENS = 12
LOSSLESS = [name for name, spec in METHODS.items() if spec.lossless and name != "otm"]


@pytest.fixture(scope="module")
def gemma_target():
    reason = gemma_available()
    if reason is not None:
        pytest.skip(reason)
    torch.manual_seed(0)
    model, tokenizer = load_model("gemma3-270m", torch.float32)
    prompts = [encode_prompt(tokenizer, text, chat=False) for text in PROMPTS]
    return model, prompts, plain_greedy_outputs(model, prompts, NEW_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("method", LOSSLESS)
def test_lossless_rules_reproduce_greedy_gemma_output(gemma_target, method):
    model, prompts, references = gemma_target
    # A sampled n-gram draft (temperature 1), so that multi-draft rules draw distinct drafts.
    decoder = SpeculativeDecoder(
        model, "ngram", method=method, temperature=0, draft_temperature=1.0,
        max_new_tokens=NEW_TOKENS, eos_token_id=[], seed=3, **greedy_draft_shape(method),
    )
    for ids, reference in zip(prompts, references):
        assert decoder.generate(ids).token_ids == reference


# ------------------------------------------------------------- tiny Gemma 3, chi-square

PROMPT = [1, 2, 3, 4, 5]
NUM_TOKENS = 2
SAMPLES = 1200
WINDOW = 2


def tiny_gemma3(seed: int, layers: int = 2, vocab_size: int = 6):
    """A random Gemma 3 with alternating sliding (window 2) and full layers, peaked outputs."""
    config = Gemma3TextConfig(
        vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
        sliding_window=WINDOW, max_position_embeddings=64,
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)],
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    model.config._attn_implementation = "sdpa"
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module")
def gemma_pair():
    target, draft = tiny_gemma3(0), tiny_gemma3(5, layers=1)
    return target, draft, exact_first_tokens_law(target, PROMPT, NUM_TOKENS)


CASES = {
    "sd": dict(method="sd", num_drafts=1, draft_len=2),
    "spectr": dict(method="spectr", num_drafts=2, draft_len=2),
    "rrs-tree": dict(method="rrs", tree=[3, 1]),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_lossless_rules_sample_the_tiny_gemma_law(gemma_pair, case):
    target, draft, law = gemma_pair
    counts = sample_first_tokens(target, draft, PROMPT, NUM_TOKENS, SAMPLES, **CASES[case])
    assert chi_square_pvalue(counts, law, SAMPLES) > FALSE_ALARM


@pytest.mark.slow
def test_published_spectr_gbv_is_detectably_off_on_tiny_gemma(gemma_pair):
    target, draft, law = gemma_pair
    counts = sample_first_tokens(target, draft, PROMPT, NUM_TOKENS, SAMPLES, method="spectr-gbv", num_drafts=2, draft_len=2)
    assert chi_square_pvalue(counts, law, SAMPLES) < FALSE_ALARM

"""NativeLlamaRunner: the same logits as transformers' forward, for the Llama variants it accepts."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

from verispec.errors import ConfigError
from verispec.models.default_draft import SubVocabLlamaConfig, SubVocabLlamaForCausalLM
from verispec.models.hf import HFModelAdapter, TransformersRunner
from verispec.models.native_llama import NativeLlamaRunner, _can_prepack, supports

VOCAB = 48
ATOL = 1e-5


def llama(**overrides):
    settings = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    settings.update(overrides)
    torch.manual_seed(1)
    return AutoModelForCausalLM.from_config(LlamaConfig(**settings), attn_implementation="sdpa").eval()


def subvocab_draft():
    config = SubVocabLlamaConfig(vocab_size=VOCAB, sub_vocab_size=20, hidden_size=32, intermediate_size=48,
                                 num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                                 max_position_embeddings=256)
    torch.manual_seed(2)
    model = SubVocabLlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.token_ids.copy_(torch.arange(0, 40, 2))
        model.lm_head.weight.normal_()
    return model


VARIANTS = {
    "gqa": lambda: llama(),
    "mha-tied": lambda: llama(num_key_value_heads=4, tie_word_embeddings=True),
    "biases": lambda: llama(attention_bias=True, mlp_bias=True),
    "head-dim-16": lambda: llama(head_dim=16),
    "llama3-rope": lambda: llama(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                                  "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                  "original_max_position_embeddings": 64}),
    "subvocab-draft": subvocab_draft,
}


@torch.no_grad()
def reference(model, ids):
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def assert_rows_close(actual, expected):
    finite = torch.isfinite(expected)
    assert torch.equal(finite, torch.isfinite(actual)), "-inf entries differ"
    torch.testing.assert_close(actual[finite], expected[finite], atol=ATOL, rtol=0)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_tree_rounds_match_transformers_forward(variant):
    model = VARIANTS[variant]()
    assert supports(model) is None
    adapter = HFModelAdapter(model, backend="native")
    assert isinstance(adapter.runner, NativeLlamaRunner)
    adapter.runner = NativeLlamaRunner(model, initial_capacity=4)  # so the cache grows several times
    prompt = [5, 17, 3, 9, 30, 2, 11]
    adapter.reset(prompt)
    # a tree: root, two children of the root, a grandchild under the second
    logits = adapter.extend([-1, 7, 8, 9], [-1, 0, 0, 2])
    for row, path in zip(logits, [[], [7], [8], [8, 9]]):
        assert_rows_close(row, reference(model, prompt + path))
    adapter.commit([2, 3], next_token=4)  # keeps 8, 9; 4 is the new root
    context = prompt + [8, 9, 4]
    logits = adapter.extend([-1, 6], [-1, 0])  # a chain step; then a single-query extension
    more = adapter.extend([1], [1])
    assert_rows_close(logits[0], reference(model, context))
    assert_rows_close(logits[1], reference(model, context + [6]))
    assert_rows_close(more[0], reference(model, context + [6, 1]))
    adapter.commit([1, 2], next_token=3)
    adapter.append_committed([12, 13], next_token=14)  # pending tail rides along with the next forward
    logits = adapter.extend([-1], [-1])
    assert_rows_close(logits[0], reference(model, context + [6, 1, 3, 12, 13, 14]))
    assert adapter.runner.seq_length() == adapter.committed_len + 1


def test_bf16_native_equals_transformers_runner():
    model = llama().to(torch.bfloat16)
    native, hf = HFModelAdapter(model, backend="native"), HFModelAdapter(model, backend="transformers")
    for adapter in (native, hf):
        adapter.reset([1, 2, 3, 4, 5])
    a, b = native.extend([-1, 6, 7], [-1, 0, 1]), hf.extend([-1, 6, 7], [-1, 0, 1])
    torch.testing.assert_close(a, b, atol=0.05, rtol=0)


@pytest.mark.parametrize("dtype, atol", [(torch.bfloat16, 1e-2), (torch.float32, 1e-5)])
def test_prepacked_weights_give_the_same_logits(dtype, atol):
    """bf16 and fp32 are packed for oneDNN by default where the ops exist (fp32: MKL's sgemm ran m
    rows as m matrix-vector products on a Zen 5); the logits match F.linear's to rounding."""
    if not _can_prepack(dtype, torch.device("cpu")):
        pytest.skip(f"this torch build has no oneDNN {dtype} linear (prepacking is then off)")
    model = llama(hidden_size=64, intermediate_size=160).to(dtype)
    packed, plain = NativeLlamaRunner(model), NativeLlamaRunner(model, prepack=False)
    assert packed.prepacked and not plain.prepacked and packed.head is not None
    ids = [3, 1, 4, 1, 5, 9, 2, 6]
    a, b = packed.forward(ids, list(range(8)), None, keep=8), plain.forward(ids, list(range(8)), None, keep=8)
    torch.testing.assert_close(a, b, atol=atol, rtol=0)
    assert NativeLlamaRunner(llama().to(torch.float64)).prepacked is False  # float64: F.linear on the module weights


def test_runners_of_one_model_share_packed_weights():
    """share_weights_from (the server's workers): the second runner multiplies with the first's packed
    weights, with unchanged logits; runners of another model, or unpacked ones, are left alone."""
    if not _can_prepack(torch.float32, torch.device("cpu")):
        pytest.skip("this torch build has no oneDNN packed linear")
    model = llama()
    first, second = NativeLlamaRunner(model, prepack=True), NativeLlamaRunner(model, prepack=True)
    ids, positions = [3, 1, 4, 1, 5, 9, 2, 6], list(range(8))
    own = second.forward(ids, positions, None, keep=8)
    assert second.linears is not first.linears
    assert second.share_weights_from(first)
    assert second.linears is first.linears and second.head is first.head is not None
    second.reset()
    assert torch.equal(second.forward(ids, positions, None, keep=8), own)

    other = NativeLlamaRunner(llama(), prepack=True)  # same shapes, another model
    assert not other.share_weights_from(first) and other.linears is not first.linears
    plain = NativeLlamaRunner(model, prepack=False)
    assert not plain.share_weights_from(first) and plain.linears is not first.linears
    assert not first.share_weights_from(plain) and first.linears[0][0].packed  # keeps its packed set


def test_output_layer_hooks_still_fire():
    # SPRINTER's feature extractor reads the hidden states through a pre-hook on the output layer.
    model = llama()
    seen = []
    handle = model.lm_head.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    try:
        adapter = HFModelAdapter(model, backend="native")
        adapter.reset([1, 2, 3])
        adapter.extend([-1, 4, 5], [-1, 0, 1])
    finally:
        handle.remove()
    assert seen[-1] == (1, 3, 32)


def tiny_gpt2():
    config = GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    return AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()


def test_backend_choice_and_errors():
    gpt2 = tiny_gpt2()
    assert "not a Llama-architecture model" in supports(gpt2)
    assert isinstance(HFModelAdapter(gpt2).runner, TransformersRunner)  # auto falls back
    assert HFModelAdapter(gpt2).backend == "transformers"
    with pytest.raises(ConfigError, match="backend='native' cannot run this model: GPT2LMHeadModel"):
        HFModelAdapter(gpt2, backend="native")
    with pytest.raises(ConfigError, match="backend must be one of auto, native, transformers"):
        HFModelAdapter(llama(), backend="fast")
    assert HFModelAdapter(llama()).backend == "native"
    assert "hidden_act" in supports(llama(hidden_act="gelu"))

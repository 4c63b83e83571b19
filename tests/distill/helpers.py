"""Fixtures for the draft tooling: tiny Llamas with a matching word-level tokenizer, and
'constant' Llamas whose next-token logits are the same given any context (hand-computable alpha)."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from tests.engine.tiny import tiny_llama


def word_tokenizer(vocab_size: int, prefix: str = "w") -> PreTrainedTokenizerFast:
    """A whitespace word-level tokenizer over tokens <pad> <eos> w2 w3 ... (unknown words -> w2)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, **{f"{prefix}{i}": i for i in range(2, vocab_size)}}
    core = Tokenizer(models.WordLevel(vocab, unk_token=f"{prefix}2"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>", unk_token=f"{prefix}2")


def save_pair_member(model, tokenizer, path: Path) -> Path:
    model.config._attn_implementation = "sdpa"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def constant_llama(probs, hidden: int = 8) -> LlamaForCausalLM:
    """A Llama whose logits are log(probs) whatever the context: every layer's output projections
    are zero (the residual stream stays the input embedding), every embedding row is all ones
    (RMS-normalized to ones), and the output row of token x is log p(x) in column 0 / norm scale."""
    vocab = len(probs)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, rms_norm_eps=1e-12)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.fill_(1.0)
        model.lm_head.weight.zero_()
        model.lm_head.weight[:, 0] = torch.tensor([math.log(p) for p in probs])
    return model


__all__ = ["tiny_llama", "word_tokenizer", "save_pair_member", "constant_llama"]

"""Write a transformers ``LlamaForCausalLM`` (the tiny random ones of tests/engine/tiny.py) as an
F32 GGUF file that llama.cpp loads, so both backends run the very same weights.

The layout is llama.cpp's ``llama`` architecture as its own converter writes it: tensor names
``token_embd`` / ``blk.N.attn_q`` / ...; the q and k projections permuted from Hugging Face's
rotate-half rotary layout to GGUF's interleaved one (``_rope_permute``); a minimal SentencePiece
("llama") vocabulary of ``vocab_size`` tokens: <unk>, <s>, </s>, then one plain token per
remaining id (llama.cpp checks every token id of a batch against the vocabulary's size).
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def _rope_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Rows of a q / k projection reordered from rotate-half pairs (i, i + d/2) to adjacent pairs."""
    return weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _rope_theta(config) -> float:
    parameters = getattr(config, "rope_parameters", None) or {}
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def write_llama_gguf(model, path: str | Path) -> Path:
    """``model`` (a transformers LlamaForCausalLM) as an F32 GGUF at ``path``; returns the path."""
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    state = {name: tensor.detach().float().numpy() for name, tensor in model.state_dict().items()}
    path = Path(path)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_name("verispec tiny llama")
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_block_count(config.num_hidden_layers)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_dimension_count(config.hidden_size // heads)
    writer.add_rope_freq_base(_rope_theta(config))
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_vocab_size(config.vocab_size)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("llama")
    names = ["<unk>", "<s>", "</s>"] + [f"t{i}" for i in range(3, config.vocab_size)]
    kinds = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL] + [gguf.TokenType.NORMAL] * (config.vocab_size - 3)
    writer.add_token_list(names[: config.vocab_size])
    writer.add_token_scores([0.0] * config.vocab_size)
    writer.add_token_types(kinds[: config.vocab_size])
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)

    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    for layer in range(config.num_hidden_layers):
        prefix = f"model.layers.{layer}."
        block = f"blk.{layer}."
        writer.add_tensor(block + "attn_norm.weight", state[prefix + "input_layernorm.weight"])
        writer.add_tensor(block + "attn_q.weight", _rope_permute(state[prefix + "self_attn.q_proj.weight"], heads))
        writer.add_tensor(block + "attn_k.weight", _rope_permute(state[prefix + "self_attn.k_proj.weight"], kv_heads))
        writer.add_tensor(block + "attn_v.weight", state[prefix + "self_attn.v_proj.weight"])
        writer.add_tensor(block + "attn_output.weight", state[prefix + "self_attn.o_proj.weight"])
        writer.add_tensor(block + "ffn_norm.weight", state[prefix + "post_attention_layernorm.weight"])
        writer.add_tensor(block + "ffn_gate.weight", state[prefix + "mlp.gate_proj.weight"])
        writer.add_tensor(block + "ffn_up.weight", state[prefix + "mlp.up_proj.weight"])
        writer.add_tensor(block + "ffn_down.weight", state[prefix + "mlp.down_proj.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    writer.add_tensor("output.weight", state["lm_head.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path

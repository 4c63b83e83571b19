"""Build a draft (student) for a target: a small Llama with the target's vocabulary.

The student is a ``SubVocabLlamaForCausalLM`` (models/default_draft.py): input embedding over the
full vocabulary V (so the engine's vocabulary check passes and every context token is read), an
output layer over a sub-vocabulary S (|S| = V keeps the full vocabulary).

``init_from_target``: the input embedding starts as the target's embedding E (V x H_t) when the
hidden sizes agree, else as its projection E V_h onto the top-h right singular vectors of E (the
best rank-h linear summary of the target's token geometry); the output rows start as the same
rows of S; with equal hidden sizes the final norm copies the target's, and ``init_layers`` copies
chosen target decoder layers. The embedding can stay frozen (``freeze_embedding``) so training
only moves the small stack, norms and output rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verispec.errors import ConfigError
from verispec.models.default_draft import SubVocabLlamaConfig, SubVocabLlamaForCausalLM

HEAD_DIM = 64
INIT_OUTPUT_SCALE = 0.1


def student_config(
    target_config,
    hidden: int,
    layers: int,
    sub_vocab_size: int,
    intermediate: int | None = None,
    heads: int | None = None,
    kv_heads: int | None = None,
) -> SubVocabLlamaConfig:
    """A draft config with the target's vocabulary, positions, RoPE and special tokens."""
    head_dim = min(HEAD_DIM, hidden)
    heads = heads or max(1, hidden // head_dim)
    kv_heads = kv_heads or heads
    if hidden % heads or heads % kv_heads:
        raise ConfigError(f"hidden {hidden} must split into {heads} heads and {heads} into {kv_heads} KV heads")
    rope = getattr(target_config, "rope_parameters", None)
    extra = {"rope_parameters": dict(rope)} if rope else {"rope_theta": getattr(target_config, "rope_theta", 10000.0)}
    return SubVocabLlamaConfig(
        sub_vocab_size=sub_vocab_size,
        vocab_size=target_config.vocab_size,
        hidden_size=hidden,
        intermediate_size=intermediate or 4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hidden // heads,
        max_position_embeddings=target_config.max_position_embeddings,
        rms_norm_eps=target_config.rms_norm_eps,
        bos_token_id=target_config.bos_token_id,
        eos_token_id=target_config.eos_token_id,
        pad_token_id=getattr(target_config, "pad_token_id", None),
        tie_word_embeddings=False,
        **extra,
    )


@torch.no_grad()
def projected_embedding(target_embedding: torch.Tensor, hidden: int) -> torch.Tensor:
    """E (V, H_t) -> E V_h (V, hidden): coordinates in the top-``hidden`` right singular directions,
    rescaled so rows keep their mean norm. Returns E itself when hidden == H_t."""
    weight = target_embedding.detach().float()
    if hidden == weight.shape[1]:
        return weight.clone()
    if hidden > weight.shape[1]:
        raise ConfigError(f"cannot project a {weight.shape[1]}-dim embedding up to {hidden} dims; use --hidden <= {weight.shape[1]}")
    gram = weight.T @ weight  # (H_t, H_t): eigenvectors = right singular vectors of E
    _, vectors = torch.linalg.eigh(gram.double())
    basis = vectors[:, -hidden:].flip(-1).float()
    projected = weight @ basis
    scale = weight.norm(dim=-1).mean() / projected.norm(dim=-1).mean().clamp_min(1e-12)
    return projected * scale


def build_student(
    target,
    hidden: int = 256,
    layers: int = 2,
    sub_vocab_ids: torch.Tensor | Sequence[int] | None = None,
    intermediate: int | None = None,
    heads: int | None = None,
    init_from_target: bool = True,
    init_layers: Sequence[int] = (),
    seed: int = 0,
) -> SubVocabLlamaForCausalLM:
    """A fresh fp32 draft for ``target`` (a transformers Llama-like causal LM); see the module doc."""
    target_config = target.config
    vocab = int(target_config.vocab_size)
    if sub_vocab_ids is None:
        sub_vocab_ids = torch.arange(vocab)
    sub_vocab_ids = torch.sort(torch.as_tensor(sub_vocab_ids, dtype=torch.long)).values
    if len(sub_vocab_ids) == 0 or int(sub_vocab_ids[-1]) >= vocab or int(sub_vocab_ids[0]) < 0:
        raise ConfigError(f"sub-vocabulary ids must lie in [0, {vocab}); got {len(sub_vocab_ids)} ids")
    config = student_config(target_config, hidden, layers, len(sub_vocab_ids), intermediate, heads)
    torch.manual_seed(seed)
    student = SubVocabLlamaForCausalLM(config).float()
    head = student.lm_head
    with torch.no_grad():
        head.token_ids.copy_(sub_vocab_ids)
        if init_from_target:
            embedding = projected_embedding(target.get_input_embeddings().weight, hidden)
            student.model.embed_tokens.weight.copy_(embedding)
            out = target.get_output_embeddings()
            out_weight = embedding if out is None or out.weight.shape[1] != hidden else out.weight.float()
            head.weight.copy_(out_weight[sub_vocab_ids])
            if hidden != target_config.hidden_size:
                # Projected rows are long and the untrained stack's output is not aligned with them:
                # full-scale logits start at KL ~30 nats from the target (measured on SmolLM2,
                # hidden 256); a 0.1 output scale starts at ~8 and saves the first ~50 steps.
                student.model.norm.weight.fill_(INIT_OUTPUT_SCALE)
            if hidden == target_config.hidden_size:
                student.model.norm.weight.copy_(target.model.norm.weight.float())
                for index, source in enumerate(init_layers):
                    if index >= layers:
                        break
                    student.model.layers[index].load_state_dict(
                        {k: v.float() for k, v in target.model.layers[source].state_dict().items()}
                    )
            elif init_layers:
                raise ConfigError("init_layers needs --hidden equal to the target's hidden size")
        else:
            head.weight.normal_(0.0, config.initializer_range)
    return student


def freeze_embedding(student, freeze: bool = True) -> None:
    student.model.embed_tokens.weight.requires_grad_(not freeze)


def trainable_parameters(student) -> list[torch.nn.Parameter]:
    return [p for p in student.parameters() if p.requires_grad]


def parameter_count(student) -> dict:
    total = sum(p.numel() for p in student.parameters())
    return {
        "total": total,
        "trainable": sum(p.numel() for p in trainable_parameters(student)),
        "embedding": student.model.embed_tokens.weight.numel(),
        "head": student.lm_head.weight.numel(),
    }

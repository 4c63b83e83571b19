"""The shipped default draft for SmolLM2-135M-Instruct and the draft architecture it uses.

``SubVocabLlamaForCausalLM`` is a plain Llama whose output layer covers only a frequent
sub-vocabulary S of the target's vocabulary: it computes |S| logits and scatters them into a full
vocabulary-sized row, with -inf for every token outside S. The draft then has q = 0 outside S
exactly, so lossless verification rules stay exact, while the output layer costs |S| / V of a
full one. The row keeps the full vocabulary size, so the engine's vocabulary check passes.

The classes are registered with transformers' Auto classes when this module is imported, so
``verispec.models.default.load_model(dir)`` loads such a draft directory after
``import verispec.models.default_draft``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

DRAFT_MODEL_TYPE = "verispec_subvocab_llama"
DEFAULT_DRAFT_DIR = Path(__file__).resolve().parent.parent / "assets" / "default_draft"


class SubVocabLlamaConfig(LlamaConfig):
    """LlamaConfig plus ``sub_vocab_size`` (|S|; 0 or vocab_size means the full vocabulary)."""

    model_type = DRAFT_MODEL_TYPE

    def __init__(self, sub_vocab_size: int = 0, **kwargs):
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.sub_vocab_size = int(sub_vocab_size) or int(self.vocab_size)


class SubVocabHead(nn.Module):
    """Output layer over a sub-vocabulary: weight (|S|, H), token_ids (|S|,) of the full vocabulary
    in increasing order (0..V-1 when S is the whole vocabulary).

    ``sub_logits(h)`` -> (..., |S|); ``forward(h)`` -> (..., V) with -inf outside S.
    """

    def __init__(self, hidden_size: int, vocab_size: int, sub_vocab_size: int):
        super().__init__()
        self.vocab_size = int(vocab_size)
        self.weight = nn.Parameter(torch.zeros(sub_vocab_size, hidden_size))
        self.register_buffer("token_ids", torch.arange(sub_vocab_size, dtype=torch.long), persistent=True)

    def sub_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(hidden, self.weight)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        sub = self.sub_logits(hidden)
        if sub.shape[-1] == self.vocab_size:  # the full vocabulary: token_ids is 0..V-1 in order
            return sub
        full = sub.new_full((*sub.shape[:-1], self.vocab_size), float("-inf"))
        full[..., self.token_ids] = sub
        return full


class SubVocabLlamaForCausalLM(LlamaForCausalLM):
    """LlamaForCausalLM with a ``SubVocabHead`` (untied) instead of the full output layer."""

    config_class = SubVocabLlamaConfig
    _tied_weights_keys = {}

    def __init__(self, config: SubVocabLlamaConfig):
        super().__init__(config)
        self.lm_head = SubVocabHead(config.hidden_size, config.vocab_size, config.sub_vocab_size)
        self.post_init()

    def get_output_embeddings(self):
        # The head has |S| rows, not V: callers that size the vocabulary from the output layer
        # (HFModelAdapter) fall back to config.vocab_size.
        return None

    def set_output_embeddings(self, new_embeddings):  # pragma: no cover - not resizable
        raise NotImplementedError("the sub-vocabulary head cannot be replaced or resized")

    def _init_weights(self, module):
        if isinstance(module, SubVocabHead):
            return  # set explicitly by the builder (verispec.distill.student) or loaded
        super()._init_weights(module)


def register() -> None:
    """Make AutoConfig / AutoModelForCausalLM know the draft architecture (idempotent)."""
    AutoConfig.register(DRAFT_MODEL_TYPE, SubVocabLlamaConfig, exist_ok=True)
    AutoModelForCausalLM.register(SubVocabLlamaConfig, SubVocabLlamaForCausalLM, exist_ok=True)


register()


def default_draft_available() -> bool:
    return (DEFAULT_DRAFT_DIR / "config.json").is_file()


def load_default_draft(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """The shipped default draft for SmolLM2-135M-Instruct (eval mode), or None when the package
    ships none (then the n-gram draft is the default)."""
    if not default_draft_available():
        return None
    from verispec.models.loading import load_pretrained_dir

    model, _ = load_pretrained_dir(DEFAULT_DRAFT_DIR, dtype, device)
    return model

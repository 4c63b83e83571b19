"""Tiny random Llama pairs (no download) for engine tests: fp32, small vocabulary, with the output
layer scaled so that the distributions are peaked and target and draft clearly differ."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int, vocab_size: int = 6, layers: int = 2, logit_scale: float = 4.0, max_positions: int = 128):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
    )
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(logit_scale)
    return model


@torch.no_grad()
def exact_first_tokens_law(model, prompt, num_tokens: int, temperature: float = 1.0) -> dict:
    """Law of the first ``num_tokens`` tokens of plain sampling, by full forwards over every prefix."""
    law = {(): 1.0}
    for _ in range(num_tokens):
        nxt = {}
        for seq, prob in law.items():
            logits = model(torch.tensor([list(prompt) + list(seq)])).logits[0, -1].double()
            probs = torch.softmax(logits / temperature, dim=-1)
            for token, token_prob in enumerate(probs.tolist()):
                nxt[seq + (token,)] = prob * token_prob
        law = nxt
    return law

"""Attention of one query row, computed in float32 by two products (the CPU decoding step's kernel).

A decoding step, a root-only round and a draft head's step each score ONE new token, whose query
row attends over the whole cache. On a CPU, torch's ``scaled_dot_product_attention`` runs a single
bf16 query row through its flash kernel at about 0.7 us per cached key and query head group, 4-8x
slower than the same attention as two float32 products: AMD EPYC Zen 5 (avx512_bf16, no AMX),
torch 2.13, 1 thread, SmolLM2-135M's 9 query heads over 3 kv heads, 600 cached keys: 428 us
against 70 us per layer, i.e. a third of a whole one-token forward of the default target; with two
or more query rows the flash kernel is as fast as the products (``benchmarks/single_query_attention.py``).
Both accumulate in float32 and round once to the model's dtype, so they agree to that rounding.

float32 models keep the flash kernel: there it is as fast, and keeping it keeps their rows
bit-identical to the runs measured before this path existed (docs/drafter-invariance.md).
"""

from __future__ import annotations

import torch

# dtypes whose single query rows take the float32 products (the flash kernel's slow case)
REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def takes_single_query_path(rows: int, dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a forward of ``rows`` query rows of one sequence in ``dtype`` on ``device`` attends by
    ``single_query_attention``: one row of a reduced-precision CPU forward. A runner asks once per
    forward, before its layers (the answer is the same for every layer)."""
    return rows == 1 and dtype in REDUCED_PRECISION and torch.device(device).type == "cpu"


def single_query_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float,
                           allowed: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q K^T * scale) V for one query row with grouped-query heads, in float32 (float64 for
    float64 operands).

    query (1, heads, 1, head_dim); keys, values (1, kv_heads, S, head_dim), any strides; query head
    h reads kv head h // (heads // kv_heads), as transformers' ``repeat_kv``. ``allowed``: None (every
    key) or bool broadcastable to (S,), True where the query may attend (at least one True).
    Returns (1, heads, 1, head_dim) in the query's dtype, as ``scaled_dot_product_attention``.
    """
    heads, head_dim, kv_heads = query.shape[1], query.shape[3], keys.shape[1]
    work = torch.promote_types(query.dtype, torch.float32)  # float32, or float64 for a float64 model
    grouped = query.reshape(1, kv_heads, heads // kv_heads, head_dim).to(work)
    scores = torch.matmul(grouped, keys.to(work).transpose(-1, -2)) * scale  # (1, kv_heads, group, S)
    if allowed is not None:
        scores = scores.masked_fill(~allowed.reshape(-1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), values.to(work))  # (1, kv_heads, group, head_dim)
    return out.reshape(1, heads, 1, head_dim).to(query.dtype)

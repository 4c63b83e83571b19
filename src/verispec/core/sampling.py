"""Sampling parameters applied to logits before verification (ALGORITHMS.md §1 rule 1,
DESIGN.md §4). The same processing is applied to draft and target logits; losslessness then
holds with respect to the processed target. Keyword names follow ``transformers.generate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from verispec.errors import ConfigError, InvalidDistributionError


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy (one-hot argmax, lowest id on ties); top_k 0 and top_p 1.0
    disable truncation. top_p keeps the most probable tokens until their mass reaches top_p
    (the token that crosses the threshold is kept)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self):
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0 (0 = greedy) and finite, got {self.temperature}")
        if int(self.top_k) != self.top_k or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 disables it), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must lie in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean mask of the nucleus of each row of probs (n, V): the most probable tokens, in
    order of decreasing probability and then increasing id, until their mass reaches top_p.

    Partial selection instead of a full sort, because nuclei are usually far smaller than the
    vocabulary: every token at least as probable as the size-th largest is a candidate (so ties
    at the cut are all present before they are ordered by id)."""
    keep = np.zeros_like(probs, dtype=bool)
    vocab = probs.shape[1]
    for row_index, row in enumerate(probs):
        size = min(64, vocab)
        while True:
            if size < vocab:
                cut = np.partition(row, vocab - size)[vocab - size]
                candidates = np.flatnonzero(row >= cut)
            else:
                candidates = np.arange(vocab)
            ordered = candidates[np.lexsort((candidates, -row[candidates]))]
            cumulative = np.cumsum(row[ordered])
            crossing = int(np.searchsorted(cumulative, top_p - 1e-12))
            if crossing < len(ordered) or size == vocab:
                keep[row_index, ordered[: crossing + 1]] = True
                break
            size = min(size * 4, vocab)
    return keep


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """Processed next-token distributions. logits: (n, V) any float dtype -> (n, V) float64.

    Raises InvalidDistributionError on NaN/inf logits (a broken model or dtype overflow)."""
    if torch.isnan(logits).any() or torch.isposinf(logits).any() or torch.isneginf(logits).all(dim=-1).any():
        raise InvalidDistributionError(
            "the model produced NaN, +inf or all -inf logits; check the model weights and dtype "
            "(fp16 can overflow: try bf16 or fp32)"
        )
    if params.greedy:
        probs = np.zeros(tuple(logits.shape), dtype=np.float64)
        probs[np.arange(logits.shape[0]), logits.argmax(dim=-1).cpu().numpy()] = 1.0
        return probs
    # subtracting the row maximum first keeps the division finite for tiny temperatures
    logits = logits.float()
    scaled = (logits - logits.max(dim=-1, keepdim=True).values) / params.temperature
    if params.top_k and params.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, params.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1).double().cpu().numpy()
    if params.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, params.top_p), probs, 0.0)
    return probs / probs.sum(axis=-1, keepdims=True)


def process_probs(probs: np.ndarray, params: SamplingParams) -> np.ndarray:
    """Apply the sampling parameters to a draft that yields probabilities rather than logits
    (e.g. the n-gram draft): log q is treated as the logits. probs: (n, V) -> (n, V) float64."""
    if params == SamplingParams():
        return probs
    if params.greedy:  # argmax of log q is argmax of q (first index on ties, as logits_to_probs)
        onehot = np.zeros(probs.shape, dtype=np.float64)
        onehot[np.arange(probs.shape[0]), probs.argmax(axis=-1)] = 1.0
        return onehot
    with np.errstate(divide="ignore"):
        logits = np.where(probs > 0, np.log(probs), -1e30)  # exp(-1e30) is exactly 0: zeros stay zeros
    return logits_to_probs(torch.from_numpy(logits), params)

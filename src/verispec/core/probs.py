"""Probability-vector helpers shared by every rule: validation, residuals, normalisation
(ALGORITHMS.md §1 rules 2-3). All arithmetic is float64."""

from __future__ import annotations

import math

import numpy as np

from verispec.errors import InvalidDistributionError

# Residuals with total mass at or below this are treated as empty (ALGORITHMS.md §1 rule 3).
RESIDUAL_MASS_GUARD = 1e-300
# Tolerance on the sum of a probability vector.
SUM_TOLERANCE = 1e-6


def check_prob_matrix(probs: np.ndarray, name: str, vocab_size: int | None = None) -> np.ndarray:
    """Validate probability vectors stored along the last axis; return them as float64.

    Raises ``InvalidDistributionError`` naming ``name`` for NaN/inf, negative entries, a wrong
    vocabulary size, or rows that do not sum to 1 within ``SUM_TOLERANCE``.
    """
    array = np.asarray(probs, dtype=np.float64)
    if array.ndim == 0 or array.shape[-1] == 0:
        raise InvalidDistributionError(f"{name} must be a non-empty vector over the vocabulary, got shape {array.shape}")
    if vocab_size is not None and array.shape[-1] != vocab_size:
        raise InvalidDistributionError(
            f"{name} has length {array.shape[-1]} but the vocabulary has {vocab_size} tokens; "
            "draft and target vectors must cover the same vocabulary"
        )
    if not np.all(np.isfinite(array)):
        raise InvalidDistributionError(f"{name} contains NaN or inf; check the model logits before softmax")
    if np.any(array < 0):
        raise InvalidDistributionError(f"{name} has negative entries (min {array.min():.3g}); probabilities must be >= 0")
    if array.size == 0:
        return array
    sums = array.sum(axis=-1)
    worst = float(np.max(np.abs(sums - 1.0)))
    if worst > SUM_TOLERANCE:
        raise InvalidDistributionError(
            f"{name} does not sum to 1 (off by {worst:.3g}); normalise it (softmax / divide by the sum)"
        )
    return array


def normalize(weights: np.ndarray) -> np.ndarray:
    """weights / sum(weights); the caller guarantees positive mass."""
    return weights / weights.sum()


def normalized_positive_part(weights: np.ndarray, fallback: np.ndarray) -> tuple[np.ndarray, bool]:
    """norm([weights]_+), shape (V,), computed in place in ``weights`` (a scratch array the caller owns).

    Returns (distribution, guard_hit). If the positive part has no mass (a branch of probability ~0
    in exact arithmetic, ALGORITHMS.md §1 rule 3) ``fallback`` (the node's un-modified target) is
    returned and ``guard_hit`` is True so callers can count it in their diagnostics. Every
    residual of the rules ends here.
    """
    np.maximum(weights, 0.0, out=weights)
    mass = weights.sum()
    if not mass > RESIDUAL_MASS_GUARD:
        return fallback, True
    weights /= mass
    return weights, False


def residual(target: np.ndarray, draft: np.ndarray, target_scale: float = 1.0) -> tuple[np.ndarray, bool]:
    """norm([target_scale * target - draft]_+), shape (V,); (target, True) when it has no mass
    (``normalized_positive_part``)."""
    return normalized_positive_part(target_scale * target - draft, target)


def positive_part_mass(vector: np.ndarray) -> float:
    """sum_x [vector(x)]_+ ."""
    return float(np.maximum(vector, 0.0).sum())


def safe_log(value: float) -> float:
    """log(value), with log(0) = -inf (joint probabilities of zero-probability prefixes)."""
    return math.log(value) if value > 0 else -math.inf

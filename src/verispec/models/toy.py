"""Toy autoregressive models with exact probabilities (ALGORITHMS.md §14.1 item 2).

For every prefix the target lazily draws a Dirichlet vector seeded by (seed, prefix); the draft is
the mixture (1 - lam) Dir + lam p so that acceptance rates are realistic. Optional exact zeros
exercise p(x) = 0 on drafted tokens and q = 0 tokens that the residual must cover. Pure numpy:
the theory and test layers use these without torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from verispec.core.probs import check_prob_matrix


def _zeroed(probs: np.ndarray, rng: np.random.Generator, zero_frac: float) -> np.ndarray:
    """Set about zero_frac of the entries to exactly 0 (never all) and renormalise."""
    if zero_frac <= 0:
        return probs
    mask = rng.random(len(probs)) < zero_frac
    if mask.all():
        mask[int(np.argmax(probs))] = False
    out = np.where(mask, 0.0, probs)
    return out / out.sum()


@dataclass
class ToyModel:
    """p(.|prefix) with a fresh Dirichlet(concentration) vector per prefix.

    vocab_size V; ``fixed`` makes it context-free (the same vector for every prefix).
    """

    vocab_size: int
    seed: int = 0
    concentration: float = 0.7
    zero_frac: float = 0.0
    fixed: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        if self.fixed is not None:
            self.fixed = check_prob_matrix(self.fixed, "fixed toy distribution", self.vocab_size)

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        if self.fixed is not None:
            return self.fixed
        key = tuple(prefix)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, len(key), *key])
            probs = rng.dirichlet(np.full(self.vocab_size, self.concentration))
            self._cache[key] = _zeroed(probs, rng, self.zero_frac)
        return self._cache[key]


@dataclass
class ToyDraft:
    """q(.|prefix) = (1 - lam) Dir(seed', prefix) + lam p(.|prefix), then optional exact zeros."""

    target: ToyModel
    seed: int = 1
    mix: float = 0.4
    concentration: float = 0.7
    zero_frac: float = 0.0
    fixed: np.ndarray | None = None
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def vocab_size(self) -> int:
        return self.target.vocab_size

    def __post_init__(self):
        if self.fixed is not None:
            self.fixed = check_prob_matrix(self.fixed, "fixed toy draft distribution", self.target.vocab_size)

    def __call__(self, prefix: tuple[int, ...]) -> np.ndarray:
        if self.fixed is not None:
            return self.fixed
        key = tuple(prefix)
        if key not in self._cache:
            rng = np.random.default_rng([self.seed, 7919, len(key), *key])
            own = rng.dirichlet(np.full(self.vocab_size, self.concentration))
            probs = (1.0 - self.mix) * own + self.mix * self.target(key)
            self._cache[key] = _zeroed(probs, rng, self.zero_frac)
        return self._cache[key]


def context_free_pair(target_probs, draft_probs) -> tuple[ToyModel, ToyDraft]:
    """Hand-computable models: the same p and q at every prefix (e.g. the BV-paper example)."""
    target = ToyModel(len(target_probs), fixed=np.asarray(target_probs, dtype=np.float64))
    draft = ToyDraft(target, fixed=np.asarray(draft_probs, dtype=np.float64))
    return target, draft

"""Toy model pairs built for the exact tests of issue 10 (ALGORITHMS.md §14.1 item 2, §14.3):
exact ties in p/q, and pairs whose root draft genuinely branches.

Models are callables ``prefix -> (V,) float64`` as in ``verispec.theory.enumerate``.
"""

from __future__ import annotations

import itertools

import numpy as np

from tests.conftest import toy_pair
from verispec.core.rng import enumerate_outcomes

# Dyadic vectors: every p/q below is an exact float quotient, so the ties are exact, not
# rounding accidents. (q, p) with ratios (1/2, 1/2, 5/2) and (1/2, 1/2, +inf: q = 0).
_TIED_BASES = (
    (np.array([0.5, 0.25, 0.25]), np.array([0.25, 0.125, 0.625])),
    (np.array([0.5, 0.5, 0.0]), np.array([0.25, 0.25, 0.5])),
)


class TiedPair:
    """V = 3 target/draft with two EXACTLY tied p/q ratios at every prefix, context dependent:
    the base pair and a permutation of the tokens are picked from a hash of the prefix (tied
    tokens carry different draft masses, and sometimes q = 0 < p)."""

    vocab_size = 3

    def __init__(self, seed: int):
        self.seed = seed
        self.permutations = list(itertools.permutations(range(3)))

    def _choice(self, prefix):
        rng = np.random.default_rng([self.seed, len(prefix), *prefix])
        return _TIED_BASES[int(rng.integers(2))], self.permutations[int(rng.integers(6))]

    def draft(self, prefix) -> np.ndarray:
        (q, _), perm = self._choice(tuple(prefix))
        return q[list(perm)]

    def target(self, prefix) -> np.ndarray:
        (_, p), perm = self._choice(tuple(prefix))
        return p[list(perm)]


def tied_pair(seed: int = 0):
    pair = TiedPair(seed)
    return pair.target, pair.draft


def identical_pair(vocab: int, seed: int, zero_frac: float = 0.25):
    """p ≡ q: the toy draft used as both target and draft (every ratio is exactly 1)."""
    _, draft = toy_pair(vocab, seed=seed, zero_frac=zero_frac)
    return draft, draft


def root_branching_probability(sampler, draft) -> float:
    """Exact P(the root of the drafted tree has >= 2 distinct child tokens), by enumerating the
    sampler's own random choices (the law the exactness tests run over)."""

    def program(rng):
        skeleton = sampler(rng, draft)
        root_tokens = {skeleton.tokens[node] for node in range(1, len(skeleton.tokens)) if skeleton.parents[node] == 0}
        return len(root_tokens) >= 2

    return enumerate_outcomes(program).get(True, 0.0)

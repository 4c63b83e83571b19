"""Fixtures shared by the single-position tests of the multi-draft rules (ALGORITHMS.md §14)."""

from __future__ import annotations

import numpy as np

from verispec.models.toy import context_free_pair
from verispec.theory.enumerate import block_law


def random_pair(vocab: int, seed: int, zero_frac: float = 0.3, mix: float = 0.4) -> tuple[np.ndarray, np.ndarray]:
    """(p, q), shape (V,), with exact zeros in both: p ~ Dir(0.7), q = (1 - mix) Dir + mix p,
    then about ``zero_frac`` of each vector's entries set to 0 (never all) and renormalised."""
    rng = np.random.default_rng([seed, vocab, 4242])
    target = rng.dirichlet(np.full(vocab, 0.7))
    draft = (1.0 - mix) * rng.dirichlet(np.full(vocab, 0.7)) + mix * target

    def zeroed(vector):
        mask = rng.random(vocab) < zero_frac
        if mask.all():
            mask[int(np.argmax(vector))] = False
        out = np.where(mask, 0.0, vector)
        return out / out.sum()

    return zeroed(target), zeroed(draft)


def single_position_acceptance(verifier, sampler, target: np.ndarray, draft: np.ndarray) -> tuple[float, dict]:
    """Exact P(tau = 1) of one verification at a single position (context-free models, L = 1:
    the output is a drafted token and accepted) and the exact law of the emitted first token."""
    target_model, draft_model = context_free_pair(target, draft)
    law = block_law(verifier, sampler, target_model, draft_model)
    first_token: dict[int, float] = {}
    for output, prob in law.probs.items():
        first_token[output[0]] = first_token.get(output[0], 0.0) + prob
    return law.expected_accepted_len, first_token

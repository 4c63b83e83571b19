"""The pre-speed-up ``below_mass_all`` (verispec commit 0c5720b), kept verbatim as a test
reference for the fast path in ``verify.greedy_selection``. Not used by the library.

It sorts the ratios with one ``np.argsort`` (an index sort) per row and falls back to the full
(ratio, id) ``local_order`` when the sorted ratios contain an exact tie.
"""

from __future__ import annotations

import numpy as np

from verispec.verify.greedy_selection import local_order


def below_mass_all_reference(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``below_mass`` for every token at once, shape (V,) (ALGORITHMS.md §7.2), the old way."""
    vocab = len(draft)
    below = np.empty(vocab)
    zero_ratio = (target == 0) & (draft > 0)
    bottom = 0.0
    if zero_ratio.any():  # dense (untruncated) distributions have none: skip the pass
        zero_mass = np.where(zero_ratio, draft, 0.0)
        cumulative = np.cumsum(zero_mass)
        below[zero_ratio] = (cumulative - zero_mass)[zero_ratio]
        bottom = float(cumulative[-1])
    middle = np.flatnonzero((target > 0) & (draft > 0))
    if len(middle) == vocab:  # untruncated rows: every token is in the middle, skip the gathers
        middle, ratios = np.arange(vocab), target / draft
    else:
        ratios = target[middle] / draft[middle]
    order = np.argsort(ratios)
    ranked_ratios = ratios[order]
    if np.any(ranked_ratios[1:] == ranked_ratios[:-1]):  # exact ties: the full key (ratio, id)
        order = local_order(ratios, middle)
    ranked = middle[order]
    ranked_mass = draft[ranked]
    below[ranked] = bottom + np.cumsum(ranked_mass) - ranked_mass
    below[draft <= 0] = bottom + float(ranked_mass.sum())
    return below

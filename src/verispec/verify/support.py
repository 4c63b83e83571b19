"""Rule state in the coordinates of the target's support at a node (ALGORITHMS.md §1).

Every law the tree rules draw from at a node u (RRS's t_m §8.1, SpecHub's r §9.3, traversal's
P_u §12, SD's residual §2) vanishes outside supp(p(.|u)): each starts from p(.|u) and is updated by
positive parts [w t - d]_+ with t = 0 outside the support, which stay 0 there. So these rules keep
their vectors over ``ids, p = target.support(u)`` (a top-p nucleus: tens to hundreds of tokens)
instead of the V-long row, and read the draft there with ``draft.gather(u, ids)``. What a formula
needs of the draft's mass outside the support is carried as a scalar (see each rule).

Helpers:
  lookup(ids, tokens)            where tokens sit in a support (found mask, positions)
  value_at(ids, values, token)   the entry of a vector kept over ``ids`` (0 outside: exact, since
                                 every vector kept this way vanishes outside the support)
  SupportDraw                    the law of a node's extra token for ``core.rows.draw_on_support``
  kept_on_support(ids, law)      a SupportDraw of a law already computed over ``ids``
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

# build(ids, p) -> (law over ids (m,), guard hits), as core.rows.draw_on_support takes it
SupportBuilder = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, int]]


@dataclass(frozen=True)
class SupportDraw:
    """The law of the extra token at a node, in the coordinates of the target's support there:
    ``build(ids, p)`` -> (law over ids, guard hits) for ``core.rows.draw_on_support``; build None:
    the target row p(.|u) itself (the bonus at a leaf, or a law that was never updated, e.g. with
    greedy rows, where the draw is the argmax and nothing is built)."""

    build: SupportBuilder | None = None


def value_at(ids: np.ndarray, values: np.ndarray, token: int) -> float:
    """values[i] where ids[i] == token, 0.0 when the token is not listed. ids: (m,) ascending
    int64 (a support, core.rows.Rows.support), values: (m,) float64."""
    found, positions = lookup(ids, [token])
    return float(values[positions[0]]) if found[0] else 0.0


def lookup(ids: np.ndarray, tokens) -> tuple[np.ndarray, np.ndarray]:
    """Where ``tokens`` sit in ``ids`` (ascending): (found mask (n,), their index in ``ids``; an
    arbitrary valid index where not found). One searchsorted, no pass over V."""
    ids = np.asarray(ids, dtype=np.int64)
    tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
    if ids.size == 0:
        return np.zeros(tokens.size, dtype=bool), np.zeros(tokens.size, dtype=np.int64)
    positions = np.minimum(np.searchsorted(ids, tokens), len(ids) - 1)
    return ids[positions] == tokens, positions


def positions_of(ids: np.ndarray, tokens) -> np.ndarray:
    """Indices into ``ids`` of those ``tokens`` that are listed in it (tokens not in ``ids`` are
    dropped: the entries they would mark are 0 on the support anyway)."""
    found, positions = lookup(ids, list(tokens))
    return positions[found]


def realigned(law_ids: np.ndarray, law: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """A law kept over ``law_ids`` re-expressed over ``ids`` (shape (len(ids),)).

    Both are supports of the same target row (ascending supersets of its positive entries) and
    the law vanishes outside that row's positive entries, so no mass is lost. The same support
    (what every backend returns for a node it has seen: the usual case) is returned as is."""
    if ids is law_ids or (len(ids) == len(law_ids) and np.array_equal(ids, law_ids)):
        return law
    result = np.zeros(len(ids))
    listed, positions = lookup(law_ids, ids)
    result[listed] = law[positions[listed]]
    return result


def kept_on_support(law_ids: np.ndarray, law: np.ndarray, guard: int = 0) -> SupportDraw:
    """A SupportDraw of a law already computed over ``law_ids`` (a residual the rule updated while
    testing candidates); ``guard``: residual guard hits to report with the draw."""
    return SupportDraw(lambda ids, _p: (realigned(law_ids, law, ids), guard))

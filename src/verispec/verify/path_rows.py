"""The rows of one root path of a draft tree, read by position.

Used by the path rules (BV §3, GBV-mod §4, SpecTr-GBV★ §6.3, GMPBV §7 of ALGORITHMS.md) and by
the greedy selection's skewed law, so it lives below them all: ``base.py`` (the Verifier interface) and ``greedy_selection.py`` both import
it, and it imports neither.
"""

from __future__ import annotations

import numpy as np

from verispec.core.tree import ROOT, DraftTree


class PathRows:
    """The rows of a root path by position: ``self[i]`` is the full row (V,) of ``nodes[i]``,
    built on first use by the tree's row provider (core.rows), never a copy of the others."""

    def __init__(self, rows, nodes):
        self.rows, self.nodes = rows, list(nodes)

    def __getitem__(self, position: int) -> np.ndarray:
        return self.rows.row(self.nodes[position])

    def support(self, position: int) -> tuple[np.ndarray, np.ndarray]:
        """The row provider's support of ``nodes[position]`` (core.rows.Rows.support)."""
        return self.rows.support(self.nodes[position])

    def gather(self, position: int, ids) -> np.ndarray:
        """``self[position][ids]`` without building the row where the provider can."""
        return self.rows.gather(self.nodes[position], ids)

    def __len__(self) -> int:
        return len(self.nodes)


def row_support(rows, position: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, values) of the positive entries of ``rows[position]``: the provider's support
    (``PathRows``, q̃ of §7; no pass over V) when it has one, else from the (V,) array."""
    if hasattr(rows, "support"):
        return rows.support(position)
    row = np.asarray(rows[position], dtype=np.float64)
    ids = np.flatnonzero(row > 0.0)
    return ids, row[ids]


def row_gather(rows, position: int, ids) -> np.ndarray:
    """``rows[position][ids]`` (float64) through the provider's gather when it has one."""
    if hasattr(rows, "gather"):
        return np.asarray(rows.gather(position, ids), dtype=np.float64)
    return np.asarray(rows[position], dtype=np.float64)[np.asarray(ids, dtype=np.int64)]


def path_rows(tree: DraftTree, path: tuple[int, ...]):
    """(rows root..leaf, target rows p_1..p_{L+1}, draft rows q_1..q_L) of a root path; the
    vectors are ``PathRows`` indexable by position and are processed only when read."""
    rows = [ROOT, *path]
    return rows, PathRows(tree.target, rows), PathRows(tree.draft, rows[:-1])

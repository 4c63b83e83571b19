"""Target modification carried across iterations (ALGORITHMS.md §4.3, §6.1 Alg. 2, §6.3 step 4).

After a GBV-mod / SpecTr-GBV(★) iteration that stopped at tau < L and emitted y, the next-token
target law at every continuation z of (x_{1:tau}, y) with |z| <= L-1 (joints from the old block
start) becomes

    p̂(.|z) = norm([P(z) p(.|z) - Qd(z, .)]_+)        (power 1: GBV-mod with Qd = Q, ★ with Qd = Q̃)
    p̂(.|z) ∝ [P(z, .) - Q(z, .)]_+^K / P(z, .)^(K-1)  (power K: literal SpecTr-GBV, G(z, .))

P is the target process in force during that iteration (itself possibly modified). A
``ModificationWindow`` holds the state at one prefix z; ``advance`` moves it one token deeper.
Windows stack, oldest first: each one modifies the output of the ones before it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD, safe_log
from verispec.verify.greedy_selection import below_mass_all, below_mass_on_supports, skewed_mass
from verispec.verify.support import value_at


# Largest |log factor| applied as one float multiplication; beyond it the factor itself would
# overflow / underflow although the product may not, so the product is formed in log space.
_LINEAR_LOG_RANGE = 700.0


class DraftJoint(Protocol):
    """The draft-side joint probability Qd(z, .) of a window, as a function of the prefix z, kept
    as (vector, log scale) so that joints far below 1e-308 stay representable (§1 rule 2)."""

    def scaled_next_joint(self, base_target: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, float]:
        """(vector (V,), log_scale) with Qd(z, x) = vector[x] * exp(log_scale)."""
        ...

    def advance(self, token: int, base_target: np.ndarray, draft: np.ndarray) -> "DraftJoint": ...


@dataclass(frozen=True)
class PlainDraftJoint:
    """Qd(z) = Q(z) = prod of q along z (GBV-mod, literal SpecTr-GBV); ``log_mass`` = log Q(z)."""

    log_mass: float

    def scaled_next_joint(self, base_target: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, float]:
        return draft, self.log_mass

    def advance(self, token: int, base_target: np.ndarray, draft: np.ndarray) -> "PlainDraftJoint":
        return PlainDraftJoint(self.log_mass + safe_log(draft[token]))


@dataclass(frozen=True)
class SkewedDraftJoint:
    """Qd(z) = Q̃(z) = (C(z) + Q(z))^K - C(z)^K, the law of the greedy multi-path selection of K
    i.i.d. drafts (ALGORITHMS.md §7.2). C(z) = below * exp(log_scale), Q(z) = mass * exp(log_scale):
    ``advance`` rescales so that max(below, mass) = 1, so deep windows never underflow."""

    below: float
    mass: float
    num_drafts: int
    log_scale: float = 0.0

    def scaled_next_joint(self, base_target: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, float]:
        lower = self.below + self.mass * below_mass_all(base_target, draft)
        return skewed_mass(lower, self.mass * draft, self.num_drafts), self.num_drafts * self.log_scale

    def advance(self, token: int, base_target: np.ndarray, draft: np.ndarray) -> "SkewedDraftJoint":
        target_ids, draft_ids = np.flatnonzero(base_target > 0.0), np.flatnonzero(draft > 0.0)
        return self.advance_on_supports(token, target_ids, base_target[target_ids], draft_ids, draft[draft_ids])

    def advance_on_supports(
        self, token: int, target_ids: np.ndarray, target_values: np.ndarray, draft_ids: np.ndarray, draft_values: np.ndarray
    ) -> "SkewedDraftJoint":
        """``advance`` from the rows' supports (core.rows.Rows.support): no pass over V."""
        below = self.below + self.mass * float(
            below_mass_on_supports(target_ids, target_values, draft_ids, draft_values, [int(token)])[0]
        )
        mass = self.mass * value_at(draft_ids, draft_values, token)
        scale = max(below, mass)
        if not scale > 0.0:  # C = Q = 0: the prefix has no draft mass, Q̃ = 0 from here on
            return SkewedDraftJoint(0.0, 0.0, self.num_drafts, self.log_scale)
        return SkewedDraftJoint(below / scale, mass / scale, self.num_drafts, self.log_scale + math.log(scale))


def scaled_to_linear(vector: np.ndarray, log_factor: float) -> np.ndarray:
    """vector * exp(log_factor), shape (V,), without overflow/underflow of exp(log_factor) itself:
    one multiplication when the factor is representable, else entry by entry in log space
    (entries beyond float range become inf or 0, as their exact values round)."""
    if log_factor == -math.inf:
        return np.zeros_like(vector)
    if abs(log_factor) <= _LINEAR_LOG_RANGE:
        return vector * math.exp(log_factor)
    with np.errstate(divide="ignore", over="ignore"):
        return np.exp(np.log(vector) + log_factor)


@dataclass(frozen=True)
class ModificationWindow:
    """State of one modification at a prefix z.

    log_target_joint  log P(z) from the old block start
    draft_joint       Qd at z
    remaining         number of next-token laws still modified (at z and deeper); > 0
    power             1 (GBV-mod, ★) or K (literal SpecTr-GBV's G)
    """

    log_target_joint: float
    draft_joint: DraftJoint
    remaining: int
    power: int = 1

    def modify(self, base_target: np.ndarray, draft: np.ndarray) -> tuple[np.ndarray, bool]:
        """p̂(.|z) from the base target p(.|z) and the draft q(.|z), both shape (V,).
        Returns (vector, guard_hit)."""
        if self.log_target_joint == -math.inf:
            return base_target, True
        target_joint = base_target  # divided by P(z): normalisation makes the scale irrelevant
        vector, log_scale = self.draft_joint.scaled_next_joint(base_target, draft)
        draft_joint = scaled_to_linear(vector, log_scale - self.log_target_joint)  # Qd(z, .) / P(z)
        weights = np.maximum(target_joint - draft_joint, 0.0)
        if self.power > 1:
            with np.errstate(divide="ignore", invalid="ignore"):
                weights = np.where(target_joint > 0, weights**self.power / target_joint ** (self.power - 1), 0.0)
        mass = weights.sum()
        if not mass > RESIDUAL_MASS_GUARD:
            return base_target, True
        return weights / mass, False

    def advance(self, token: int, base_target: np.ndarray, draft: np.ndarray) -> "ModificationWindow | None":
        """The window at (z, token), or None once it has modified its last position."""
        if self.remaining <= 1:
            return None
        return ModificationWindow(
            self.log_target_joint + safe_log(float(base_target[token])),
            self.draft_joint.advance(token, base_target, draft),
            self.remaining - 1,
            self.power,
        )


Windows = tuple[ModificationWindow, ...]


def effective_target(windows: Windows, raw_target: np.ndarray, draft: np.ndarray | None) -> tuple[np.ndarray, tuple[np.ndarray, ...], int]:
    """Apply the stacked windows (oldest first) to the raw target vector at one prefix.

    Returns (effective vector, the base vector each window saw, guard hits). ``draft`` is
    q(.|prefix); it is required whenever a window is active.
    """
    vector = raw_target
    bases = []
    guards = 0
    for window in windows:
        if draft is None or not np.any(draft):
            raise ValueError(
                "a target-modification window is active at a node without a draft vector; "
                "draft full-length paths (the same L every iteration) for GBV-mod / SpecTr-GBV rules"
            )
        bases.append(vector)
        vector, guard = window.modify(vector, draft)
        guards += guard
    return vector, tuple(bases), guards


def advance_windows(windows: Windows, bases: tuple[np.ndarray, ...], token: int, draft: np.ndarray | None) -> Windows:
    """Move every window one token deeper (dropping finished ones)."""
    moved = (window.advance(token, base, draft) for window, base in zip(windows, bases))
    return tuple(window for window in moved if window is not None)


@dataclass(frozen=True)
class TreeModification:
    """Per-node result of applying windows to a tree: effective target vectors (n, V), the
    windows in force at each node, and the base vectors each window saw there."""

    target_probs: np.ndarray
    windows: tuple[Windows, ...]
    bases: tuple[tuple[np.ndarray, ...], ...]
    guard_hits: int


def modify_tree_targets(
    windows: Windows, tokens: np.ndarray, parents: np.ndarray, raw_target_probs: np.ndarray, draft_probs: np.ndarray
) -> TreeModification:
    """Apply the windows in force at the root to every node of a tree (nodes in topological
    order). Used by the engine before verification."""
    num_nodes = len(tokens)
    effective = np.array(raw_target_probs, dtype=np.float64, copy=True)
    node_windows: list[Windows] = [()] * num_nodes
    node_bases: list[tuple[np.ndarray, ...]] = [()] * num_nodes
    node_windows[0] = windows
    guards = 0
    for node in range(num_nodes):
        if node > 0:
            parent = int(parents[node])
            node_windows[node] = advance_windows(
                node_windows[parent], node_bases[parent], int(tokens[node]), draft_probs[parent]
            )
        if node_windows[node]:
            # a copy: effective[node] is a view that the assignment overwrites, and the first
            # window's base must stay the unmodified row (its P(z) advances by the raw p)
            effective[node], node_bases[node], hits = effective_target(
                node_windows[node], effective[node].copy(), draft_probs[node]
            )
            guards += hits
    return TreeModification(effective, tuple(node_windows), tuple(node_bases), guards)

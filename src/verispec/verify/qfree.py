"""q-free verification of deterministic candidate trees (ALGORITHMS.md §13, SpecInfer NSS).

Candidates chosen by a deterministic rule (the target-aware token trees of
``verispec.models.token_tree``: adjacency top-k, suffix copies) have no sampling law q, so every
rule that divides by q is not exact on them (those rules refuse ``DraftScheme.DETERMINISTIC``).
This rule never reads q: at node u draw y ~ p(.|u); if y is the token of a child of u, move there
and repeat, else emit y and stop; at a leaf y is the bonus token. Every emitted token is an exact
draw from the target, at any temperature; the acceptance at u is the target mass of its distinct
child tokens.

The walk is written against two callables so the engine can run it *lazily*: ``row(node)`` gives
p(.|node) (shape (V,)) and is called only for the nodes the walk visits, so the target rows of
the other nodes are never materialised (at temperature 0 a row is a one-hot argmax). The
``Verifier`` class runs the same walk on a fully materialised ``DraftTree``, which is what the
exact-enumeration tests check.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD
from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at


def qfree_walk(
    children_of: Callable[[int], dict[int, int]], row: Callable[[int], np.ndarray], rng: Rng
) -> tuple[list[int], int, bool, int]:
    """Walk a candidate tree from the root.

    children_of(node) -> {child token: child node} (first child wins for repeated tokens);
    row(node) -> p(.|node), shape (V,), any non-negative vector with positive sum.
    Returns (visited nodes root first, emitted token y, is_bonus, residual guard hits).

    The draw y ~ p(.|u) at an internal node is made in two exact stages, so nothing O(V) is sampled
    while children are hit: a categorical over {each child token c: p(c)} ∪ {miss: the rest}; only
    on a miss is y drawn from p restricted to the non-child tokens.
    """
    node = ROOT
    visited = [ROOT]
    while True:
        target = row(node)
        child_of = children_of(node)
        if not child_of:
            return visited, rng.categorical(target), True, 0
        tokens = list(child_of)
        hit = target[tokens]
        hit_mass = float(hit.sum())
        miss = max(float(target.sum()) - hit_mass, 0.0)
        choice = rng.categorical(np.append(hit, miss) / (hit_mass + miss))
        if choice < len(tokens):
            node = child_of[tokens[choice]]
            visited.append(node)
            continue
        rest = np.array(target, dtype=np.float64)
        rest[tokens] = 0.0
        mass = rest.sum()
        if not mass > RESIDUAL_MASS_GUARD:  # a miss of probability ~0 (rounding only)
            return visited, rng.categorical(target), False, 1
        return visited, rng.categorical(rest / mass), False, 0


class QFreeTreeVerification(Verifier):
    """The q-free walk above on a ``DraftTree`` (full target rows). Exact for every scheme, the
    deterministic one included; it is the rule the engine runs on target-aware token trees."""

    name = "qfree"
    section = "§13"
    lossless = True
    supported_schemes = frozenset(DraftScheme)

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        children = tree.children

        def children_of(node: int) -> dict[int, int]:
            child_of: dict[int, int] = {}
            for child in children[node]:
                child_of.setdefault(int(tree.tokens[child]), child)
            return child_of

        visited, token, is_bonus, guard = qfree_walk(children_of, tree.target.row, rng)
        extra = {"diagnostics": {"residual_guard_hits": 1}} if guard else {}
        return result_at(tree, visited[-1], token, is_bonus, **extra)

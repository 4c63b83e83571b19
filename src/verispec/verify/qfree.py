"""q-free verification of deterministic candidate trees (ALGORITHMS.md §13, SpecInfer NSS).

Candidates chosen by a deterministic rule (the target-aware token trees of
``verispec.models.token_tree``: adjacency top-k, suffix copies) have no sampling law q, so every
rule that divides by q is not exact on them (those rules refuse ``DraftScheme.DETERMINISTIC``).
This rule never reads q: at node u draw y ~ p(.|u); if y is the token of a child of u, move there
and repeat, else emit y and stop; at a leaf y is the bonus token. Every emitted token is an exact
draw from the target, at any temperature; the acceptance at u is the target mass of its distinct
child tokens. It is the same walk as NSS (``verify.nss``, which runs ``qfree_walk``).

The walk reads the target through a row provider (core.rows) so the engine runs it
*lazily*: at a node it gathers the children's entries only (no row), and only on a miss (or at
the leaf) does it read the support of p(.|u) (a top-p nucleus, not V) to draw y there. Rows the
walk does not visit are never processed. The ``Verifier`` class runs the same walk on a
``DraftTree``'s rows, which is what the exact-enumeration tests check.

Seeded, drafter-invariant draws (``core.noise``): given a ``NoiseAt`` instead of an ``Rng``, the
walk draws y at node u as the Gumbel-max of p(.|u) with the noise of u's absolute position (root
position + depth of u): exactly the token plain sampling draws there with the same seed. It moves
to the child with token y, else emits y; so it emits plain sampling's tokens, for ANY tree (the
tree only decides how many of them one target forward confirms).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD
from verispec.core.noise import NoiseAt
from verispec.core.rng import Rng
from verispec.core.rows import Rows, draw_on_support
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at


def miss_law(ids: np.ndarray, target: np.ndarray, child_tokens: list[int]) -> tuple[np.ndarray, bool]:
    """p restricted to the tokens that are not children, normalised, in the coordinates of the
    target's support: ids (m,) ascending token ids, target (m,) = p(ids). Child tokens outside the
    support (p = 0) have nothing to remove. Returns (law (m,), False), or (target, True) when the
    rest has no mass (a miss of probability ~0: rounding only)."""
    rest = np.array(target, dtype=np.float64)
    rest[np.isin(ids, child_tokens)] = 0.0
    mass = rest.sum()
    if not mass > RESIDUAL_MASS_GUARD:
        return target, True
    rest /= mass
    return rest, False


def qfree_walk(
    children_of: Callable[[int], dict[int, int]], rows: Rows, rng: Rng | NoiseAt
) -> tuple[list[int], int, bool, int]:
    """Walk a candidate tree from the root.

    children_of(node) -> {child token: child node} (first child wins for repeated tokens);
    rows: the target rows p(.|node) as a ``Rows`` provider (core.rows; read by entries and
    supports; each row sums to 1).
    Returns (visited nodes root first, emitted token y, is_bonus, residual guard hits).

    The draw y ~ p(.|u) at an internal node is made in two exact stages, so nothing O(V) is read
    while children are hit: a categorical over {each distinct child token c: p(c)} U {miss: the
    rest}; only on a miss is y drawn from p restricted to the non-child tokens, on p's support.
    With a ``NoiseAt`` the draws are the seed's Gumbel-max draws instead (``noise_walk``).
    """
    if isinstance(rng, NoiseAt):
        return noise_walk(children_of, rows, rng)
    node = ROOT
    visited = [ROOT]
    while True:
        child_of = children_of(node)
        if not child_of:
            return visited, draw_on_support(rng, rows, node)[0], True, 0
        tokens = list(child_of)
        hit = rows.probs_of([node] * len(tokens), tokens)  # one gather, no full row
        hit_mass = float(hit.sum())
        # rows sum to 1 (within 1e-6, checked where they are built), so the miss mass needs no
        # pass over V; the categorical renormalises by the total
        miss = max(1.0 - hit_mass, 0.0)
        choice = rng.categorical(np.append(hit, miss) / (hit_mass + miss))
        if choice < len(tokens):
            node = child_of[tokens[choice]]
            visited.append(node)
            continue
        token, guard = draw_on_support(rng, rows, node, lambda ids, p: miss_law(ids, p, tokens))
        return visited, token, False, guard


def noise_walk(
    children_of: Callable[[int], dict[int, int]], rows: Rows, draws: NoiseAt
) -> tuple[list[int], int, bool, int]:
    """The walk with the seed's draws: y at node u (depth d) is the Gumbel-max of p(.|u) at
    position draws.position + d; move to the child with token y, else emit y (a bonus at a
    leaf). Same return value as ``qfree_walk`` (never a guard hit: no residual is built)."""
    node = ROOT
    visited = [ROOT]
    while True:
        child_of = children_of(node)
        token = draws.draw(rows, node, len(visited) - 1)
        child = child_of.get(token)
        if child is None:
            return visited, token, not child_of, 0
        node = child
        visited.append(node)


class QFreeTreeVerification(Verifier):
    """The q-free walk above on a ``DraftTree``. Exact for every scheme, the deterministic one
    included; it is the rule the engine runs on target-aware token trees."""

    name = "qfree"
    section = "§13"
    lossless = True
    supported_schemes = frozenset(DraftScheme)

    def _verify(self, tree: DraftTree, rng: Rng | NoiseAt) -> VerifyResult:
        visited, token, is_bonus, guard = qfree_walk(lambda node: first_child_of_token(tree, node), tree.target, rng)
        extra = {"diagnostics": {"residual_guard_hits": guard}} if guard else {}
        return result_at(tree, visited[-1], token, is_bonus, **extra)


def first_child_of_token(tree: DraftTree, node: int) -> dict[int, int]:
    """{child token: first child in sampling order with that token} of ``node``."""
    child_of: dict[int, int] = {}
    for child in tree.children[node]:
        child_of.setdefault(int(tree.tokens[child]), child)
    return child_of

"""Greedy multi-path block verification, GMPBV (ALGORITHMS.md §7; [GMPBV paper], arXiv 2602.16961).

§7.1 Select, among K i.i.d. drafted paths, the one with the lexicographically largest key of
local ranks, the local order at each prefix sorting tokens by p/q ascending (q = 0 counts as
+inf; ties by token id). Equivalently walk the trie, taking the child with the largest p/q.
§7.2 The selected path has the skewed law Q̃(z) = (C(z) + Q(z))^K - C(z)^K, C(z) being the draft
mass of full paths ranked below the paths through z, with conditionals q̃(x|z) = Q̃(z,x)/Q̃(z).
§7.3 Run BV on the selected path with draft vectors q̃. Lossless per iteration; K = 1 is BV.
"""

from __future__ import annotations

import numpy as np

from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, path_rows, result_at
from verispec.verify.bv import block_verify_path


def below_mass(target: np.ndarray, draft: np.ndarray, token: int) -> float:
    """sum of q(y) over tokens y ranked below ``token`` in the local order (p/q ascending, ties by
    lower token id first). O(V), no sort. The ratio is the float64 quotient p/q everywhere
    (selection, below_mass, below_mass_all), so all three agree on every rounding-level tie;
    tokens with q(y) = 0 carry no mass and may compare as they like."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = target / draft
    ratio = ratios[token]
    mass = float(draft @ (ratios < ratio))
    ties = np.flatnonzero(ratios[:token] == ratio)
    return mass + float(draft[ties].sum())


def below_mass_all(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """below_mass for every token at once, shape (V,).

    Only tokens with 0 < p/q < inf need a sort: tokens with p = 0 (ratio 0) sit at the bottom in
    id order (a cumulative sum), and tokens with q = 0 carry no draft mass, so their own value is
    never used with a positive weight. This keeps the cost low after top-k / top-p truncation.
    """
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
    ratios = target[middle] / draft[middle]
    order = np.argsort(ratios)
    ranked_ratios = ratios[order]
    if np.any(ranked_ratios[1:] == ranked_ratios[:-1]):  # exact ties: break them by token id
        order = np.lexsort((middle, ratios))
    ranked = middle[order]
    ranked_mass = draft[ranked]
    below[ranked] = bottom + np.cumsum(ranked_mass) - ranked_mass
    below[draft <= 0] = bottom + float(ranked_mass.sum())
    return below


def skewed_mass(lower, added, num_drafts: int):
    """(lower + added)^K - lower^K without cancellation (§7.2 numerics); arrays broadcast.

    Written as added * sum_{j<K} (lower + added)^j lower^(K-1-j): every term is >= 0, so there
    is no cancellation and no transcendental function."""
    lower = np.asarray(lower, dtype=np.float64)
    added = np.asarray(added, dtype=np.float64)
    upper = lower + added
    # Horner in upper: sum_{j<K} upper^j lower^(K-1-j) = ((upper + lower) upper + lower^2) upper + ...
    total = np.ones(np.broadcast(lower, added).shape)
    lower_power = np.ones_like(total)
    for _ in range(num_drafts - 1):
        lower_power *= lower
        total *= upper
        total += lower_power
    return added * total


def select_greedy_path(tree: DraftTree) -> tuple[int, ...]:
    """§7.1: from the root, repeatedly move to the child with the largest (p/q, token id)."""
    path, node = [], ROOT
    while tree.children[node]:
        children = tree.children[node]
        tokens = [int(tree.tokens[child]) for child in children]
        # one gather per side (core.rows): only the entries of the children, no full rows
        target = tree.target.probs_of([node] * len(tokens), tokens)
        draft = tree.draft.probs_of([node] * len(tokens), tokens)
        node = children[max(range(len(children)), key=lambda i: (target[i] / draft[i], tokens[i]))]
        path.append(node)
    return tuple(path)


class SkewedPathLaw:
    """q̃ along a selected path (§7.2). ``token_probs`` (L,) holds q̃(s_i | s_{<i}); indexing
    ``self[i]`` gives the full q̃(.|s_{1:i}) vector (V,), built on first use (one sort)."""

    def __init__(self, target_rows: np.ndarray, draft_rows: np.ndarray, tokens: np.ndarray, num_drafts: int):
        self.target_rows, self.draft_rows, self.num_drafts = target_rows, draft_rows, num_drafts
        length = len(tokens)
        self.below = np.zeros(length + 1)  # C(s_{1:i})
        self.mass = np.ones(length + 1)  # Q(s_{1:i})
        for i, token in enumerate(tokens):
            self.below[i + 1] = self.below[i] + self.mass[i] * below_mass(target_rows[i], draft_rows[i], token)
            self.mass[i + 1] = self.mass[i] * draft_rows[i][token]
        self.joint = skewed_mass(self.below, self.mass, num_drafts)  # Q̃(s_{1:i}), i = 0..L
        self.token_probs = self.joint[1:] / self.joint[:-1]
        self._rows: dict[int, np.ndarray] = {}

    def __getitem__(self, position: int) -> np.ndarray:
        if position not in self._rows:
            target, draft = self.target_rows[position], self.draft_rows[position]
            lower = self.below[position] + self.mass[position] * below_mass_all(target, draft)
            row = skewed_mass(lower, self.mass[position] * draft, self.num_drafts)
            self._rows[position] = row / row.sum()
        return self._rows[position]


class GreedyMultiPathBV(Verifier):
    name = "gmpbv"
    section = "§7"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        path = select_greedy_path(tree)
        rows, target_rows, draft_rows = path_rows(tree, path)
        tokens = tree.tokens[list(path)]
        law = SkewedPathLaw(target_rows, draft_rows, tokens, max(tree.num_paths, 1))
        tau, dist, guard = block_verify_path(rng, target_rows, law, tokens, law.token_probs)
        return result_at(
            tree, rows[tau], rng.categorical(dist), tau == len(path), diagnostics={"residual_guard_hits": guard}
        )

"""SpecTr-GBV as published ([SpecTr-GBV paper], arXiv 2604.25925, Alg. 1-3; ALGORITHMS.md §6.1).

NOT LOSSLESS for K >= 2, with or without its modification (§6.2 item 2: TV 4-14 % per block).
Kept as the published reference and as a negative control; for K = 1 it equals GBV-mod (§4).
Use SpecTr-GBV★ (``spectr-gbv-star``, §6.3) for the lossless version.

With joints from the block start, G(z) = P(z) ([P(z) - Q(z)]_+ / P(z))^K and F = P - G:
  h(z) = [sum_x G(z,x) - G(z)] / [1 - (1 - Q(z))^K - P(z) + sum_x G(z,x)]   (|z| < L, Eq. 2)
  h(z) = F(z) / [1 - (1 - Q(z))^K]                                          (|z| = L, Eq. 3)
  residual y ~ norm(G(t, .)) after the accepted sub-block t                 (Eq. 4)
  modification p̂(x|z') ∝ G(z', x) along the emitted path                    (Alg. 2)
"""

from __future__ import annotations

import math

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD, safe_log
from verispec.core.rng import Rng
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, result_at
from verispec.verify.modification import ModificationWindow, PlainDraftJoint


def _gap_mass(target_joint: float, draft_joint: float, num_drafts: int) -> float:
    """G = P ([P - Q]_+/P)^K for one node (0 where P <= Q)."""
    if target_joint <= draft_joint:
        return 0.0
    return target_joint * (1.0 - draft_joint / target_joint) ** num_drafts


def _children_gap(target_joint: float, draft_joint: float, target: np.ndarray, draft: np.ndarray, num_drafts: int) -> np.ndarray:
    """G(z, x) for every x, shape (V,); computed only where P(z,x) > Q(z,x) (elsewhere 0)."""
    gaps = np.zeros_like(target)
    children_p, children_q = target_joint * target, draft_joint * draft
    positive = np.flatnonzero(children_p > children_q)
    ratio = 1.0 - children_q[positive] / children_p[positive]
    gaps[positive] = children_p[positive] * ratio**num_drafts
    return gaps


def _children_gap_sum(target_joint: float, draft_joint: float, target: np.ndarray, draft: np.ndarray, num_drafts: int) -> float:
    """sum_x G(z, x), without the (V,) array of ``_children_gap``: only the stop probability's
    sum is needed at every visited node, and the scatter into a zero row was most of its cost."""
    children_p, children_q = target * target_joint, draft * draft_joint
    positive = children_p > children_q
    children_p = children_p[positive]
    ratio = 1.0 - children_q[positive] / children_p
    gap = children_p
    for _ in range(num_drafts):  # integer power by products: faster than ** on a float array
        gap = gap * ratio
    return float(gap.sum())


class SpecTrGBVPublished(Verifier):
    name = "spectr-gbv"
    section = "§6.1"
    lossless = False  # for K >= 2 (§6.2); exact only at K = 1
    needs_target_modification = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS})
    modify_target = True

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        num_drafts = max(tree.num_paths, 1)
        paths = tree.paths
        length = len(paths[0])
        log_p = np.zeros(tree.num_nodes)  # log P(z), log Q(z) from the block start
        log_q = np.zeros(tree.num_nodes)
        for node in range(1, tree.num_nodes):
            parent, token = int(tree.parents[node]), int(tree.tokens[node])
            log_p[node] = log_p[parent] + safe_log(tree.target_probs[parent, token])
            log_q[node] = log_q[parent] + safe_log(tree.draft_probs[parent, token])

        def joint(node):
            return math.exp(log_p[node]), math.exp(log_q[node])

        def stop_probability(node: int, depth: int) -> float:
            p_z, q_z = joint(node)
            covered = -math.expm1(num_drafts * math.log1p(-q_z)) if q_z < 1.0 else 1.0  # 1 - (1 - Q)^K
            if depth == length:
                denominator, numerator = covered, p_z - _gap_mass(p_z, q_z, num_drafts)
            else:
                children_gap = _children_gap_sum(p_z, q_z, tree.target_probs[node], tree.draft_probs[node], num_drafts)
                numerator = children_gap - _gap_mass(p_z, q_z, num_drafts)
                denominator = covered - p_z + children_gap
            return 1.0 if denominator <= 0 else numerator / denominator

        rejected: set[int] = set()
        best_depth, best_node = 0, ROOT
        for path in paths:
            for depth in range(best_depth + 1, length):
                node = path[depth - 1]
                if node not in rejected and rng.bernoulli(stop_probability(node, depth)):
                    best_depth, best_node = depth, node
                else:
                    rejected.add(node)
            leaf = path[length - 1]
            if leaf not in rejected and rng.bernoulli(stop_probability(leaf, length)):
                return result_at(tree, leaf, rng.categorical(tree.target_probs[leaf]), True)
            rejected.add(leaf)
        p_t, q_t = joint(best_node)
        weights = _children_gap(p_t, q_t, tree.target_probs[best_node], tree.draft_probs[best_node], num_drafts)
        guard = not weights.sum() > RESIDUAL_MASS_GUARD
        dist = tree.target_probs[best_node] if guard else weights / weights.sum()
        next_token = rng.categorical(dist)
        window = None
        remaining = length - 1 - best_depth
        if self.modify_target and remaining > 0:
            window = ModificationWindow(
                log_p[best_node] + safe_log(tree.target_probs[best_node, next_token]),
                PlainDraftJoint(log_q[best_node] + safe_log(tree.draft_probs[best_node, next_token])),
                remaining,
                power=num_drafts,
            )
        return result_at(tree, best_node, next_token, False, modification=window, diagnostics={"residual_guard_hits": guard})


class SpecTrGBVPublishedWithoutModification(SpecTrGBVPublished):
    """§6.2: the published rule with the modification dropped (also not lossless)."""

    name = "spectr-gbv-nomod"
    needs_target_modification = False
    modify_target = False

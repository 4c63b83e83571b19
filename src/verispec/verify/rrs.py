"""Recursive rejection sampling: RRS (with replacement) and RRSw (without replacement)
(ALGORITHMS.md §8; SpecInfer MSS, Yang et al. 2401.06706, Jeon et al. 2402.14160).

One node (§8.1), target t_0 = p(.|u), draft d_0 = q(.|u), candidates c_1..c_m in sampling order:

    for j = 1..m:
        accept c_j with probability min(1, t_{j-1}(c_j) / d_{j-1}(c_j)); stop
        t_j = norm([t_{j-1} - d_{j-1}]_+)
        d_j = d_{j-1}                                  (RRS: c_j i.i.d. ~ q, duplicates kept)
        d_j = norm(d_{j-1} with entry c_j set to 0)    (RRSw: c_j drawn without replacement)
    nothing accepted: y ~ t_m

Tree (§8.2, §13): top-down from the root; at node u apply the single-node rule to u's candidates,
move to the accepted child, emit y ~ t_m at an all-reject, or a bonus y ~ p(.|leaf) at a leaf.

Candidates per scheme:
  RRS   CHAIN (one candidate = SD), IID_PATHS (the raw next tokens of the drafted paths that
        survive the accepted prefix, in draft order, duplicates kept, as for K-SEQ §5.2),
        IID_TREE (children, duplicates kept as separate nodes).
  RRSw  CHAIN, IID_PATHS (the trie's distinct children in first-appearance order: the distinct
        values of i.i.d. draws are a without-replacement sample), WITHOUT_REPLACEMENT trees.
``RRSDeduplicated`` is the §8.1 pitfall kept as a negative control: RRS's with-replacement
formulas applied to the deduplicated trie children of i.i.d. paths. It is NOT lossless.

All vectors are float64 of shape (V,); the work per node is O(V) per rejected candidate and
nothing is computed over the vocabulary while candidates are accepted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD, normalized_positive_part
from verispec.core.rng import Rng
from verispec.core.rows import DenseRows, Rows, draw_from
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at

# A node rule: (rng, target (V,), draft (V,), candidate tokens) ->
#   (index of the accepted candidate or None, law of the extra token if none accepted, guard hits)
NodeRule = Callable[[Rng, np.ndarray, np.ndarray, Sequence[int]], tuple[int | None, np.ndarray | None, int]]


def _positive_residual(target: np.ndarray, draft: np.ndarray, fallback: np.ndarray) -> tuple[np.ndarray, bool]:
    """norm([target - draft]_+), shape (V,); (fallback, True) if it has no mass, a branch of
    probability ~0 in exact arithmetic (§1 rule 3: fall back to the node's un-modified p)."""
    return normalized_positive_part(target - draft, fallback)


def _recursive_rejection(
    rng: Rng, target, draft, candidates: Sequence[int], without_replacement: bool, node: int = 0
) -> tuple[int | None, np.ndarray | Callable | None, int]:
    """§8.1 with diagnostics: (accepted index or None, t_m or None, residual guard hits).

    target / draft: the (V,) rows p(.|u), q(.|u), or row providers (core.rows) with ``node`` the
    row to read. Until a candidate is rejected only one entry per candidate is read; full rows
    are built at the first rejection. With point-mass target rows (greedy) every t_j is p itself
    (norm([p - d]_+) = p, or its guard fallback p), so no row is ever built and t_m is returned
    as a builder for ``draw_from``, which draws the argmax."""
    if not isinstance(target, Rows):
        target, draft, node = DenseRows(np.asarray(target)[None]), DenseRows(np.asarray(draft)[None]), 0
    t = d = None  # None: still the untouched rows p(.|u), q(.|u)
    guards = 0
    last = len(candidates) - 1
    for j, token in enumerate(candidates):
        t_c = target.prob(node, token) if t is None else float(t[token])
        d_c = draft.prob(node, token) if d is None else float(d[token])
        accept = 1.0 if t_c >= d_c else t_c / d_c
        if rng.bernoulli(accept):
            return j, None, guards
        if not target.greedy:
            t, guard = _positive_residual(
                target.row(node) if t is None else t, draft.row(node) if d is None else d, target.row(node)
            )
            guards += guard
        if without_replacement and j < last:
            # d_j = norm(d_{j-1} with c_j removed); support exhaustion leaves nothing to draw, so
            # the sampler stops and no further candidate reaches this line.
            d = (draft.row(node) if d is None else d).copy()
            d[token] = 0.0
            mass = d.sum()
            if mass > 0.0:
                d *= 1.0 / mass
    if t is None:
        return None, (lambda: (target.row(node), 0)), guards
    return None, t, guards


def recursive_rejection(
    rng: Rng, target: np.ndarray, draft: np.ndarray, candidates: Sequence[int], without_replacement: bool
) -> tuple[int | None, np.ndarray | None]:
    """One node of RRS / RRSw (ALGORITHMS.md §8.1).

    target: p(.|u), shape (V,); draft: q(.|u), shape (V,); candidates: token ids in sampling order
    (RRS: i.i.d. draws from q, duplicates as separate entries; RRSw: without-replacement draws).
    Returns (index of the accepted candidate, None), or (None, t_m) when every candidate was
    rejected; the extra token is then y ~ t_m (shape (V,), sums to 1).
    """
    accepted, final_residual, _ = _recursive_rejection(rng, target, draft, candidates, without_replacement)
    if callable(final_residual):
        final_residual = final_residual()[0]
    return accepted, final_residual


def rrs_acceptance(target: np.ndarray, draft: np.ndarray, num_candidates: int) -> float:
    """Closed-form acceptance of RRS with m i.i.d. candidates at one node (§8.1):
    1 - prod_{j=0}^{m-1} (1 - sum_x min(t_j(x), q(x))), t_0 = p, t_{j+1} = norm([t_j - q]_+)."""
    t = np.asarray(target, dtype=np.float64)
    q = np.asarray(draft, dtype=np.float64)
    reject = 1.0
    for _ in range(int(num_candidates)):
        overlap = float(np.minimum(t, q).sum())
        reject *= max(0.0, 1.0 - overlap)
        weights = np.maximum(t - q, 0.0)
        mass = weights.sum()
        if not mass > RESIDUAL_MASS_GUARD:
            break
        t = weights / mass
    return 1.0 - reject


# ----- top-down driver shared by the node-wise rules (§8.2, §5.2, §10, §13) -------------------


def top_down(tree: DraftTree, rng: Rng, node_rule: NodeRule, raw_paths: bool, reads_rows: bool = False) -> VerifyResult:
    """Walk the tree from the root, applying ``node_rule`` at each node (ALGORITHMS.md §8.2).

    raw_paths=True: the candidates at a node are the next raw tokens of the drafted paths that
    agree with the accepted prefix, in draft order, duplicates kept (§5.2; schemes CHAIN,
    IID_PATHS). raw_paths=False: the candidates are the node's children in sampling order.
    A leaf (no candidate) gives a bonus token y ~ p(.|leaf).

    reads_rows=False: ``node_rule(rng, p row (V,), q row (V,), tokens)``; True:
    ``node_rule(rng, target rows, draft rows, node, tokens)`` reading the tree's row providers
    (core.rows) itself, so a node costs O(V) only where the rule needs a full row. The law of
    the extra token a rule returns is a (V,) array or a builder () -> (law, guard hits).
    """
    node, depth, guards = ROOT, 0, 0
    if raw_paths:
        paths = tree.paths if tree.paths else (chain_nodes(tree),)
        alive = list(range(len(paths)))
    while True:
        if raw_paths:
            candidate_nodes = [paths[k][depth] for k in alive if len(paths[k]) > depth]
        else:
            candidate_nodes = list(tree.children[node])
        if not candidate_nodes:
            bonus, _ = draw_from(rng, tree.target, node)
            return result_at(tree, node, bonus, True, diagnostics={"residual_guard_hits": guards})
        tokens = [int(tree.tokens[c]) for c in candidate_nodes]
        if reads_rows:
            accepted, extra_law, guard = node_rule(rng, tree.target, tree.draft, node, tokens)
        else:
            accepted, extra_law, guard = node_rule(rng, tree.target.row(node), tree.draft.row(node), tokens)
        guards += guard
        if accepted is None:
            build = extra_law if callable(extra_law) else (lambda law=extra_law: (law, 0))
            token, guard = draw_from(rng, tree.target, node, build)
            guards += guard
            return result_at(tree, node, token, False, diagnostics={"residual_guard_hits": guards})
        node = candidate_nodes[accepted]
        if raw_paths:
            alive = [k for k in alive if len(paths[k]) > depth and paths[k][depth] == node]
        depth += 1


def _with_replacement_rule(rng, target, draft, node, tokens):
    return _recursive_rejection(rng, target, draft, tokens, without_replacement=False, node=node)


def _without_replacement_rule(rng, target, draft, node, tokens):
    return _recursive_rejection(rng, target, draft, tokens, without_replacement=True, node=node)
class RRS(Verifier):
    """Recursive rejection sampling with replacement (§8): i.i.d. candidates, duplicates kept."""

    name = "rrs"
    section = "§8"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS, DraftScheme.IID_TREE})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        raw = tree.scheme in (DraftScheme.CHAIN, DraftScheme.IID_PATHS)
        return top_down(tree, rng, _with_replacement_rule, raw_paths=raw, reads_rows=True)


class RRSw(Verifier):
    """Recursive rejection sampling without replacement (§8): distinct candidates in sampling
    order (trie children of i.i.d. paths, or without-replacement children)."""

    name = "rrsw"
    section = "§8"
    lossless = True
    supported_schemes = frozenset({DraftScheme.CHAIN, DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        return top_down(tree, rng, _without_replacement_rule, raw_paths=False, reads_rows=True)


class RRSDeduplicated(Verifier):
    """§8.1 pitfall, kept as a negative control (§14.2): RRS's with-replacement formulas applied
    to the deduplicated trie children of K i.i.d. paths. NOT lossless (TV 0.002-0.013 on toys)."""

    name = "rrs-dedup"
    section = "§8.1"
    lossless = False
    supported_schemes = frozenset({DraftScheme.IID_PATHS})

    def _verify(self, tree: DraftTree, rng: Rng) -> VerifyResult:
        return top_down(tree, rng, _with_replacement_rule, raw_paths=False, reads_rows=True)

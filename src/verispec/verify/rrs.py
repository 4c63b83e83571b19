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

Vectors are float64 and live on the target's support at the node (every t_j vanishes
outside supp(p(.|u)); ``_recursive_rejection`` says where each quantity lives): the work per node
is O(|supp p|) per rejected candidate, nothing is computed while candidates are accepted, and no
step reads all V entries of a row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from verispec.core.probs import RESIDUAL_MASS_GUARD, normalized_positive_part
from verispec.core.rng import Rng
from verispec.core.rows import DenseRows, Rows, draw_from, draw_on_support
from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.base import Verifier, VerifyResult, chain_nodes, result_at
from verispec.verify.support import SupportDraw, kept_on_support, positions_of, value_at

# A node rule: (rng, target (V,), draft (V,), candidate tokens) ->
#   (index of the accepted candidate or None, law of the extra token if none accepted, guard hits)
NodeRule = Callable[[Rng, np.ndarray, np.ndarray, Sequence[int]], tuple[int | None, np.ndarray | None, int]]


def _recursive_rejection(
    rng: Rng, target: Rows, draft: Rows, candidates: Sequence[int], without_replacement: bool, node: int
) -> tuple[int | None, SupportDraw | None, int]:
    """§8.1 at ``node`` of the row providers (core.rows), with diagnostics:
    (accepted index or None, the law of y ~ t_m as a SupportDraw or None, residual guard hits).

    Where each quantity lives, S = supp(p(.|u)), ids, p_S = target.support(u):
      t_j     t_0 = p vanishes outside S and t_j = norm([t_{j-1} - d_{j-1}]_+) stays 0 there, so
              every t_j is kept over ids only; t_j(c) of a candidate c outside S is 0 (a rejection
              unless d(c) = 0 too, as on full rows).
      d_j     RRS: q. RRSw: d_j(x) = q(x) / Z_j for x not removed, 0 for the removed c_1..c_j, with
              Z_j = 1 - sum_{i<=j} q(c_i) the draft mass left: a scalar, since q sums to 1 over V;
              this is the normaliser over the whole vocabulary (the mass outside S included), the
              law the sampler drew c_{j+1} from. Its absolute error is |1 - sum_V q| plus rounding
              (~1e-15 for float64-normalised rows), a relative error on d_j that only grows when Z_j
              is tiny. On S, d_j = q_S / Z_j with the removed entries zeroed (q_S = draft.gather).
    Until a candidate is rejected only one entry per candidate is read; the support is read at the
    first rejection. With point-mass target rows (greedy) every t_j is p itself
    (norm([p - d]_+) = p, or its guard fallback p), so no vector is built and the extra token is
    a draw from p (the argmax)."""
    ids = p_support = q_support = t = None  # t None: still the untouched row p(.|u)
    removed: list[int] = []  # RRSw: c_1..c_j, zero in d_j
    removed_mass = 0.0  # RRSw: sum_{i<=j} q(c_i)
    guards = 0
    last = len(candidates) - 1
    for j, token in enumerate(candidates):
        t_c = target.prob(node, token) if t is None else value_at(ids, t, token)
        d_c = _draft_entry(draft, node, token, removed, removed_mass)
        accept = 1.0 if t_c >= d_c else t_c / d_c
        if rng.bernoulli(accept):
            return j, None, guards
        if not target.greedy:
            if ids is None:
                ids, p_support = target.support(node)
                q_support = draft.gather(node, ids)
                t = p_support
            d_support = _draft_on_support(q_support, ids, removed, removed_mass)
            t, guard = normalized_positive_part(t - d_support, p_support)
            guards += guard
        if without_replacement and j < last:
            # d_j = norm(d_{j-1} with c_j removed); support exhaustion leaves nothing to draw, so
            # the sampler stops and no further candidate reaches this line.
            if token not in removed:
                removed.append(token)
                removed_mass += draft.prob(node, token)
    if t is None:
        return None, SupportDraw(), guards
    return None, kept_on_support(ids, t), guards


def _draft_entry(draft: Rows, node: int, token: int, removed: list[int], removed_mass: float) -> float:
    """d_j(token) = q(token) / (1 - removed mass), 0 when removed or when no draft mass is left
    (support exhausted: d_j = 0 everywhere, as full rows leave it)."""
    if not removed:
        return draft.prob(node, token)
    left = 1.0 - removed_mass
    if token in removed or not left > 0.0:
        return 0.0
    return draft.prob(node, token) / left


def _draft_on_support(q_support: np.ndarray, ids: np.ndarray, removed: list[int], removed_mass: float) -> np.ndarray:
    """d_j over ids: q_S / (1 - removed mass) with the removed entries zeroed (q_S itself while
    nothing is removed: callers must not write into it)."""
    if not removed:
        return q_support
    left = 1.0 - removed_mass
    if not left > 0.0:
        return np.zeros_like(q_support)
    d_support = q_support / left
    d_support[positions_of(ids, removed)] = 0.0
    return d_support


def recursive_rejection(
    rng: Rng, target: np.ndarray, draft: np.ndarray, candidates: Sequence[int], without_replacement: bool
) -> tuple[int | None, np.ndarray | None]:
    """One node of RRS / RRSw (ALGORITHMS.md §8.1).

    target: p(.|u), shape (V,); draft: q(.|u), shape (V,); candidates: token ids in sampling order
    (RRS: i.i.d. draws from q, duplicates as separate entries; RRSw: without-replacement draws).
    Returns (index of the accepted candidate, None), or (None, t_m) when every candidate was
    rejected; the extra token is then y ~ t_m (shape (V,), sums to 1).
    """
    target = np.asarray(target, dtype=np.float64)
    rows = DenseRows(target[None]), DenseRows(np.asarray(draft, dtype=np.float64)[None])
    accepted, extra, _ = _recursive_rejection(rng, *rows, candidates, without_replacement, node=0)
    if accepted is not None:
        return accepted, None
    return None, _dense_law(extra, rows[0], 0, target)


def _dense_law(extra: SupportDraw, target_rows: Rows, node: int, target_row: np.ndarray) -> np.ndarray:
    """A SupportDraw as the (V,) vector it stands for (zero outside the target's support)."""
    if extra.build is None:
        return target_row
    ids, p_support = target_rows.support(node)
    law = np.zeros(target_rows.vocab_size)
    law[ids] = extra.build(ids, p_support)[0]
    return law


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
    the extra token a rule returns is a ``SupportDraw`` (drawn on the target's support at the
    node, core.rows.draw_on_support: the rules of §8, §9 and SD), a (V,) array, or a builder
    () -> ((V,) law, guard hits). The bonus at a leaf is drawn from p(.|leaf) on its support.
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
            bonus, _ = draw_on_support(rng, tree.target, node)  # p vanishes outside its support
            return result_at(tree, node, bonus, True, diagnostics={"residual_guard_hits": guards})
        tokens = [int(tree.tokens[c]) for c in candidate_nodes]
        if reads_rows:
            accepted, extra_law, guard = node_rule(rng, tree.target, tree.draft, node, tokens)
        else:
            accepted, extra_law, guard = node_rule(rng, tree.target.row(node), tree.draft.row(node), tokens)
        guards += guard
        if accepted is None:
            if isinstance(extra_law, SupportDraw):
                token, guard = draw_on_support(rng, tree.target, node, extra_law.build)
            else:
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

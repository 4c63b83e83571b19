"""The greedy multi-path local order, path selection and skewed draft law (ALGORITHMS.md §7.1-7.2),
shared by GMPBV (§7), SpecTr-GBV★ (§6.3), their target modification (``modification.py``) and the
closed forms (``theory.closed_forms``).

One definition of the local order at a prefix z, used by the selection AND by the law, so the two
cannot disagree (a selection that breaks ties one way and a law that breaks them the other way is
lossy, ALGORITHMS.md §7.1):

    token a is ranked below token b  iff  (r(a), a) < (r(b), b)  lexicographically,
    with r(x) = p(x|z) / q(x|z) as a float64 quotient and r(x) = +inf where q(x|z) = 0,

i.e. ratio ascending, exact ties broken by the LOWER token id ranking lower. ``local_ratios`` and
``order_key`` are the definition; every other function here derives from them. Tokens with
q(x|z) = 0 carry no draft mass, so where they sit never changes the law.
"""

from __future__ import annotations

import numpy as np

from verispec.core.tree import ROOT, DraftScheme, DraftTree
from verispec.verify.path_rows import row_gather, row_support
from verispec.verify.support import lookup
from verispec.errors import InvalidDraftError


# ----- the local order (the one definition) ---------------------------------------------------
def local_ratios(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """r(x) = p(x)/q(x) for every token, shape (V,), with r = +inf where q = 0 (§7.1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(draft > 0.0, target / draft, np.inf)


def order_key(ratios: np.ndarray, index: int, token: int) -> tuple[float, int]:
    """Sort key in the local order of ``token``, whose ratio is ``ratios[index]``: larger key =
    ranked higher (§7.1)."""
    return (float(ratios[index]), int(token))


def ranked_below(ratios: np.ndarray, token: int) -> np.ndarray:
    """Boolean mask (V,) of the tokens whose ``order_key`` is smaller than ``token``'s."""
    ratio = ratios[token]
    mask = ratios < ratio
    mask[:token] |= ratios[:token] == ratio  # equal ratio and a lower id: ranked below
    return mask


def local_order(ratios: np.ndarray, token_ids: np.ndarray) -> np.ndarray:
    """Indices into ``token_ids`` sorting those tokens by ``order_key`` ascending (lowest rank
    first); ``ratios`` are their ratios, same length."""
    return np.lexsort((token_ids, ratios))


# ----- cumulative draft mass below a token ------------------------------------------------------
def below_mass(target: np.ndarray, draft: np.ndarray, token: int) -> float:
    """Σ q(y) over the tokens y ranked below ``token`` in the local order. O(V), no sort.

    Uses the bare quotient p/q, which equals ``local_ratios`` wherever q > 0 (q = 0 gives inf or
    NaN here, but such tokens add q = 0 to the sum whichever side they fall on): one pass less
    over the vocabulary on the hot path (called once per position of the selected path)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = target / draft
    if draft[token] <= 0.0:
        ratios[token] = np.inf
    return float(draft @ ranked_below(ratios, token))


def sorted_local_order(ratios: np.ndarray) -> np.ndarray:
    """``local_order(ratios, np.arange(n))`` for ratios >= 0 (no NaN, no -0.0), shape (n,), in one
    int64 value sort instead of an index sort (§7.1; at n = 50k on this project's AVX2 CPU the value
    sort takes ~0.5 ms, ``np.argsort`` ~1.35 ms and ``np.lexsort`` ~4.9 ms).

    Key of position i: the float64 bits of ratios[i] (a non-negative float orders like its int64
    view) with the low b = bit_length(n - 1) bits replaced by i. Sorting the keys orders by
    (truncated ratio, position); equal ratios have equal truncated ratios, so exact ties already
    come out in position (= token id) order. Distinct ratios that agree in all but their low b
    bits (relative gap < 2^(b-52)) may come out of order: the ranked ratios are checked for being
    non-decreasing, which certifies the full (ratio, position) order, and otherwise one stable
    sort by the full ratio repairs the (then nearly sorted) order without disturbing ties."""
    ratios = np.ascontiguousarray(ratios, dtype=np.float64)
    count = len(ratios)
    index_bits = max(count - 1, 0).bit_length()
    id_mask = (1 << index_bits) - 1
    keys = ratios.view(np.int64) & ~id_mask
    keys |= np.arange(count, dtype=np.int64)
    keys.sort()
    order = keys & id_mask
    ranked = ratios[order]
    if not np.all(ranked[1:] >= ranked[:-1]):  # near ties truncated into one key: repair
        order = order[np.argsort(ranked, kind="stable")]
    return order


def below_mass_all(target: np.ndarray, draft: np.ndarray) -> np.ndarray:
    """``below_mass`` for every token at once, shape (V,) (C(z, x) of §7.2 before scaling).

    Only tokens with 0 < r < inf need a sort: tokens with p = 0 (r = 0) sit at the bottom in id
    order (a cumulative sum, the same order as ``local_order``), and tokens with q = 0 carry no
    draft mass, so their own value is never used with a positive weight. This keeps the cost low
    after top-k / top-p truncation. The sort is ``sorted_local_order`` (exactly the local order,
    so the cumulative sums are the same floats as with ``local_order``).
    """
    vocab = len(draft)
    below = np.empty(vocab)
    if vocab and target.min() > 0.0 and draft.min() > 0.0:  # untruncated rows: no masks, no gathers
        ranked = sorted_local_order(target / draft)
        ranked_mass = draft[ranked]
        below[ranked] = np.cumsum(ranked_mass) - ranked_mass
        return below
    zero_ratio = (target == 0) & (draft > 0)
    bottom = 0.0
    if zero_ratio.any():  # rows truncated only in q have none: skip the pass
        zero_mass = np.where(zero_ratio, draft, 0.0)
        cumulative = np.cumsum(zero_mass)
        below[zero_ratio] = (cumulative - zero_mass)[zero_ratio]
        bottom = float(cumulative[-1])
    middle = np.flatnonzero((target > 0) & (draft > 0))
    ranked = middle[sorted_local_order(target[middle] / draft[middle])]
    ranked_mass = draft[ranked]
    below[ranked] = bottom + np.cumsum(ranked_mass) - ranked_mass
    below[draft <= 0] = bottom + float(ranked_mass.sum())
    return below


def below_mass_on_supports(
    target_ids: np.ndarray, target_values: np.ndarray, draft_ids: np.ndarray, draft_values: np.ndarray, query_ids
) -> np.ndarray:
    """``below_mass_all(target, draft)[query_ids]`` from the rows' supports, with no pass over V
    (a top-p nucleus holds ~10^2 of V = 10^5 tokens). Bit-identical to
    ``below_mass_all`` (tests/verify/test_below_mass_fast.py).

    p is ``target_values`` on ``target_ids`` and 0 elsewhere, q is ``draft_values`` on
    ``draft_ids`` and 0 elsewhere (ids ascending int64; zero values may be listed). Only tokens
    with q > 0 carry mass below anything: those with p = 0 (ratio 0) rank lowest, in id order (the
    bottom block), those with p > 0 rank by ``sorted_local_order`` of p/q above them, and a token
    with q = 0 has every mass below it (``below_mass_all``'s convention). The same cumulative sums
    in the same order as ``below_mass_all``, so the same floats."""
    target_ids, target_values = np.asarray(target_ids, dtype=np.int64), np.asarray(target_values, dtype=np.float64)
    draft_ids, draft_values = np.asarray(draft_ids, dtype=np.int64), np.asarray(draft_values, dtype=np.float64)
    query_ids = np.asarray(query_ids, dtype=np.int64)
    positive_target = target_values > 0.0
    target_ids, target_values = target_ids[positive_target], target_values[positive_target]
    positive_draft = draft_values > 0.0
    draft_ids, draft_values = draft_ids[positive_draft], draft_values[positive_draft]
    # bottom block: q > 0 and p = 0, in id order
    in_target = lookup(target_ids, draft_ids)[0]
    bottom_ids, bottom_mass = draft_ids[~in_target], draft_values[~in_target]
    bottom_cumulative = np.cumsum(bottom_mass)
    bottom = float(bottom_cumulative[-1]) if len(bottom_cumulative) else 0.0
    # middle block: p > 0 and q > 0, by (p/q, id)
    middle_ids, middle_mass = draft_ids[in_target], draft_values[in_target]
    middle_target = target_values[np.searchsorted(target_ids, middle_ids)]
    ranked = sorted_local_order(middle_target / middle_mass)
    ranked_mass = middle_mass[ranked]
    middle_below = np.empty(len(middle_ids))
    middle_below[ranked] = bottom + np.cumsum(ranked_mass) - ranked_mass
    # every query starts as a q = 0 token (everything with mass is below it), then the two blocks
    below = np.full(len(query_ids), bottom + float(ranked_mass.sum()))
    for block_ids, block_below in (
        (bottom_ids, bottom_cumulative - bottom_mass),
        (middle_ids, middle_below),
    ):
        hit, where = lookup(block_ids, query_ids)
        below[hit] = block_below[where[hit]]
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


# ----- selection --------------------------------------------------------------------------------
def num_iid_drafts(tree: DraftTree) -> int:
    """K, the number of i.i.d. drafted paths the skewed law is taken over.

    A CHAIN is K = 1. An IID_PATHS trie MUST carry its raw paths (duplicates kept): the law of
    the selected path depends on K, and guessing K = 1 is lossy."""
    if tree.scheme is DraftScheme.IID_PATHS:
        if tree.num_paths < 1:
            raise InvalidDraftError(
                "an IID_PATHS tree without its raw paths: greedy multi-path selection needs K, the number "
                "of i.i.d. drafts; build the tree with paths=... (verispec.draft.sample_iid_paths does)"
            )
        return tree.num_paths
    return 1


def greedy_child(tree: DraftTree, node: int) -> int:
    """The child of ``node`` whose token ranks highest in the local order at ``node`` (§7.1).
    Only the children's ratios are computed (O(children), not O(V))."""
    children = tree.children[node]
    tokens = tree.tokens[list(children)]
    # one gather per side (core.rows): only the children's entries, no full rows
    nodes = [node] * len(children)
    ratios = local_ratios(np.asarray(tree.target.probs_of(nodes, tokens)), np.asarray(tree.draft.probs_of(nodes, tokens)))
    best = max(range(len(children)), key=lambda i: order_key(ratios, i, int(tokens[i])))
    return children[best]


def select_greedy_path(tree: DraftTree) -> tuple[int, ...]:
    """§7.1: from the root, repeatedly move to the highest-ranked child; node indices, root excluded."""
    path, node = [], ROOT
    while tree.children[node]:
        node = greedy_child(tree, node)
        path.append(node)
    return tuple(path)


# ----- the skewed law of the selected path ------------------------------------------------------
class SkewedPathLaw:
    """q̃ along a selected path s_1..s_L (§7.2).

    Shapes: ``target_rows`` / ``draft_rows`` indexable by position 0..L-1, each (V,); ``tokens`` (L,).
    ``below[i]`` = C(s_{1:i}), ``mass[i]`` = Q(s_{1:i}), ``joint[i]`` = Q̃(s_{1:i}) for i = 0..L;
    ``token_probs`` (L,) = q̃(s_{i+1} | s_{1:i}); ``joint_row(i)`` (V,) = Q̃(s_{1:i}, .) before
    normalisation, which sums to ``joint[i]`` exactly in real arithmetic (the §14.5 item 5 check);
    ``self[i]`` = q̃(. | s_{1:i}) = joint_row(i) / joint[i], built on first use (one sort)."""

    def __init__(self, target_rows, draft_rows, tokens: np.ndarray, num_drafts: int):
        if num_drafts < 1:
            raise ValueError(f"the skewed law needs K >= 1 drafts, got {num_drafts}")
        self.target_rows, self.draft_rows, self.num_drafts = target_rows, draft_rows, num_drafts
        length = len(tokens)
        self._supports: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        self.below = np.zeros(length + 1)  # C(s_{1:i})
        self.mass = np.ones(length + 1)  # Q(s_{1:i})
        for i, token in enumerate(tokens):
            # from the rows' supports (no pass over V); the same floats as below_mass_all(...)[token]
            below_token = float(below_mass_on_supports(*self._supports_at(i), [int(token)])[0])
            self.below[i + 1] = self.below[i] + self.mass[i] * below_token
            self.mass[i + 1] = self.mass[i] * float(row_gather(draft_rows, i, [int(token)])[0])
        self.joint = skewed_mass(self.below, self.mass, num_drafts)  # Q̃(s_{1:i}), i = 0..L
        with np.errstate(divide="ignore", invalid="ignore"):  # 0/0 only on paths no draft reaches
            self.token_probs = self.joint[1:] / self.joint[:-1]
        self._rows: dict[int, np.ndarray] = {}

    def joint_row(self, position: int) -> np.ndarray:
        """Q̃(s_{1:position}, x) for every x, shape (V,), not normalised."""
        target, draft = self.target_rows[position], self.draft_rows[position]
        lower = self.below[position] + self.mass[position] * below_mass_all(target, draft)
        return skewed_mass(lower, self.mass[position] * draft, self.num_drafts)

    def _supports_at(self, position: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(target ids, p, draft ids, q) on the rows' supports at ``position``, cached."""
        if position not in self._supports:
            self._supports[position] = (*row_support(self.target_rows, position), *row_support(self.draft_rows, position))
        return self._supports[position]

    def gather(self, position: int, ids) -> np.ndarray:
        """``self[position][ids]`` (q̃(x | s_{1:position}) at ``ids``), entry by entry the same floats,
        without the (V,) row: the below masses from the supports, the skewed mass at ``ids`` only."""
        scale = self.joint[position]
        if not scale > 0.0:  # a path no draft reaches: the dense row normalises by its own sum
            return self[position][np.asarray(ids, dtype=np.int64)]
        ids = np.asarray(ids, dtype=np.int64)
        lower = self.below[position] + self.mass[position] * below_mass_on_supports(*self._supports_at(position), ids)
        added = self.mass[position] * row_gather(self.draft_rows, position, ids)
        return skewed_mass(lower, added, self.num_drafts) / scale

    def __getitem__(self, position: int) -> np.ndarray:
        if position not in self._rows:
            row = self.joint_row(position)
            # divide by Q̃(z) as defined, not by the row's own sum (which would hide a wrong C(z)
            # or a wrong order); the row's sum differs from it only by rounding
            scale = self.joint[position]
            self._rows[position] = row / (scale if scale > 0.0 else row.sum())
        return self._rows[position]

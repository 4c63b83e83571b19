"""Draft samplers: every sampling scheme the verifiers need, all drawing through an ``Rng``
(ALGORITHMS.md §1, §8.1, §9.1, §13).

A sampler reads the draft model through ``draft_fn(prefix) -> q(.|context, prefix)`` (shape (V,),
prefix = tuple of drafted tokens after the context); a draft that can score many prefixes in one
call (a neural draft with a tree mask) also offers ``draft_fn.batch_probs(prefixes) -> (m, V)``,
and the samplers then ask for one whole tree level at a time. A sampler returns a
``DraftSkeleton``: the tree's tokens, parents and draft vectors. ``DraftSkeleton.with_target`` adds the target vectors (one
target forward over all nodes) and gives the ``DraftTree`` the verifiers read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from verispec.core.noise import NoiseAt, gumbel_max
from verispec.core.rng import Rng
from verispec.core.rows import NodeRows, Rows
from verispec.core.tree import DraftScheme, DraftTree
from verispec.errors import ConfigError

DraftFn = Callable[[tuple[int, ...]], np.ndarray]
# A tree shape: a node is the tuple of its children's shapes; a leaf is ().
TreeShape = tuple


@dataclass(frozen=True)
class DraftSkeleton:
    """Tokens (n,), parents (n,), draft rows (``core.rows.Rows``, n rows over V; zero rows for
    nodes without children), scheme, raw paths (node indices), and each node's drafted prefix."""

    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    draft: Rows
    scheme: DraftScheme
    paths: tuple[tuple[int, ...], ...]
    prefixes: tuple[tuple[int, ...], ...]

    @property
    def num_nodes(self) -> int:
        return len(self.tokens)

    @property
    def draft_probs(self) -> np.ndarray:
        """Every draft row, (n, V) float64 (built on use: prefer ``draft``)."""
        return self.draft.dense()

    def with_target(self, target_probs: np.ndarray, validate: bool = True, verifier_accept_probs=None) -> DraftTree:
        return DraftTree.build(
            self.tokens,
            self.parents,
            target_probs,
            self.draft,
            self.scheme,
            self.paths,
            verifier_accept_probs=verifier_accept_probs,
            validate=validate,
        )


class _Builder:
    """Grows a tree node by node, caching q(.|prefix) so shared prefixes are evaluated once."""

    def __init__(self, draft_fn: DraftFn):
        self.draft_fn = draft_fn
        self.tokens = [-1]
        self.parents = [-1]
        self.prefixes: list[tuple[int, ...]] = [()]
        self.draft_rows: dict[int, np.ndarray] = {}

    def draft_probs(self, node: int) -> np.ndarray:
        if node not in self.draft_rows:
            self.fetch([node])
        return self.draft_rows[node]

    def fetch(self, nodes: Sequence[int]) -> None:
        """Evaluate q at every node of ``nodes`` not seen yet, in one batch when possible."""
        missing = list(dict.fromkeys(node for node in nodes if node not in self.draft_rows))
        if not missing:
            return
        prefixes = [self.prefixes[node] for node in missing]
        batch = getattr(self.draft_fn, "batch_probs", None)
        rows = batch(prefixes) if batch else [self.draft_fn(prefix) for prefix in prefixes]
        for node, row in zip(missing, rows):
            self.draft_rows[node] = np.asarray(row, dtype=np.float64)

    def add(self, parent: int, token: int) -> int:
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.prefixes.append(self.prefixes[parent] + (int(token),))
        return len(self.tokens) - 1

    def child(self, parent: int, token: int) -> int:
        for node in range(len(self.tokens)):
            if self.parents[node] == parent and self.tokens[node] == token:
                return node
        return self.add(parent, token)

    def finish(self, scheme: DraftScheme, paths=()) -> DraftSkeleton:
        vocab = len(next(iter(self.draft_rows.values())))
        # the rows the sampler drew from, kept per node: no (n, V) matrix of mostly zero rows
        internal = set(self.parents)
        rows = NodeRows({node: row for node, row in self.draft_rows.items() if node in internal}, len(self.tokens), vocab)
        return DraftSkeleton(tuple(self.tokens), tuple(self.parents), rows, scheme, tuple(paths), tuple(self.prefixes))


def _check_positive(name: str, value: int) -> None:
    if int(value) != value or value < 1:
        raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")


def sample_chain(rng: Rng, draft_fn: DraftFn, draft_len: int) -> DraftSkeleton:
    """One path x_1..x_L, x_i ~ q(.|x_{<i})."""
    return sample_iid_paths(rng, draft_fn, 1, draft_len)


def sample_iid_paths(rng: Rng, draft_fn: DraftFn, num_drafts: int, draft_len: int, merge: bool = True) -> DraftSkeleton:
    """K i.i.d. paths of length L, drawn one after the other.

    merge=True: the tree is their trie (children = distinct first appearances in draft order),
    scheme IID_PATHS (CHAIN when K = 1); the raw paths keep duplicates.
    merge=False: a "broom" of K unmerged chains, scheme IID_TREE (traversal scheme (b), §12).
    """
    _check_positive("num_drafts (K)", num_drafts)
    _check_positive("draft_len (L)", draft_len)
    builder = _Builder(draft_fn)
    # Level by level: the K paths are independent, so drawing depth-major has the same law as
    # drawing them one after the other, and a neural draft scores each level in one call.
    paths: list[list[int]] = [[] for _ in range(num_drafts)]
    frontier = [0] * num_drafts
    for _ in range(draft_len):
        builder.fetch(frontier)
        for k in range(num_drafts):
            token = rng.categorical(builder.draft_probs(frontier[k]))
            frontier[k] = builder.child(frontier[k], token) if merge else builder.add(frontier[k], token)
            paths[k].append(frontier[k])
    if merge:
        scheme = DraftScheme.CHAIN if num_drafts == 1 else DraftScheme.IID_PATHS
    else:
        scheme = DraftScheme.CHAIN if num_drafts == 1 else DraftScheme.IID_TREE
    return builder.finish(scheme, [tuple(path) for path in paths])


def sample_gumbel_chain(draws: NoiseAt, draft_fn: DraftFn, draft_len: int, vocab_size: int) -> DraftSkeleton:
    """One path drawn with the seed's noise (Daliri, Musco, Suresh 2024; ``verify.gumbel``):
    x_d = argmax log q(.|x_<d) + G(position + d - 1), the Gumbel-max of the draft's processed row
    with the SAME noise the target's draw at that position uses. Deterministic given the noise;
    any draft (n-gram, draft model, head) through its ``draft_fn``. ``vocab_size``: the target's
    vocabulary, which the draft's rows must share (token x must name the same noise)."""
    _check_positive("draft_len (L)", draft_len)
    builder = _Builder(draft_fn)
    node, path = 0, []
    for depth in range(draft_len):
        row = builder.draft_probs(node)
        if len(row) != vocab_size:
            raise ConfigError(
                f"the draft's rows have {len(row)} tokens but the target's vocabulary has {vocab_size}; "
                "drafter-invariant rules need one shared vocabulary (use a draft with the target's tokenizer)"
            )
        ids = np.flatnonzero(row > 0)
        node = builder.add(node, gumbel_max(ids, row[ids], draws.noise, draws.position + depth))
        path.append(node)
    return builder.finish(DraftScheme.CHAIN, [tuple(path)])


def shape_from_branching(branching: Sequence[int]) -> TreeShape:
    """Full tree with branching[d] children under every node at depth d (Sequoia-like shapes
    given as children per depth)."""
    for width in branching:
        _check_positive("children per depth", width)
    shape: TreeShape = ()
    for width in reversed(list(branching)):
        shape = tuple(shape for _ in range(width))
    return shape


def _draw_children(rng: Rng, probs: np.ndarray, count: int, scheme: DraftScheme) -> list[int]:
    if scheme is DraftScheme.IID_TREE:
        return [rng.categorical(probs) for _ in range(count)]
    if scheme is DraftScheme.WITHOUT_REPLACEMENT:
        remaining, drawn = probs.copy(), []
        for _ in range(count):
            mass = remaining.sum()
            if mass <= 0.0:  # support exhausted (§8.1): fewer children
                break
            token = rng.categorical(remaining / mass)
            drawn.append(token)
            remaining[token] = 0.0
        return drawn
    if scheme is DraftScheme.SPECHUB_PAIR:
        if count == 1:
            return [rng.categorical(probs)]
        if count != 2:
            raise ConfigError(f"SpecHub trees have 1 or 2 children per node, got {count}")
        from verispec.verify.spechub import sample_spechub_pair

        return list(sample_spechub_pair(rng, probs))
    if scheme is DraftScheme.DETERMINISTIC:
        order = np.lexsort((np.arange(len(probs)), -probs))  # highest q first, lowest id on ties
        return [int(t) for t in order[:count] if probs[t] > 0]
    raise ConfigError(f"sample_tree does not draw scheme {scheme.value!r}; use sample_iid_paths for paths")


def sample_tree(rng: Rng, draft_fn: DraftFn, shape: TreeShape | Sequence[int], scheme: DraftScheme) -> DraftSkeleton:
    """A token tree of the given shape (nested tuples, or children per depth), with each node's
    children drawn by ``scheme``: IID_TREE (duplicates kept), WITHOUT_REPLACEMENT,
    SPECHUB_PAIR (pairs from §9.1, single children from q) or DETERMINISTIC (top-q)."""
    scheme = DraftScheme(scheme)
    if shape and isinstance(shape[0], (int, np.integer)):
        shape = shape_from_branching(shape)  # type: ignore[arg-type]
    if not shape:
        raise ConfigError("a draft tree needs at least one child under the root")
    builder = _Builder(draft_fn)
    level = [(0, shape)]
    while level:
        builder.fetch([node for node, node_shape in level if node_shape])
        next_level = []
        for node, node_shape in level:
            if not node_shape:
                continue
            tokens = _draw_children(rng, builder.draft_probs(node), len(node_shape), scheme)
            for token, child_shape in zip(tokens, node_shape):
                next_level.append((builder.add(node, token), child_shape))
        level = next_level
    return builder.finish(scheme)

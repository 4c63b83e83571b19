"""The draft tree every verifier reads (DESIGN.md §3, ALGORITHMS.md §1 "Input: a draft tree").

Node 0 is the root (the context). Nodes are stored in topological order (parent index < child
index) and siblings in *sampling order*, which several rules depend on (RRS/RRSw, traversal).
A single draft path is a chain; K i.i.d. paths are stored as their trie plus the raw paths.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from verispec.core.probs import check_prob_matrix
from verispec.core.rows import Rows, as_rows
from verispec.errors import InvalidDraftError

ROOT = 0


class DraftScheme(str, enum.Enum):
    """How the children of the tree's nodes were drawn (ALGORITHMS.md §1, §13)."""

    CHAIN = "chain"  # one path, x_i ~ q(.|x_<i)
    IID_PATHS = "iid_paths"  # K i.i.d. paths; tree = their trie (children = distinct first appearances)
    IID_TREE = "iid_tree"  # each node's children are i.i.d. draws, duplicates kept as separate nodes
    WITHOUT_REPLACEMENT = "without_replacement"  # each node's children drawn without replacement
    SPECHUB_PAIR = "spechub_pair"  # binary nodes drawn from SpecHub's joint (§9.1), unary nodes from q
    DETERMINISTIC = "deterministic"  # chosen by a rule, no law q (top-k, token trees): only q-free rules (nss, qfree) are exact


@dataclass(frozen=True)
class DraftTree:
    """A drafted token tree with the target and draft distributions at its nodes.

    Shapes (n nodes, V tokens):
      tokens        (n,)   int64; tokens[0] = -1 (root)
      parents       (n,)   int64; parents[0] = -1, parents[i] < i
      target        ``Rows`` (core.rows), n rows: p(.|node) for every node (leaves too: bonus token)
      draft         ``Rows``, n rows: q(.|node) from which the node's children were drawn; rows of
                    nodes without children may be all zero
                    Rules read both through the row interface (prob / probs_of / row / argmax), so
                    a row is processed only where a rule touches it; ``target_probs`` and
                    ``draft_probs`` give every row as an (n, V) float64 array (built on first use
                    for lazy rows) for code that wants all of them.
      paths         K raw drafted paths as tuples of node indices (duplicates kept), for the
                    path-based schemes; empty otherwise
      verifier_accept_probs (n,) optional; SPRINTER's probability that its learned verifier
                    accepts each node's token (0/1 for a thresholded score)
      unmodified_target optional ``Rows``: the model's own rows when GBV-mod / SpecTr-GBV★
                    modification windows rewrote ``target`` (ALGORITHMS.md §4.3, §6.3); None when
                    no window was in force. Verification reads ``target``; replay of a rule that
                    carries no modification reads these (bench.replay)
    """

    tokens: np.ndarray
    parents: np.ndarray
    target: Rows
    draft: Rows
    scheme: DraftScheme
    paths: tuple[tuple[int, ...], ...] = ()
    verifier_accept_probs: np.ndarray | None = field(default=None)
    unmodified_target: Rows | None = field(default=None, compare=False)

    @staticmethod
    def build(
        tokens,
        parents,
        target_probs,
        draft_probs,
        scheme: DraftScheme,
        paths=(),
        verifier_accept_probs=None,
        validate: bool = True,
    ) -> "DraftTree":
        """target_probs / draft_probs: (n, V) arrays (or lists of rows), or ``Rows`` providers."""
        tree = DraftTree(
            tokens=np.asarray(tokens, dtype=np.int64),
            parents=np.asarray(parents, dtype=np.int64),
            target=as_rows(target_probs),
            draft=as_rows(draft_probs),
            scheme=DraftScheme(scheme),
            paths=tuple(tuple(int(i) for i in path) for path in paths),
            verifier_accept_probs=None
            if verifier_accept_probs is None
            else np.asarray(verifier_accept_probs, dtype=np.float64),
        )
        if validate:
            tree.validate()
        return tree

    @staticmethod
    def chain(tokens, target_probs, draft_probs, validate: bool = True) -> "DraftTree":
        """A single draft path x_1..x_L with p_1..p_{L+1} (shape (L+1, V)) and q_1..q_L ((L, V))."""
        tokens = [int(t) for t in tokens]
        length = len(tokens)
        draft_probs = np.asarray(draft_probs, dtype=np.float64)
        target_probs = np.asarray(target_probs, dtype=np.float64)
        if draft_probs.ndim != 2 or draft_probs.shape[0] != length:
            raise InvalidDraftError(f"a chain of {length} tokens needs {length} draft vectors, got shape {draft_probs.shape}")
        padded_draft = np.vstack([draft_probs, np.zeros((1, draft_probs.shape[1]))])
        return DraftTree.build(
            [-1, *tokens],
            list(range(-1, length)),
            target_probs,
            padded_draft,
            DraftScheme.CHAIN,
            paths=[tuple(range(1, length + 1))],
            validate=validate,
        )

    # ----- derived structure -------------------------------------------------------------
    @property
    def num_nodes(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def vocab_size(self) -> int:
        return int(self.target.vocab_size)

    @property
    def target_probs(self) -> np.ndarray:
        """Every target row, (n, V) float64 (materialises lazy rows: prefer ``target``)."""
        return self.target.dense()

    @property
    def draft_probs(self) -> np.ndarray:
        """Every draft row, (n, V) float64 (materialises lazy rows: prefer ``draft``)."""
        return self.draft.dense()

    @property
    def num_paths(self) -> int:
        return len(self.paths)

    @cached_property
    def children(self) -> tuple[tuple[int, ...], ...]:
        kids: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for node in range(1, self.num_nodes):
            kids[int(self.parents[node])].append(node)
        return tuple(tuple(k) for k in kids)

    @cached_property
    def depths(self) -> np.ndarray:
        depth = np.zeros(self.num_nodes, dtype=np.int64)
        for node in range(1, self.num_nodes):
            depth[node] = depth[self.parents[node]] + 1
        return depth

    @property
    def max_depth(self) -> int:
        return int(self.depths.max())

    def path_to(self, node: int) -> tuple[int, ...]:
        """Node indices root -> node, root excluded."""
        nodes = []
        while node != ROOT:
            nodes.append(node)
            node = int(self.parents[node])
        return tuple(reversed(nodes))

    def tokens_to(self, node: int) -> tuple[int, ...]:
        return tuple(int(self.tokens[n]) for n in self.path_to(node))

    def child_with_token(self, node: int, token: int) -> int | None:
        for child in self.children[node]:
            if self.tokens[child] == token:
                return child
        return None

    # ----- validation --------------------------------------------------------------------
    def validate(self) -> None:
        n = self.num_nodes
        if self.parents.shape != (n,) or self.tokens.shape != (n,):
            raise InvalidDraftError("tokens and parents must both have one entry per node")
        if n < 1 or self.parents[0] != -1:
            raise InvalidDraftError("node 0 must be the root with parent -1")
        if self.target_probs.ndim != 2 or self.target_probs.shape[0] != n:
            raise InvalidDraftError(f"target_probs must have shape (num_nodes={n}, V), got {self.target_probs.shape}")
        if self.draft_probs.shape != self.target_probs.shape:
            raise InvalidDraftError(
                f"draft_probs shape {self.draft_probs.shape} differs from target_probs shape "
                f"{self.target_probs.shape}: draft and target must share the vocabulary"
            )
        vocab = self.vocab_size
        for node in range(1, n):
            parent = int(self.parents[node])
            if not 0 <= parent < node:
                raise InvalidDraftError(f"node {node} has parent {parent}; parents must precede children")
            token = int(self.tokens[node])
            if not 0 <= token < vocab:
                raise InvalidDraftError(f"node {node} has token {token}, outside the vocabulary [0, {vocab})")
        check_prob_matrix(self.target_probs, "target_probs")
        internal = [node for node in range(n) if self.children[node]]
        if internal:
            check_prob_matrix(self.draft_probs[internal], "draft_probs of internal nodes")
        if self.scheme is not DraftScheme.DETERMINISTIC:
            for node in range(1, n):
                if self.draft_probs[self.parents[node], self.tokens[node]] <= 0.0:
                    raise InvalidDraftError(
                        f"node {node} carries token {int(self.tokens[node])} whose draft probability is 0: "
                        "store the draft vector the token was actually sampled from"
                    )
        for path in self.paths:
            for depth, node in enumerate(path, start=1):
                if not 0 < node < n or self.depths[node] != depth or (depth > 1 and self.parents[node] != path[depth - 2]):
                    raise InvalidDraftError(f"raw path {path} is not a root-to-node path of the tree")
        if self.verifier_accept_probs is not None and self.verifier_accept_probs.shape != (n,):
            raise InvalidDraftError("verifier_accept_probs needs one entry per node")
        self._validate_scheme_structure()

    def _validate_scheme_structure(self) -> None:
        """The shape of the tree must be one its scheme can draw (ALGORITHMS.md §1, §8, §9, §13):
        a mislabelled tree makes exact rules lossy without any error."""
        scheme, kids = self.scheme, self.children
        label = f"a tree labelled {scheme.name}"
        if scheme in (DraftScheme.CHAIN, DraftScheme.IID_PATHS, DraftScheme.WITHOUT_REPLACEMENT):
            # trie children / without-replacement draws are distinct tokens by construction
            for node, children in enumerate(kids):
                tokens = [int(self.tokens[c]) for c in children]
                if len(set(tokens)) != len(tokens):
                    raise InvalidDraftError(
                        f"{label} has node {node} with repeated child tokens {tokens}; its children must be "
                        "distinct tokens (merge i.i.d. paths into their trie, or use scheme IID_TREE for i.i.d. "
                        "children with duplicates kept)"
                    )
        if scheme is DraftScheme.CHAIN:
            branching = [node for node, children in enumerate(kids) if len(children) > 1]
            if branching:
                raise InvalidDraftError(
                    f"{label} branches at node {branching[0]} ({len(kids[branching[0]])} children); a chain is one "
                    "path: use scheme IID_PATHS with the raw paths for K i.i.d. paths, or a tree scheme"
                )
            whole = tuple(range(1, self.num_nodes))
            if self.paths and self.paths != (whole,):
                raise InvalidDraftError(
                    f"{label} carries raw paths {list(self.paths)}; a chain's only path is the whole chain {whole} "
                    "(omit paths, or build it with DraftTree.chain)"
                )
        elif scheme is DraftScheme.IID_PATHS:
            self._validate_iid_paths(label)
        elif scheme is DraftScheme.SPECHUB_PAIR:
            for node, children in enumerate(kids):
                if len(children) > 2:
                    raise InvalidDraftError(
                        f"{label} has node {node} with {len(children)} children; SpecHub nodes have 1 or 2 "
                        "(draw them with sample_tree(..., DraftScheme.SPECHUB_PAIR))"
                    )
                if len(children) == 2:
                    pair = [int(self.tokens[c]) for c in children]
                    hub = int(np.argmax(self.draft_probs[node]))  # §9.1: argmax q, lowest id on ties
                    if pair[0] == pair[1] or hub not in pair:
                        raise InvalidDraftError(
                            f"{label} has node {node} with the pair {pair}, which SpecHub's joint never draws: a pair "
                            f"holds two distinct tokens, one of them the hub argmax q = {hub} (§9.1)"
                        )

    def _validate_iid_paths(self, label: str) -> None:
        """K >= 1 raw paths of one length whose trie is exactly this tree (§13, tries of i.i.d. paths)."""
        if not self.paths:
            raise InvalidDraftError(
                f"{label} has no raw paths: the i.i.d.-path rules need the K drafted paths (duplicates kept) to "
                "know K; pass paths=... (verispec.draft.sample_iid_paths returns them)"
            )
        lengths = {len(path) for path in self.paths}
        if len(lengths) != 1 or 0 in lengths:
            raise InvalidDraftError(
                f"{label} has raw paths of lengths {sorted(lengths)}; K i.i.d. paths all have the same length L >= 1"
            )
        on_a_path = {node for path in self.paths for node in path}
        ends = {path[-1] for path in self.paths}
        leaves = {node for node in range(1, self.num_nodes) if not self.children[node]}
        uncovered = sorted(set(range(1, self.num_nodes)) - on_a_path)
        if uncovered or leaves != ends:
            raise InvalidDraftError(
                f"{label} is not the trie of its raw paths (nodes on no path: {uncovered[:5]}, leaves that end no "
                f"path: {sorted(leaves - ends)[:5]}, paths ending inside the tree: {sorted(ends - leaves)[:5]}); "
                "build the tree from the paths, or label it with the scheme that drew it"
            )

"""The bookkeeping every KV-cached adapter shares (``models.hf.HFModelAdapter``,
``models.llamacpp.LlamaCppAdapter``): checking a prompt, placing the nodes of a draft tree given to
``extend`` (depths and root paths) and checking a commit path. Pure Python: no model, no torch.

Node numbering within a round (between two commits): node 0 is the pending root, the nodes given
to ``extend`` are numbered 1, 2, ... in order of addition, across calls.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from verispec.errors import ConfigError, InvalidDraftError

ROOT = 0


class RoundState:
    """The views of a round's state both adapters offer: ``_tokens`` (committed tokens, pending
    root last) and ``_node_tokens`` (this round's tree, root first once extended)."""

    _tokens: list[int]
    _node_tokens: list[int]

    @property
    def committed_len(self) -> int:
        """Committed tokens before the pending root (the position of the root)."""
        return len(self._tokens) - 1

    @property
    def num_nodes(self) -> int:
        """Nodes in this round's speculative tree, root included once extended (next node number)."""
        return len(self._node_tokens)

    def tokens(self) -> list[int]:
        """All committed tokens, pending root included."""
        return list(self._tokens)


def check_prompt(prompt_ids: Sequence[int], max_context: int) -> list[int]:
    """The prompt as ints: at least one token, and room left for one generated token."""
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ConfigError("empty prompt: give at least one token id (e.g. the BOS token)")
    if len(prompt) >= max_context:
        raise ConfigError(
            f"prompt of {len(prompt)} tokens does not fit the model's context of {max_context} "
            "tokens (it must leave room for one generated token); truncate the prompt"
        )
    return prompt


def place_nodes(
    tokens: Sequence[int],
    parents: Sequence[int],
    first: int,
    pending_root: int,
    known: Callable[[int], tuple[int, list[int]]],
) -> tuple[list[int], list[int], list[int], list[list[int]]]:
    """Check the nodes of one ``extend`` call and place them in the tree.

    first: the number of the first new node (nodes already in the tree this round);
    pending_root: the token at the root; known(node) -> (depth, root path) of a node < first.
    The first call of a round must begin with the root (token = pending root or -1, parent -1).
    Returns (tokens with the root's -1 replaced, parents, depths, root paths with the node itself).
    """
    tokens, parents = [int(t) for t in tokens], [int(p) for p in parents]
    if len(tokens) != len(parents):
        raise InvalidDraftError(f"extend got {len(tokens)} tokens but {len(parents)} parents; give one parent per token")
    depths: list[int] = []
    ancestors: list[list[int]] = []
    for i, (token, parent) in enumerate(zip(tokens, parents)):
        node = first + i
        if node == ROOT:
            if parent != -1 or token not in (-1, pending_root):
                raise InvalidDraftError(
                    f"the first extend() of a round must start with the root (token {pending_root} "
                    f"or -1, parent -1), got token {token} with parent {parent}"
                )
            tokens[0] = pending_root
            depths.append(0)
            ancestors.append([ROOT])
            continue
        if not 0 <= parent < node:
            raise InvalidDraftError(
                f"node {node} (token {token}) has parent {parent}; a parent must be the root (0) "
                f"or an earlier node (< {node})"
            )
        parent_depth, parent_path = known(parent) if parent < first else (depths[parent - first], ancestors[parent - first])
        depths.append(parent_depth + 1)
        ancestors.append(parent_path + [node])
    return tokens, parents, depths, ancestors


def check_commit_path(path: Sequence[int], num_nodes: int, node_parents: Sequence[int]) -> list[int]:
    """``path`` as ints when it is a root-to-node path of this round's tree (root excluded)."""
    path = [int(n) for n in path]
    if not num_nodes:
        if path:
            raise InvalidDraftError(f"commit path {path} names nodes, but none was extended this round")
        return path
    parent = ROOT
    for node in path:
        if not 0 < node < num_nodes:
            raise InvalidDraftError(
                f"commit path {path}: node {node} does not exist (this round has nodes 1..{num_nodes - 1})"
            )
        if node_parents[node] != parent:
            raise InvalidDraftError(
                f"commit path {path} is not a root-to-node path: node {node} has parent {node_parents[node]}, not {parent}"
            )
        parent = node
    return path

"""Recompute references for HFModelAdapter tests: what the adapter's cached tree scoring must equal.

One definition for every model family the adapter runs (Llama, Gemma 3 with sliding windows): a
plain cache-free forward over a node's full root path is the reference each scored row is held to.
"""

from __future__ import annotations

import torch

from verispec.models.hf import HFModelAdapter

ATOL = 1e-5


@torch.inference_mode()
def full_logits(model, ids: list[int]) -> torch.Tensor:
    """Next-token logits after ids from a plain forward without cache, shape (V,)."""
    return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def root_path(parents: list[int], node: int) -> list[int]:
    """Node numbers from the root (excluded) down to node."""
    path = []
    while node > 0:
        path.append(node)
        node = parents[node]
    return path[::-1]


class Round:
    """Mirror of one round's tree (root = node 0), checking every row against a full recompute."""

    def __init__(self, adapter: HFModelAdapter):
        self.adapter = adapter
        self.context = adapter.tokens()  # committed tokens, pending root last
        self.tokens: list[int] = []
        self.parents: list[int] = []

    def extend(self, tokens: list[int], parents: list[int]) -> None:
        """Extend the adapter and check every returned row against a full recompute."""
        logits = self.adapter.extend(tokens, parents)
        assert logits.shape == (len(tokens), self.adapter.vocab_size) and logits.dtype == torch.float32
        first = len(self.tokens)
        self.tokens += tokens
        self.parents += parents
        for i in range(len(tokens)):
            path_tokens = [self.tokens[n] for n in root_path(self.parents, first + i)]
            expected = full_logits(self.adapter.model, self.context + path_tokens)
            torch.testing.assert_close(logits[i], expected, atol=ATOL, rtol=0)
        assert self.adapter.runner.seq_length() == self.adapter.committed_len + self.adapter.num_nodes

    def commit(self, path: list[int], next_token: int) -> None:
        self.adapter.commit(path, next_token)
        assert self.adapter.tokens() == self.context + [self.tokens[n] for n in path] + [next_token]

"""HFModelAdapter: tree scoring and KV commit/rollback equal a full recompute (DESIGN.md §4)."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from tests.models.recompute import ATOL, Round, full_logits, root_path
from verispec.errors import ConfigError, InvalidDraftError
from verispec.models.hf import HFModelAdapter, tree_attention_mask

VOCAB = 64
CONTEXT = 128


def tiny_llama(attn_implementation: str = "sdpa", dtype: torch.dtype = torch.float32):
    """A 2-layer random Llama with grouped-query attention, fixed seed."""
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=CONTEXT,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=dtype)
    return model.eval()


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    return tiny_llama(request.param)


@pytest.fixture(params=["native", "transformers"])
def backend(request):
    return request.param


def test_root_logits_match_full_forward(model, backend):
    adapter = HFModelAdapter(model, backend=backend)
    prompt = [3, 14, 15, 9, 26, 5]
    adapter.reset(prompt)
    assert adapter.committed_len == len(prompt) - 1 and adapter.tokens() == prompt
    logits = adapter.extend([prompt[-1]], [-1])
    torch.testing.assert_close(logits[0], full_logits(model, prompt), atol=ATOL, rtol=0)
    assert adapter.vocab_size == VOCAB and adapter.max_context == CONTEXT
    logits.div_(0.7)  # callers may process logits in place (not inference-mode tensors)


def test_rounds_of_trees_commits_and_appends_match_recompute(model, backend):
    adapter = HFModelAdapter(model, backend=backend)
    adapter.reset([1, 7, 2, 8, 1, 8, 2])

    # Round 1: siblings at two depths in one call, then nodes under both calls; commit a path that
    # ends in the second call. Tree: 0 -> {1, 2, 3}; 1 -> {4, 5}; 4 -> 6; then 5 -> 7, 7 -> 8, 2 -> 9.
    r = Round(adapter)
    r.extend([-1, 10, 11, 12, 20, 21, 30], [-1, 0, 0, 0, 1, 1, 4])
    r.extend([40, 50, 13], [5, 7, 2])
    r.commit([1, 5, 7, 8], next_token=33)

    # Round 2: a chain over two calls, committed with an empty path (only the root is kept).
    r = Round(adapter)
    r.extend([33, 4], [-1, 0])
    r.extend([5, 6], [1, 2])
    r.commit([], next_token=60)

    # Round 3: a draft that skipped scoring: commit without any extend, twice.
    r = Round(adapter)
    r.commit([], next_token=61)
    r = Round(adapter)
    r.commit([], next_token=62)

    # Round 4: the pending tail (60, 61) rides along with the root's forward; commit a deep sibling.
    r = Round(adapter)
    r.extend([62, 3, 3, 9], [-1, 0, 0, 2])
    r.commit([2, 3], next_token=17)

    # Round 5: tokens accepted without the target after a scored tree, then again unscored.
    r = Round(adapter)
    r.extend([17, 18, 19], [-1, 0, 0])
    adapter.append_committed([44, 45], next_token=46)
    assert adapter.tokens() == r.context + [44, 45, 46]
    adapter.append_committed([47], next_token=48)
    r = Round(adapter)
    r.extend([48, 1, 2, 3], [-1, 0, 1, 0])
    r.commit([3], next_token=5)

    # Round 6: score() drops what extend() added; rescoring from the root and extending on still match.
    r = Round(adapter)
    r.extend([5, 6], [-1, 0])
    logits = adapter.score([-1, 7, 8, 9], [-1, 0, 0, 2])
    for i, path in enumerate([[], [7], [8], [8, 9]]):
        torch.testing.assert_close(logits[i], full_logits(model, r.context + path), atol=ATOL, rtol=0)
    r.tokens, r.parents = [5, 7, 8, 9], [-1, 0, 0, 2]
    r.extend([10], [3])
    r.commit([2, 3, 4], next_token=0)

    r = Round(adapter)
    r.extend([0], [-1])
    assert adapter.committed_len == len(adapter.tokens()) - 1


@pytest.mark.parametrize("seed", range(3))
def test_random_rounds_match_recompute(model, backend, seed):
    rng = random.Random(seed)
    adapter = HFModelAdapter(model, backend=backend)
    adapter.reset([rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))])
    for _ in range(6):
        r = Round(adapter)
        if rng.random() < 0.2:  # an unscored round
            unscored = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))]
            adapter.append_committed(unscored, rng.randrange(VOCAB))
            continue
        r.extend([-1], [-1])
        for _ in range(rng.randint(1, 3)):
            count = rng.randint(1, 5)
            first = len(r.tokens)
            parents = [rng.randrange(first + i) for i in range(count)]
            r.extend([rng.randrange(VOCAB) for _ in range(count)], parents)
        path = root_path(r.parents, rng.randrange(len(r.tokens)))
        r.commit(path, rng.randrange(VOCAB))
    assert adapter.committed_len < CONTEXT


def test_single_token_prompt_and_decode_loop_match_recompute(model, backend):
    adapter = HFModelAdapter(model, backend=backend)
    adapter.reset([9])
    assert adapter.committed_len == 0
    assert adapter.extend([], []).shape == (0, VOCAB)
    for step in range(5):
        r = Round(adapter)
        r.extend([-1], [-1])
        r.commit([], next_token=7 + step)


def test_tree_attention_mask_layout():
    # 2 cached entries, a tail of 1 token, then root (0), node 1 under root, node 2 under root.
    allowed = tree_attention_mask(2, 1, [[0], [0, 1], [0, 2]], num_nodes=3).int().tolist()
    assert allowed == [
        [1, 1, 1, 0, 0, 0],
        [1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 0],
        [1, 1, 1, 1, 0, 1],
    ]


def test_prompt_errors(model, backend):
    adapter = HFModelAdapter(model, backend=backend)
    with pytest.raises(ConfigError, match="empty prompt"):
        adapter.reset([])
    with pytest.raises(ConfigError, match="context of 128"):
        adapter.reset([1] * CONTEXT)
    adapter.reset([1] * (CONTEXT - 1))  # the longest prompt that fits
    adapter.extend([-1, 2], [-1, 0])  # node 1 sits at the last position, CONTEXT - 1
    with pytest.raises(ConfigError, match="exceeds the model's context"):
        adapter.extend([3], [1])


def test_tree_errors(model, backend):
    adapter = HFModelAdapter(model, backend=backend)
    adapter.reset([1, 2, 3])
    with pytest.raises(InvalidDraftError, match="must start with the root"):
        adapter.extend([5, 6], [0, 0])
    with pytest.raises(InvalidDraftError, match="must start with the root"):
        adapter.extend([4], [-1])  # the pending root is 3
    with pytest.raises(InvalidDraftError, match="one parent per token"):
        adapter.extend([3, 4], [-1])
    with pytest.raises(InvalidDraftError, match="none was extended"):
        adapter.commit([1], next_token=4)
    adapter.extend([3, 4, 5], [-1, 0, 0])
    with pytest.raises(InvalidDraftError, match="earlier node"):
        adapter.extend([6], [3])
    with pytest.raises(InvalidDraftError, match="not a root-to-node path"):
        adapter.commit([1, 2], next_token=4)
    with pytest.raises(InvalidDraftError, match="does not exist"):
        adapter.commit([7], next_token=4)


def test_refuses_attention_that_ignores_custom_masks():
    model = tiny_llama("eager")
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ConfigError, match="attn_implementation"):
        HFModelAdapter(model, backend="transformers")


def test_bf16_tree_scoring_close_to_recompute(backend):
    model = tiny_llama("sdpa", dtype=torch.bfloat16)
    adapter = HFModelAdapter(model, backend=backend)
    adapter.reset([1, 2, 3, 4])
    logits = adapter.extend([-1, 5, 6, 7], [-1, 0, 0, 2])
    assert logits.dtype == torch.float32
    for i, path in enumerate([[], [5], [6], [6, 7]]):
        torch.testing.assert_close(logits[i], full_logits(model, [1, 2, 3, 4] + path), atol=0.05, rtol=0)

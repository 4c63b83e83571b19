"""Sliding-window layers in HFModelAdapter's transformers runner: tree scoring, commit and rollback
equal a full recompute (fp32, 1e-5) on tiny random Gemma 3 models, for contexts shorter and longer
than the window and trees deeper than it (DESIGN.md §4).

The reference is transformers' own cache-free forward, which builds the sliding-window masks
itself: a node must see exactly the last ``window`` positions of its own root path.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from tests.models.recompute import ATOL, Round, full_logits, root_path
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter

VOCAB = 48
CONTEXT = 96
WINDOW = 4
MIXED = ["sliding_attention", "full_attention", "sliding_attention"]


def tiny_gemma3(layer_types=MIXED, window: int = WINDOW, attn_implementation: str = "sdpa", seed: int = 0):
    """A random Gemma 3 with the given layer types and sliding window, fp32."""
    config = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=window,
        layer_types=list(layer_types),
        max_position_embeddings=CONTEXT,
    )
    torch.manual_seed(seed)
    model = Gemma3ForCausalLM(config).eval()
    model.config._attn_implementation = attn_implementation
    with torch.no_grad():  # peaked rows, so that a wrong mask moves the logits visibly
        model.lm_head.weight.mul_(4.0)
    return model


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request):
    return tiny_gemma3(attn_implementation=request.param)


def test_reference_really_depends_on_the_window(model):
    # Guards the tests below: with a window of 4, a change 6 positions back must not matter to the
    # sliding layers but must reach the logits through the full-attention layer; with only sliding
    # layers it must not matter at all.
    ids = [5, 9, 2, 7, 1, 3, 8, 4]
    changed = [6] + ids[1:]
    assert not torch.allclose(full_logits(model, ids), full_logits(model, changed), atol=1e-3)
    sliding_only = tiny_gemma3(["sliding_attention"] * 2)
    torch.testing.assert_close(full_logits(sliding_only, ids), full_logits(sliding_only, changed), atol=1e-6, rtol=0)


def test_runner_keeps_every_entry_and_knows_the_windows(model):
    adapter = HFModelAdapter(model, backend="auto")  # no native runner for Gemma: transformers
    assert adapter.backend == "transformers"
    assert adapter.runner.layer_windows == {"sliding_attention": WINDOW, "full_attention": None}
    adapter.reset(list(range(1, 12)))
    assert adapter.runner.seq_length() == 10  # transformers' sliding cache would hold WINDOW - 1
    adapter.extend([-1, 3, 4], [-1, 0, 1])
    assert adapter.runner.positions.tolist() == list(range(13))
    adapter.commit([1], next_token=5)
    assert adapter.runner.positions.tolist() == list(range(12))


@pytest.mark.parametrize("prompt_len", [2, WINDOW, 17])
def test_rounds_match_recompute_shorter_and_longer_than_window(model, prompt_len):
    adapter = HFModelAdapter(model, backend="transformers")
    adapter.reset([(7 * i + 3) % VOCAB for i in range(prompt_len)])

    # A tree deeper than the window: the chain's deep nodes must forget the committed context.
    r = Round(adapter)
    r.extend([-1, 10, 11, 12, 13, 14, 15, 16], [-1, 0, 1, 2, 3, 4, 5, 0])
    r.extend([20, 21, 22], [7, 8, 4])  # deepen a sibling, and branch off the chain mid-way
    r.commit([1, 2, 3, 4, 5], next_token=30)

    # Unscored rounds, then a pending tail riding along with a tree forward.
    Round(adapter).commit([], next_token=31)
    adapter.append_committed([32, 33], next_token=34)
    r = Round(adapter)
    r.extend([34, 1, 2, 3, 4, 5], [-1, 0, 0, 2, 3, 4])
    adapter.rollback()
    r = Round(adapter)
    r.extend([-1, 6, 7], [-1, 0, 1])
    r.commit([1, 2], next_token=8)

    # Plain decoding steps far past the window.
    for step in range(6):
        r = Round(adapter)
        r.extend([-1], [-1])
        r.commit([], next_token=step + 1)


@pytest.mark.parametrize("seed", range(3))
def test_random_rounds_match_recompute(seed):
    rng = random.Random(seed)
    window = rng.choice([4, 6, 8])
    layer_types = [rng.choice(["sliding_attention", "full_attention"]) for _ in range(3)]
    model = tiny_gemma3(layer_types, window=window, seed=seed)
    adapter = HFModelAdapter(model, backend="transformers")
    adapter.reset([rng.randrange(VOCAB) for _ in range(rng.randint(1, 2 * window))])
    for _ in range(8):
        r = Round(adapter)
        if rng.random() < 0.2:
            unscored = [rng.randrange(VOCAB) for _ in range(rng.randint(0, 3))]
            adapter.append_committed(unscored, rng.randrange(VOCAB))
            continue
        r.extend([-1], [-1])
        for _ in range(rng.randint(1, 3)):
            count = rng.randint(1, 6)
            first = len(r.tokens)
            parents = [rng.randrange(first + i) for i in range(count)]
            r.extend([rng.randrange(VOCAB) for _ in range(count)], parents)
        r.commit(root_path(r.parents, rng.randrange(len(r.tokens))), rng.randrange(VOCAB))
    assert adapter.committed_len > window


def test_all_sliding_layers_use_one_mask():
    model = tiny_gemma3(["sliding_attention"] * 2)
    adapter = HFModelAdapter(model, backend="transformers")
    adapter.reset(list(range(1, 10)))
    r = Round(adapter)
    r.extend([-1, 3, 4, 5, 6, 7], [-1, 0, 1, 2, 3, 0])
    r.commit([1, 2, 3, 4], next_token=9)
    Round(adapter).extend([-1], [-1])


def test_refuses_native_backend_for_gemma(model):
    with pytest.raises(ConfigError, match="backend='native' cannot run this model"):
        HFModelAdapter(model, backend="native")

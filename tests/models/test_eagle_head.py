"""The EAGLE-3 head: training-time-test unrolling equals decode-time drafting, masks, vocab maps."""

import pytest
import torch

from verispec.errors import ConfigError
from verispec.models.eagle_head import Eagle3Head, HeadConfig, default_aux_layer_ids, load_head, save_head


def tiny_config(**overrides):
    values = dict(
        hidden_size=16, intermediate_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
        vocab_size=50, draft_vocab_size=20, target_hidden_size=12, aux_layer_ids=(2, 3, 4), rope_theta=100.0,
    )
    values.update(overrides)
    return HeadConfig(**values)


def tiny_head(seed=0, **overrides):
    torch.manual_seed(seed)
    config = tiny_config(**overrides)
    head = Eagle3Head(config, torch.arange(0, 40, 2))
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return head.double()


def decode_depth(head, features, embeds, root: int, depth: int):
    """Draft logits at ``depth`` for a round rooted at entry ``root``, computed the way a decoder
    does it: a causal prefill over entries 0..root, then one entry per depth fed its parent's out."""
    committed = head.step(head.project(features[:, : root + 1]), embeds[:, : root + 1],
                          torch.arange(root + 1)[None])
    keys, values, out = committed.keys, committed.values, committed.out[:, -1:]
    for d in range(2, depth + 1):
        entry = root + d - 1
        result = head.step(out, embeds[:, entry : entry + 1], torch.tensor([[entry]]), keys, values)
        keys = torch.cat([keys, result.keys], 2)
        values = torch.cat([values, result.values], 2)
        out = result.out
    return head.draft_logits(out)[0, -1]


@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_unrolled_steps_equal_decode_time_drafting(norm_before_residual):
    head = tiny_head(norm_before_residual=norm_before_residual)
    n = 9
    features = torch.randn(1, n, 36, dtype=torch.float64)
    embeds = torch.randn(1, n, 16, dtype=torch.float64)
    steps = head.unrolled(features, embeds, 4)
    for k in range(1, 5):
        for j in range(k - 1, n):
            expected = decode_depth(head, features, embeds, j - k + 1, k)
            torch.testing.assert_close(steps[k - 1][0, j], expected, rtol=1e-10, atol=1e-10)


def test_unrolled_differs_from_plain_causal_at_depth_two():
    """Negative control: feeding step 2 the target features again (no self-feeding) gives other logits."""
    head = tiny_head()
    features = torch.randn(1, 6, 36, dtype=torch.float64)
    embeds = torch.randn(1, 6, 16, dtype=torch.float64)
    steps = head.unrolled(features, embeds, 2)
    assert not torch.allclose(steps[1][0, 3], steps[0][0, 3])


def test_vocabulary_maps_and_target_logits():
    head = tiny_head()
    assert head.d2t.tolist() == list(range(0, 20))  # ids 0, 2, .., 38: offset d
    assert head.t2d.sum() == 20 and head.t2d[38] and not head.t2d[39]
    out = torch.randn(3, 16, dtype=torch.float64)
    full = head.target_logits(out)
    assert full.shape == (3, 50)
    assert torch.isinf(full[:, 1]).all() and torch.isinf(full[:, 40:]).all()
    torch.testing.assert_close(full[:, head.draft_to_target], head.draft_logits(out).float())
    probs = torch.softmax(full, -1)
    assert (probs[:, ~head.t2d] == 0).all()


def test_bad_vocabularies_are_refused():
    head = tiny_head()
    with pytest.raises(ConfigError, match="strictly increasing"):
        head.set_draft_vocabulary(torch.arange(20).flip(0))
    with pytest.raises(ConfigError, match=r"\[0, 50\)"):
        head.set_draft_vocabulary(torch.arange(40, 60))
    with pytest.raises(ConfigError, match="draft_vocab_size"):
        tiny_config(draft_vocab_size=51)
    assert default_aux_layer_ids(30) == (2, 15, 27)


def test_save_load_round_trip(tmp_path):
    head = tiny_head().float()
    save_head(head, tmp_path)
    loaded = load_head(tmp_path)
    for (name, a), (_, b) in zip(head.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name
    assert loaded.config == head.config

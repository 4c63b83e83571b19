"""``models.kv_buffer.KVBuffers`` (the growable caches of the native runner and the head drafter):
capacity doubles from the minimum, entries [0, used) survive every growth bit for bit on every
layer, buffers with room are not reallocated, dtype and device follow ``like``."""

import pytest
import torch

from verispec.models.kv_buffer import KVBuffers


def test_growth_doubles_and_keeps_the_used_entries():
    buffers = KVBuffers(3, 2, 4, torch.zeros(1, dtype=torch.float64), min_capacity=2)
    assert buffers.capacity == 0 and buffers.keys == [] and buffers.values == []
    buffers.reserve(1, used=0)
    assert buffers.capacity == 2
    torch.manual_seed(0)
    written = 0
    for needed, expected_capacity in ((2, 2), (3, 4), (9, 16), (16, 16), (40, 64)):
        for cache in buffers.keys + buffers.values:
            cache[:, :, written:] = 7.0  # stale entries past ``used`` (e.g. a rolled-back tree)
        before = list(buffers.keys)
        buffers.reserve(needed, used=written)
        assert buffers.capacity == expected_capacity
        assert all(key.shape == (1, 2, expected_capacity, 4) for key in buffers.keys + buffers.values)
        assert len(buffers.keys) == len(buffers.values) == 3
        if expected_capacity == before[0].shape[2]:
            assert all(new is old for new, old in zip(buffers.keys, before))  # room left: no copy
        else:
            for new, old in zip(buffers.keys, before):
                assert torch.equal(new[:, :, :written], old[:, :, :written])
                assert not new[:, :, written:].any()  # nothing past ``used`` is carried over
        # write the new entries (over the stale ones), distinct per layer and per key/value
        for cache in buffers.keys + buffers.values:
            cache[:, :, written:needed] = torch.randn(1, 2, needed - written, 4, dtype=torch.float64)
        snapshot = [cache[:, :, :needed].clone() for cache in buffers.keys + buffers.values]
        buffers.reserve(needed + 1, used=needed)
        for cache, kept in zip(buffers.keys + buffers.values, snapshot):
            assert torch.equal(cache[:, :, :needed], kept)
        written = needed


def test_buffers_follow_like_and_refuse_a_zero_minimum():
    buffers = KVBuffers(1, 1, 2, torch.zeros(1, dtype=torch.bfloat16), min_capacity=256)
    buffers.reserve(3, used=0)
    assert buffers.capacity == 256 and buffers.keys[0].dtype == torch.bfloat16
    assert buffers.keys[0] is not buffers.values[0]
    with pytest.raises(ValueError, match="min_capacity must be >= 1"):
        KVBuffers(1, 1, 2, torch.zeros(1), min_capacity=0)


def test_moves_copy_every_layer_keys_and_values_of_one_slot():
    """``move_entries`` / ``copy_slot`` / ``with_slots`` act on the one stacked tensor: every layer's keys
    and values at once, the named slot only."""
    buffers = KVBuffers(2, 1, 2, torch.zeros(1, dtype=torch.float64), min_capacity=8, slots=2)
    buffers.reserve(8, used=0)
    for layer, (key, value) in enumerate(zip(buffers.keys, buffers.values)):
        key.copy_(torch.arange(2 * 8 * 2, dtype=torch.float64).view(2, 1, 8, 2) + 100 * layer)
        value.copy_(-key)
    before = [cache.clone() for cache in buffers.keys + buffers.values]
    buffers.move_entries(1, 2, torch.tensor([5, 3]))  # slot 1: entries 5, 3 -> 2, 3
    for cache, old in zip(buffers.keys + buffers.values, before):
        assert torch.equal(cache[0], old[0])
        assert torch.equal(cache[1, :, 2:4], old[1, :, [5, 3]]) and torch.equal(cache[1, :, :2], old[1, :, :2])
    buffers.copy_slot(1, 0, 3)
    for cache in buffers.keys + buffers.values:
        assert torch.equal(cache[0, :, :3], cache[1, :, :3])
    grown = buffers.with_slots(4, used=6)
    assert grown.capacity == 8 and grown.slots == 4
    for new, old in zip(grown.keys + grown.values, buffers.keys + buffers.values):
        assert torch.equal(new[:2, :, :6], old[:, :, :6]) and not new[:2, :, 6:].any() and not new[2:].any()

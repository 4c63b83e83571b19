"""``KVBuffers``: preallocated, growable key/value caches of attention layers.

One definition for the two caches verispec runs by hand: the native Llama forward
(``models.native_llama.NativeLlamaRunner``, one buffer pair per decoder layer) and the EAGLE-3 draft
head's drafter (``engine.head_drafter.HeadDrafter``, one layer). Writing entries in place into a
buffer with spare room avoids a ``torch.cat`` copy of the whole cache per forward; when a forward
needs more room the capacity doubles (amortised O(1) copies per entry).

The owner keeps the number of valid entries and writes/truncates them itself; ``reserve`` only
makes room and carries the first ``used`` entries over.
"""

from __future__ import annotations

import torch

MIN_CAPACITY = 256  # entries allocated at first; doubled whenever more are needed


class KVBuffers:
    """Keys and values of ``num_layers`` attention layers, each (slots, num_kv_heads, capacity,
    head_dim) in the dtype and on the device of ``like`` (zeros until written). No buffer exists
    before the first ``reserve``. ``slots`` > 1: one cache region per sequence of a batch
    (``models.batch_runner``)."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, like: torch.Tensor,
                 min_capacity: int = MIN_CAPACITY, slots: int = 1):
        if min_capacity < 1:
            raise ValueError(f"min_capacity must be >= 1, got {min_capacity}")
        self.num_layers = int(num_layers)
        self.num_kv_heads = int(num_kv_heads)
        self.head_dim = int(head_dim)
        self.like = like
        self.min_capacity = int(min_capacity)
        self.slots = int(slots)
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []

    @property
    def capacity(self) -> int:
        """Entries every buffer can hold now (0 before the first ``reserve``)."""
        return self.keys[0].shape[2] if self.keys else 0

    def reserve(self, needed: int, used: int) -> None:
        """Make room for ``needed`` entries: if the capacity is smaller, allocate buffers of
        ``min_capacity`` doubled until they hold ``needed`` and copy entries [0, used) over."""
        capacity = self.capacity
        if needed <= capacity:
            return
        capacity = max(self.min_capacity, capacity)
        while capacity < needed:
            capacity *= 2
        shape = (self.slots, self.num_kv_heads, capacity, self.head_dim)
        new_keys = [self.like.new_zeros(shape) for _ in range(self.num_layers)]
        new_values = [self.like.new_zeros(shape) for _ in range(self.num_layers)]
        with torch.no_grad():
            for old, new in zip(self.keys + self.values, new_keys + new_values):
                new[:, :, :used] = old[:, :, :used]
        self.keys, self.values = new_keys, new_values

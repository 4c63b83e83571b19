"""``KVBuffers``: preallocated, growable key/value caches of attention layers.

One definition for the two caches verispec runs by hand: the native Llama forward
(``models.native_llama.NativeLlamaRunner``, one buffer pair per decoder layer) and the EAGLE-3 draft
head's drafter (``engine.head_drafter.HeadDrafter``, one layer). Writing entries in place into a
buffer with spare room avoids a ``torch.cat`` copy of the whole cache per forward; when a forward
needs more room the capacity doubles (amortised O(1) copies per entry).

The owner keeps the number of valid entries and writes/truncates them itself; ``reserve`` only
makes room and carries the first ``used`` entries over. All buffers are views of ONE tensor
(``stacked``: keys and values of every layer), so moving entries (a commit's accepted path, a
batch slot taking another's place) is one copy for the whole cache, not one per layer and kind:
``move_entries``, ``copy_slot``.
"""

from __future__ import annotations

from collections.abc import Sequence

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
        # (2, layers, slots, kv heads, capacity, head_dim): keys then values; ``keys[i]`` / ``values[i]``
        # are its (contiguous) views of layer i
        self.stacked: torch.Tensor | None = None
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
        stacked = self.like.new_zeros((2, self.num_layers, self.slots, self.num_kv_heads, capacity, self.head_dim))
        if self.stacked is not None and used:
            with torch.no_grad():
                stacked[..., :used, :] = self.stacked[..., :used, :]
        self._use(stacked)

    def _use(self, stacked: torch.Tensor) -> None:
        self.stacked = stacked
        self.keys, self.values = list(stacked[0].unbind(0)), list(stacked[1].unbind(0))

    @torch.no_grad()
    def move_entries(self, slot: int, length: int, moved: Sequence[int]) -> int:
        """Keep ``slot``'s entries [0, length) followed by its entries at indices ``moved``: copy
        those to [length, length + len(moved)), in every layer, keys and values (index_select copies
        first: overlapping ranges are safe). Entries already in place (``moved`` is that range: a
        commit along the first nodes) are not copied. Returns the slot's new length."""
        moved = [int(index) for index in moved]
        if moved != list(range(length, length + len(moved))):
            cache = self.stacked[:, :, slot]  # (2, layers, kv heads, capacity, head_dim)
            index = torch.tensor(moved, dtype=torch.long, device=cache.device)
            cache[..., length : length + len(moved), :] = cache.index_select(3, index)
        return length + len(moved)

    @torch.no_grad()
    def copy_slot(self, source: int, target: int, length: int) -> None:
        """Copy ``source``'s entries [0, length) into slot ``target``, every layer, keys and values."""
        self.stacked[:, :, target, :, :length] = self.stacked[:, :, source, :, :length]

    def with_slots(self, slots: int, used: int) -> "KVBuffers":
        """New buffers with ``slots`` slots and this capacity, the existing slots' entries [0, used) copied."""
        grown = KVBuffers(self.num_layers, self.num_kv_heads, self.head_dim, self.like, self.min_capacity, slots)
        if self.stacked is not None:
            shape = list(self.stacked.shape)
            shape[2] = slots
            stacked = self.like.new_zeros(shape)
            with torch.no_grad():
                stacked[:, :, : self.slots, :, :used] = self.stacked[:, :, :, :, :used]
            grown._use(stacked)
        return grown

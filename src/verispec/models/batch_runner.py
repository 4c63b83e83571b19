"""One forward over several sequences' draft trees: the batched native Llama runner (DESIGN.md §4).

``BatchedLlamaRunner`` runs the weights of a ``NativeLlamaRunner`` (the same modules, the same
oneDNN-packed copies, plus the base's stacked q|k|v and gate|up products, ``fused_linears``: one
call each instead of five, built once per base runner) over a KV cache with one *slot* per sequence:
keys/values of shape (slots, kv_heads, capacity, head_dim) per layer, each slot with its own
length. Each sequence talks to its slot through a ``SlotRunner``, which has the interface of a
single-sequence runner (``reset`` / ``seq_length`` / ``forward`` / ``keep_entries``), so an
``HFModelAdapter(model, runner=slot)`` keeps all its tree bookkeeping (node numbering, tree
masks, commit, rollback) per sequence, unchanged.

A forward is *submitted* per slot and run for all submitted slots at once by ``flush``:

* packed, not padded, through the linear layers: the inputs of all sequences form one
  (1, M, hidden) matrix (M = total new tokens), so a weight read serves every sequence and no
  padding token is multiplied;
* padded for attention only: queries are scattered to (B, kv_heads, group, N, head_dim) with N
  the largest padded request. Requests much larger than the others (a prompt joining a batch of
  small trees; prompts prefilled together) attend on their own instead, each over its slot's
  [0, length + n) keys, where the estimated cost is less (``attended_alone``). The padded ones
  read keys from the slots over S entries: the slots' whole buffers (S = capacity, a view: no
  copy) while the capacity is at most ``WHOLE_BUFFER_SLACK`` times E, the largest cache length
  after the forward, else their first E entries (copied); an additive
  (B * kv_heads, group * N, S) bias, built once per forward, holds each sequence's own pattern
  (its tree mask, or causal) over its own slot: 0 where seen, -inf elsewhere (the entries past a
  slot's length, other slots' lengths, unused capacity: finite there, as the buffers start as
  zeros and only ever receive computed keys). A sequence never sees another's keys:
  they live in other slots. Padded query rows attend to entry 0 only (their output is dropped)
  so no row is fully masked.
* each sequence's new keys/values are written to its slot at its own positions [length,
  length + n) before the attention reads them, as in the single-sequence runner.

Every row of a batched forward computes the same function as the sequence's solo forward; the
products run over more rows, so in floating point they may round differently (batch variance:
tests/models/test_batch_runner.py, tiny Llama: largest |logit difference| 2.4e-7 in fp32, 0 in
float64). With several sequences the attention is two batched products with the mask added by
the first (``_grouped_attention``) rather than the CPU ``scaled_dot_product_attention`` kernel,
which was as slow as the rest of the layer on short masked queries; a batch of one uses the solo
runner's kernel.

Features (EAGLE-3 heads): a slot whose ``feature_layers`` is set also gets, from the same forward,
the hidden states of its own inputs at those HF ``hidden_states`` indices (``last_features``, as
the single-sequence runner's), so a head reading them can draft in a batch.

Slots stay dense: ``close`` moves the last slot's entries into the freed one, so the active
sequences always occupy slots [0, B) and the attention reads a view of the cache, not a copy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from verispec.errors import ConfigError
from verispec.models.attention import single_query_attention, takes_single_query_path
from verispec.models.kv_buffer import MIN_CAPACITY, KVBuffers
from verispec.models.native_llama import NativeLlamaRunner, _rms_norm, _rotate


# Attention reads the slots' whole key buffers (no copy) while their capacity is at most this
# multiple of the longest cache; past it, it copies the [0, E) prefix (``_attention_keys``).
WHOLE_BUFFER_SLACK = 1.5
# What attending one request on its own costs beyond its products, in (query row x key) units of
# the attention's products (``attended_alone``): bf16, one thread, ~0.018 us per row and key padded
# or not, ~75 us per call.
ALONE_CALL_KEYS = 4000


def attended_alone(sizes: Sequence[int], key_lengths: Sequence[int], span: int, call_keys: float = ALONE_CALL_KEYS) -> frozenset[int]:
    """The requests (indices into ``sizes``, each request's new tokens) whose attention runs on its
    own rather than padded with the others': the largest ones, as many as make the estimated cost
    least (possibly all). Padded, every one of the B slots pays the largest remaining request's rows
    over the ``span`` keys read per slot (B x N x span); a request on its own pays its rows over its
    own ``key_lengths`` (its cache after the forward) plus ``call_keys``. A prompt joining a batch of
    small trees (141 rows next to 15, 12, 18) cost 2-5 ms per layer padded (bf16, B = 4) against 0.8 ms
    this way, and 4 prompts prefilled together 3.7 ms against 2.8; small trees of similar sizes stay
    padded (one call for all)."""
    batch = len(sizes)
    order = sorted(range(batch), key=lambda row: -sizes[row])
    keep, best, spent = 0, batch * sizes[order[0]] * span, 0.0
    for k in range(1, batch + 1):
        row = order[k - 1]
        spent += sizes[row] * key_lengths[row] + call_keys
        cost = spent + (batch * sizes[order[k]] * span if k < batch else 0)
        if cost < best:
            keep, best = k, cost
    return frozenset(order[:keep])


def _grouped_attention(queries, keys, values, bias) -> torch.Tensor:
    """Masked attention with grouped-query heads (query head h reads kv head h // group), padded
    over B slots: queries (B * kv_heads, group * N, head_dim), already scaled, the N queries of the
    ``group`` heads of one kv head one after another; keys/values (B, kv_heads, S, head_dim)
    CONTIGUOUS; ``bias`` (B * kv_heads, group * N, S) in the model's dtype, 0 where a query may see
    a key and -inf where not (``_key_bias``, built once per forward). Returns
    (B * kv_heads, group * N, head_dim).

    Two batched products rather than the CPU ``scaled_dot_product_attention`` kernel, which took
    longer per layer than the rest of the layer on short masked queries over several sequences.
    The operands must be contiguous: bf16 products on a CPU (oneDNN) copy a strided operand first
    and, for the transposed keys, that copy took as long as the product. The mask is added by the
    first product (``baddbmm``) and the softmax runs in the model's dtype (the CPU kernel
    accumulates in float32 and rounds once, as a float32 softmax cast back would): B = 4, 5 queries
    each, 256 keys, bf16: 98 us per layer against 123 us for a bool mask filled in and a float32
    softmax, same result."""
    batch, kv_heads, span, _ = keys.shape
    scores = torch.baddbmm(bias, queries, keys.view(batch * kv_heads, span, -1).transpose(1, 2))  # (B * kvh, G * N, S)
    return torch.bmm(torch.softmax(scores, dim=-1), values.view(batch * kv_heads, span, -1))


@dataclass
class _Request:
    """One submitted forward of one slot (the arguments of a single-sequence runner's forward)."""

    input_ids: list[int]
    positions: list[int]
    allowed: torch.Tensor | None
    keep: int
    features: tuple[int, ...] | None = None  # the slot's feature layers (hidden states to return)


class SlotRunner:
    """The single-sequence runner interface over one slot of a ``BatchedLlamaRunner``.

    ``forward`` submits the request; ``wait`` (set by the scheduler that drives the batch) is
    called next and must return once the batch was flushed. Without a scheduler the forward
    flushes at once (a batch of one).
    """

    def __init__(self, batch: "BatchedLlamaRunner", slot: int, wait: Callable[[], None] | None = None):
        self.batch = batch
        self.slot = slot
        self.wait = wait
        # as the single-sequence runner's: HF hidden_states indices whose states (the inputs of those
        # decoder layers) each forward also returns, (n, len(layers) * hidden), in ``last_features``
        self.feature_layers: tuple[int, ...] | None = None
        self.last_features: torch.Tensor | None = None

    def reset(self) -> None:
        self.batch.lengths[self.slot] = 0

    def seq_length(self) -> int:
        return self.batch.lengths[self.slot]

    def forward(self, input_ids: list[int], positions: list[int], allowed: torch.Tensor | None, keep: int):
        self.batch.submit(self.slot, input_ids, positions, allowed, keep, self.feature_layers)
        if self.wait is None:
            self.batch.flush()
        else:
            self.wait()
        self.last_features = self.batch._features.pop(self.slot, None)
        return self.batch.take_result(self.slot)

    def keep_entries(self, length: int, moved: Sequence[int] = ()) -> None:
        self.batch.keep_entries(self.slot, length, moved)


class BatchedLlamaRunner:
    """Forward of several sequences at once over a slotted KV cache, with ``base``'s weights."""

    def __init__(self, base: NativeLlamaRunner, initial_slots: int = 4, initial_capacity: int = MIN_CAPACITY):
        self.check_base(base)
        self.base = base
        self.initial_capacity = int(initial_capacity)
        self.kv = self._buffers(max(1, int(initial_slots)))
        self.lengths: list[int] = []  # valid cache entries of each open slot
        self.slots: list[SlotRunner] = []  # open slots, slot i at index i
        self._requests: dict[int, _Request] = {}
        self._results: dict[int, torch.Tensor] = {}
        self._features: dict[int, torch.Tensor] = {}  # flushed features of slots that asked for them
        # the last flush's logits of every request, packed (``flushed_rows``), and each unread result's first row there
        self._flushed: torch.Tensor | None = None
        self._result_rows: dict[int, int] = {}

    @staticmethod
    def check_base(base) -> None:
        """ConfigError unless ``base`` is a runner whose weights this runner can batch."""
        if not isinstance(base, NativeLlamaRunner):
            raise ConfigError(
                f"batched decoding runs on the native Llama runner; this target runs on {type(base).__name__} "
                "(the transformers forward cannot batch yet): use a Llama-architecture target with backend 'auto' or 'native'"
            )

    def _buffers(self, slots: int) -> KVBuffers:
        base = self.base
        return KVBuffers(len(base.layers), base.num_kv_heads, base.head_dim, base.param, self.initial_capacity, slots=slots)

    # ----- slots ---------------------------------------------------------------------------
    def open(self, wait: Callable[[], None] | None = None) -> SlotRunner:
        """A new empty slot (the slot count doubles when all are taken)."""
        slot = len(self.slots)
        if slot >= self.kv.slots:
            self._grow_slots(2 * self.kv.slots)
        runner = SlotRunner(self, slot, wait)
        self.slots.append(runner)
        self.lengths.append(0)
        return runner

    def _grow_slots(self, slots: int) -> None:
        self.kv = self.kv.with_slots(slots, used=max(self.lengths, default=0))

    @torch.no_grad()
    def close(self, runner: SlotRunner) -> None:
        """Free ``runner``'s slot; the last open slot moves into it, so open slots stay [0, B)."""
        slot, last = runner.slot, len(self.slots) - 1
        if self.slots[slot] is not runner:
            raise ConfigError(f"slot {slot} is not open on this runner (closed twice?)")
        if slot in self._requests:
            raise ConfigError("a slot with a submitted forward cannot be closed before the flush")
        self._results.pop(slot, None)
        self._features.pop(slot, None)
        self._result_rows.pop(slot, None)
        if slot != last:  # the last slot moves here: its entries, its queued forward or result, its runner
            length = self.lengths[last]
            if length:
                self.kv.copy_slot(last, slot, length)
            for queue in (self._requests, self._results, self._features, self._result_rows):
                if last in queue:
                    queue[slot] = queue.pop(last)
            moved = self.slots[last]
            moved.slot = slot
            self.slots[slot], self.lengths[slot] = moved, length
        self.slots.pop()
        self.lengths.pop()

    # ----- forward -------------------------------------------------------------------------
    def submit(self, slot: int, input_ids: list[int], positions: list[int], allowed: torch.Tensor | None, keep: int,
               features: Sequence[int] | None = None) -> None:
        """Queue one forward of ``slot``: append len(input_ids) entries at ``positions`` with the
        attention pattern ``allowed`` (n, length + n) (None: causal) and return, at ``flush``, the
        logits of the last ``keep`` inputs (and with ``features``, HF hidden_states indices, the
        (n, len(features) * hidden) states of every input)."""
        if slot in self._requests:
            raise ConfigError(f"slot {slot} already has a forward queued; flush before submitting another")
        if not input_ids or len(positions) != len(input_ids) or not 1 <= keep <= len(input_ids):
            raise ConfigError(f"a forward needs >= 1 input, one position per input and 1 <= keep <= inputs; got "
                              f"{len(input_ids)} inputs, {len(positions)} positions, keep {keep}")
        features = None if features is None else tuple(int(i) for i in features)
        self._requests[slot] = _Request(list(input_ids), list(positions), allowed, int(keep), features)

    def take_result(self, slot: int) -> torch.Tensor:
        """The logits (keep, V) of ``slot``'s flushed forward (float32, CPU)."""
        if slot not in self._results:
            raise ConfigError(f"slot {slot} has no flushed forward: submit and flush first")
        self._result_rows.pop(slot, None)
        return self._results.pop(slot)

    def flushed_rows(self, slot: int) -> tuple[torch.Tensor, int, int] | None:
        """(the last flush's logits of all its requests (K, V), packed; the first of ``slot``'s rows
        there; their count) while ``slot``'s result is unread, else None: a reader of several slots'
        results (the batch's adjacency refresh) indexes one tensor instead of copying rows together."""
        first = self._result_rows.get(slot)
        return None if first is None else (self._flushed, first, self._results[slot].shape[0])

    def discard_queued(self) -> None:
        """Drop every queued forward unrun (the batch was stopped)."""
        self._requests = {}

    @property
    def pending(self) -> int:
        """Slots with a forward queued."""
        return len(self._requests)

    def admits(self) -> bool:
        """Whether a sequence may join now: always (free slots are the only limit; the caller checks them)."""
        return True

    @property
    def pending_tokens(self) -> int:
        """Tokens the queued forwards will score together."""
        return sum(len(request.input_ids) for request in self._requests.values())

    def _allowed(self, slot: int, request: _Request) -> torch.Tensor:
        """(n, length + n) bool: the request's attention pattern over its slot (None: causal)."""
        if request.allowed is not None:
            return request.allowed
        n, start = len(request.input_ids), self.lengths[slot]
        return torch.ones(n, start + n, dtype=torch.bool).tril(start)

    def _mask(self, slots: list[int], requests: list[_Request], width: int, end: int, alone=frozenset()) -> torch.Tensor:
        """(B, 1, width, end) bool: each request's own pattern over its own slot; padded query rows
        (all of an ``alone`` request's: it attends on its own) see entry 0 only (never a fully masked row)."""
        mask = torch.zeros(len(slots), 1, width, end, dtype=torch.bool)
        for row, (slot, request) in enumerate(zip(slots, requests)):
            n = 0 if row in alone else len(request.input_ids)
            if n:
                allowed = self._allowed(slot, request)
                mask[row, 0, :n, : allowed.shape[1]] = allowed
            mask[row, 0, n:, 0] = True
        return mask.to(self.base.param.device)

    def _key_bias(self, mask: torch.Tensor, kv_heads: int, group: int) -> torch.Tensor:
        """The grouped attention's form of ``mask`` (B, 1, N, S) bool (True = may see): an additive
        (B * kv_heads, group * N, S) bias in the model's dtype, 0 or -inf, the same for every head."""
        batch, _, width, span = mask.shape
        bias = torch.zeros(mask.shape, dtype=self.base.param.dtype, device=mask.device).masked_fill_(~mask, float("-inf"))
        return bias[:, :, None].expand(batch, kv_heads, group, width, span).reshape(batch * kv_heads, group * width, span)

    @torch.no_grad()
    def flush(self) -> None:
        """Run every queued forward in one pass over the model; results wait in ``take_result``."""
        if not self._requests:
            return
        base = self.base
        slots = sorted(self._requests)
        requests = [self._requests[slot] for slot in slots]
        sizes = [len(r.input_ids) for r in requests]
        starts = [self.lengths[slot] for slot in slots]
        end = max(start + n for start, n in zip(starts, sizes))
        self.kv.reserve(end, used=max(self.lengths))
        device = base.param.device
        heads, kv_heads, head_dim = base.num_heads, base.num_kv_heads, base.head_dim
        group = heads // kv_heads
        single = len(slots) == 1  # a batch of one: slice writes, and no mask where the solo runner needs none
        contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        slot_index = None if contiguous else torch.tensor(slots, device=device)
        # keys the padded attention reads per slot: the whole buffers (a contiguous view) or the
        # first ``end`` entries, copied (contiguous operands: ``_grouped_attention``)
        whole = contiguous and self.kv.capacity <= WHOLE_BUFFER_SLACK * end
        span = self.kv.capacity if whole else end
        # requests attended on their own (prompts, a joining prompt beside small trees); the others padded together
        alone = frozenset() if single else attended_alone(sizes, [a + n for a, n in zip(starts, sizes)], span, ALONE_CALL_KEYS)
        padded_sizes = [0 if row in alone else n for row, n in enumerate(sizes)]
        width = max(padded_sizes)  # 0: every request attends on its own
        # every request padded and of one size: (B, N) is a plain view of the packed rows
        uniform = not alone and min(sizes) == width
        # where each packed input goes: its request row, its index in the request, its cache slot and entry
        rows = torch.tensor([row for row, n in enumerate(padded_sizes) for _ in range(n)], device=device)
        offsets = torch.tensor([i for n in padded_sizes for i in range(n)], device=device)
        firsts = [sum(sizes[:row]) for row in range(len(sizes))]
        padded_inputs = None if not alone else torch.tensor(
            [firsts[row] + i for row, n in enumerate(padded_sizes) for i in range(n)], dtype=torch.long, device=device)
        slot_of = torch.tensor([slot for slot, n in zip(slots, sizes) for _ in range(n)], device=device)
        entry_of = torch.tensor([start + i for start, n in zip(starts, sizes) for i in range(n)], device=device)
        if (single and requests[0].allowed is None and width == 1) or not width:
            mask = None  # one query that sees the whole cache, or no padded attention
        else:
            mask = self._mask(slots, requests, width, end if single else span, alone)
        bias = None if single or not width else self._key_bias(mask, kv_heads, group)
        # each request attended on its own: (first packed input, inputs, slot, keys it reads, its bias)
        own = [(firsts[row], sizes[row], slots[row], starts[row] + sizes[row],
                self._key_bias(self._allowed(slots[row], requests[row])[None, None].to(device), kv_heads, group))
               for row in sorted(alone)]
        body = base.model.model
        hidden = body.embed_tokens(torch.tensor([[t for r in requests for t in r.input_ids]], device=device))
        cos, sin = body.rotary_emb(hidden, torch.tensor([[p for r in requests for p in r.positions]], device=device))
        cos, sin = cos[0][:, None], sin[0][:, None]  # (M, 1, head_dim)
        total, batch = sum(sizes), len(slots)
        capture = {i for r in requests if r.features is not None for i in r.features}
        captured: dict[int, torch.Tensor] = {}  # layer index -> (M, hidden) inputs of that layer, packed
        fused = base.fused_linears()
        single_row = (single and total == 1 and mask is None and base.single_query_path
                      and takes_single_query_path(total, hidden.dtype, device))
        for index, (layer, linears, key_cache, value_cache) in enumerate(zip(base.layers, base.linears, self.kv.keys, self.kv.values)):
            if index in capture:
                captured[index] = hidden[0]
            qkv_proj, gate_up_proj = fused[index]
            x = _rms_norm(hidden, layer.input_layernorm)
            qkv = qkv_proj(x).view(total, heads + 2 * kv_heads, head_dim)
            qk = _rotate(qkv[:, : heads + kv_heads], cos, sin)  # q and k in one pass
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]
            if single:
                key_cache[slots[0], :, starts[0] : end] = k.transpose(0, 1)
                value_cache[slots[0], :, starts[0] : end] = v.transpose(0, 1)
            else:
                key_cache[slot_of, :, entry_of] = k
                value_cache[slot_of, :, entry_of] = v
            if single_row:  # the solo runner's single-row path (models.attention)
                out = single_query_attention(
                    q.view(1, 1, heads, head_dim).transpose(1, 2), key_cache[slots[0] : slots[0] + 1, :, :end],
                    value_cache[slots[0] : slots[0] + 1, :, :end], base.scaling,
                ).reshape(total, heads * head_dim)
            elif single:  # the solo runner's kernel
                out = F.scaled_dot_product_attention(
                    q.view(1, width, heads, head_dim).transpose(1, 2), key_cache[slots[0] : slots[0] + 1, :, :end],
                    value_cache[slots[0] : slots[0] + 1, :, :end], attn_mask=mask, scale=base.scaling,
                    enable_gqa=heads != kv_heads,
                ).transpose(1, 2).reshape(total, heads * head_dim)
            else:
                scaled = None if uniform else (q * base.scaling).view(total, kv_heads, group, head_dim)
                if width:  # the padded requests: (B, kv_heads, group, N, head_dim), scaled, padded rows zero
                    if whole:
                        keys, values = key_cache[slots[0] : slots[0] + batch], value_cache[slots[0] : slots[0] + batch]
                    elif slot_index is None:
                        keys = key_cache[slots[0] : slots[0] + batch, :, :end].contiguous()
                        values = value_cache[slots[0] : slots[0] + batch, :, :end].contiguous()
                    else:
                        keys = key_cache[:, :, :end].index_select(0, slot_index)
                        values = value_cache[:, :, :end].index_select(0, slot_index)
                    if uniform:  # each kv head's queries in a row
                        queries = q.new_empty(batch, kv_heads, group, width, head_dim)
                        torch.mul(q.view(batch, width, kv_heads, group, head_dim).permute(0, 2, 3, 1, 4), base.scaling, out=queries)
                    else:
                        queries = q.new_zeros(batch, kv_heads, group, width, head_dim)
                        queries[rows, :, :, offsets] = scaled if padded_inputs is None else scaled[padded_inputs]
                    out = _grouped_attention(queries.view(batch * kv_heads, group * width, head_dim), keys, values, bias)
                    out = out.view(batch, kv_heads, group, width, head_dim)
                if uniform:
                    out = out.permute(0, 3, 1, 2, 4).reshape(total, heads * head_dim)
                elif not alone:  # (M, kv_heads, group, head_dim): each packed input's own row
                    out = out[rows, :, :, offsets].reshape(total, heads * head_dim)
                else:  # the padded requests' rows, then each alone request's own attention over its slot
                    padded_out = out[rows, :, :, offsets] if width else None
                    out = q.new_empty(total, kv_heads, group, head_dim)
                    if width:
                        out.index_copy_(0, padded_inputs, padded_out)
                    for first, n, slot, keys_end, own_bias in own:
                        own_queries = scaled[first : first + n].permute(1, 2, 0, 3).reshape(kv_heads, group * n, head_dim)
                        own_out = _grouped_attention(own_queries, key_cache[slot, :, :keys_end].contiguous()[None],
                                                     value_cache[slot, :, :keys_end].contiguous()[None], own_bias)
                        out[first : first + n] = own_out.view(kv_heads, group, n, head_dim).permute(2, 0, 1, 3)
                    out = out.view(total, heads * head_dim)
            hidden = hidden + linears[3](out[None])  # o_proj
            x = _rms_norm(hidden, layer.post_attention_layernorm)
            gate, up = gate_up_proj(x).chunk(2, dim=-1)
            hidden = hidden + linears[6](F.silu(gate) * up)  # down_proj
        kept, first = [], 0
        for n, request in zip(sizes, requests):
            kept += range(first + n - request.keep, first + n)
            first += n
        logits = base.output_logits(hidden[:, kept])
        first = packed = 0
        for slot, start, n, request in zip(slots, starts, sizes, requests):
            self.lengths[slot] = start + n
            self._results[slot] = logits[first : first + request.keep]
            self._result_rows[slot] = first
            if request.features is not None:  # this request's own packed rows of each layer it asked for
                self._features[slot] = torch.cat([captured[i][packed : packed + n] for i in request.features], dim=-1)
            first += request.keep
            packed += n
        self._flushed = logits
        self._requests = {}

    @torch.no_grad()
    def keep_entries(self, slot: int, length: int, moved: Sequence[int] = ()) -> None:
        """Keep ``slot``'s entries [0, length) followed by its entries at indices ``moved`` (copied down)."""
        if slot in self._requests:
            raise ConfigError(f"slot {slot} has a forward queued; flush before truncating its cache")
        self.lengths[slot] = self.kv.move_entries(slot, length, moved)

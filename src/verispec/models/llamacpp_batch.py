"""Several sequences in one llama.cpp context: the batched forward of the llamacpp backend.

``LlamaCppBatch(target, slots)`` opens a second llama.cpp context on the target's weights (the
model is shared, not loaded again) with one unified KV cache for every sequence of a batch. Each
sequence talks to it through a ``LlamaCppSlot``: a ``LlamaCppAdapter`` (same tree layout, same
commit / rollback / append_committed bookkeeping) that owns its own range of llama.cpp sequence
ids (its committed sequence and one id per extra root-to-leaf path) and whose forward is
*submitted*: once every live sequence has submitted (the scheduler of ``engine.batch`` decides),
``flush`` runs ONE ``llama_decode`` over all their entries (chunks of ``n_batch`` tokens, the
batch-invariant size) and hands each sequence its logits rows.

Exactness needs each sequence's cells in position order (llamacpp.py's module docstring: CPU flash
attention accumulates a row over its visible cells in cell order, in F16 with the default cache,
so another order gives other logits). Alone, an adapter frees the cells of rejected nodes and
the next forward fills them in order. In a shared cache a freed cell is a hole before other
sequences' cells, and llama.cpp's slot search fills holes first (from the lowest freed cell, or
from cell 0 when enough are free): another sequence's next tokens would land before its own
older cells (measured: ``benchmarks/llamacpp_batch_probe.py``). So this context never frees a
cell while sequences are live: a cell a solo adapter would free is *retired* instead, tagged
with the garbage sequence id 0 (which no forward reads) and stripped of the sequence's own ids.
Every new cell then lands after every existing one, each sequence's cells stay in position order,
and each row equals the row of the sequence decoded alone. The price is room: the shared cache
holds every token ever fed until the last sequence closes (then it is cleared), so its size
(``cells``) bounds the tokens fed while sequences overlap; a forward that does not fit ends the
sequences of that forward with a ConfigError naming ``cells``. Once half the cache is used, no new
sequence joins (``admits``) until the running ones finish and the cache is cleared.

A sequence's prefill (``reset``) is computed in the target's own context exactly as alone and its
cells copied into the shared cache (``LlamaCppBatch.prefill``: llama.cpp's flash attention over 64
or more tokens groups cells by their index from cell 0, so a prefill computed at another offset
gives other values).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from verispec.errors import ConfigError
from verispec.models.llamacpp import DEFAULT_SEQ_MAX, LlamaCppAdapter
from verispec.models.tree_round import check_prompt

GARBAGE_SEQ = 0  # the sequence id of retired cells: never read by any forward
MAX_CELLS = 16384  # default cap of the shared cache (~23 KB per cell for the default target: 0.4 GB)


@dataclass
class _Submission:
    """The batch entries of one slot's forward, with its sequence ids already global."""

    tokens: list[int]
    positions: list[int]
    seqs: list[list[int]]
    logits: list[bool]


def shared_batch(target: LlamaCppAdapter, slots: int) -> "LlamaCppBatch":
    """The target's batch context for ``slots`` sequences, kept on the target (``shared_batch``)
    and reused by every later batch of that size: creating one costs ~0.5-1.3 s (llama.cpp clears
    its cache and reserves its compute graphs; default target, 2 / 8 slots, measured 2026-11-28);
    the target's ``close`` frees it before the model."""
    batch = target.__dict__.get("shared_batch")
    if batch is None or batch.slots != int(slots) or not batch._ctx:
        if batch is not None:
            batch.close_context()
        batch = LlamaCppBatch(target, slots)
        target.shared_batch = batch
    return batch


class LlamaCppBatch:
    """One llama.cpp context shared by up to ``slots`` sequences (see the module docstring).

    target: the decoder's ``LlamaCppAdapter`` (its model and context settings are reused);
    slots: sequences at once; cells: size of the shared cache (default: ``target.max_context`` per
    slot, at most MAX_CELLS); paths: root-to-leaf paths a sequence's tree may have (default: as
    many as the 256 llama.cpp sequence ids allow, at most the solo adapter's DEFAULT_SEQ_MAX).
    """

    def __init__(self, target: LlamaCppAdapter, slots: int, cells: int | None = None, paths: int | None = None):
        lib = target._llama
        self._ctx = self._batch = None
        self.open_slots: list[LlamaCppSlot] = []
        # the target stays referenced: its model (the weights this context reads) outlives the context
        self._llama, self.target = lib, target
        limit = lib.llama_max_parallel_sequences()
        if not 1 <= int(slots) <= limit - 1:
            raise ConfigError(f"a llama.cpp batch holds 1 to {limit - 1} sequences, got max_batch={slots}")
        self.slots = int(slots)
        self.paths = min(DEFAULT_SEQ_MAX, (limit - 1) // self.slots) if paths is None else int(paths)
        if not 1 <= self.paths <= (limit - 1) // self.slots:
            raise ConfigError(f"paths must lie in [1, {(limit - 1) // self.slots}] for {self.slots} sequences, got {paths}")
        self.cells = min(target.max_context * self.slots, MAX_CELLS) if cells is None else int(cells)
        if self.cells < 2:
            raise ConfigError(f"cells must be >= 2, got {cells}")
        params = type(target.context_params)()
        ctypes.pointer(params)[0] = target.context_params  # a copy: the target's own context keeps its settings
        params.n_ctx = self.cells
        params.n_seq_max = 1 + self.slots * self.paths
        params.n_outputs_max = max(target.n_batch, params.n_seq_max)
        self._ctx = lib.llama_init_from_model(target._model, params)
        if not self._ctx:
            raise ConfigError(f"llama.cpp could not create a batch context of {self.cells} cells; give fewer cells or max_batch")
        self._memory = lib.llama_get_memory(self._ctx)
        self.cells = int(lib.llama_n_ctx(self._ctx))  # llama.cpp rounds its cache up (to 256 cells)
        self._batch = lib.llama_batch_init(max(target.prefill_batch, target.n_batch), 0, params.n_seq_max)
        self._free_slots = list(range(self.slots))
        self.fed = 0  # cells written since the cache was last cleared (retired ones included)
        self._queued: dict[int, _Submission] = {}
        self._results: dict[int, np.ndarray | ConfigError] = {}

    # ----- slots ---------------------------------------------------------------------------
    def open(self, wait: Callable[[], None] | None = None) -> "LlamaCppSlot":
        """A new empty sequence (a ``LlamaCppAdapter``); ``wait`` is called after each submitted
        forward and must return once the batch was flushed (None: flush at once)."""
        if not self._free_slots:
            raise ConfigError(f"all {self.slots} sequences of this llama.cpp batch are open; close one first")
        slot = LlamaCppSlot(self, self._free_slots.pop(0), wait)
        self.open_slots.append(slot)
        return slot

    def close(self, slot: "LlamaCppSlot") -> None:
        """Retire the sequence's cells and free its ids; the last close clears the cache."""
        if slot not in self.open_slots:
            return
        slot.retire_all()
        self._queued.pop(slot.index, None)
        self._results.pop(slot.index, None)
        self.open_slots.remove(slot)
        self._free_slots.append(slot.index)
        if not self.open_slots:  # no live cell left: the whole cache is free again, in order
            self._llama.llama_memory_clear(self._memory, True)
            self.fed = 0

    def admits(self) -> bool:
        """Whether a new sequence may join the running ones: while at most half of the cache is
        used. Past that the batch drains (no one joins until the running sequences finish and the
        cache is cleared), so a batch or server that never empties still clears its cache."""
        return self.fed <= self.cells // 2

    def global_id(self, slot: int, seq: int) -> int:
        """The llama.cpp sequence id of a slot's local sequence id (0 = its committed text)."""
        return 1 + slot * self.paths + seq

    # ----- forwards ------------------------------------------------------------------------
    def submit(self, slot: int, entries: _Submission) -> None:
        self._queued[slot] = entries

    @property
    def pending_tokens(self) -> int:
        """Entries queued for the next flush."""
        return sum(len(s.tokens) for s in self._queued.values())

    def discard_queued(self) -> None:
        self._queued.clear()

    def take_result(self, slot: int) -> np.ndarray:
        result = self._results.pop(slot)
        if isinstance(result, ConfigError):
            raise ConfigError(str(result))
        return result

    def flush(self) -> None:
        """Run every queued forward as one ``llama_decode`` (chunks of the target's n_batch) and
        keep each slot's rows for ``take_result``. A failed decode fails every queued slot."""
        if not self._queued:
            return
        queued, self._queued = self._queued, {}
        order = sorted(queued)
        joined = _Submission([], [], [], [])
        for slot in order:
            for name in ("tokens", "positions", "seqs", "logits"):
                getattr(joined, name).extend(getattr(queued[slot], name))
        try:
            rows = self.decode(joined, self.target.n_batch)
        except ConfigError as error:
            for slot in order:
                self._results[slot] = error
            return
        start = 0
        for slot in order:
            count = sum(queued[slot].logits)
            self._results[slot] = rows[start : start + count]
            start += count

    def decode(self, entries: _Submission, chunk: int) -> np.ndarray:
        """``llama_decode`` the entries in chunks of ``chunk``: the float32 rows of the entries
        with ``logits`` set, in order, (n, V)."""
        lib, batch, vocab = self._llama, self._batch, self.target.vocab_size
        rows = []
        for start in range(0, len(entries.tokens), chunk):
            end = min(start + chunk, len(entries.tokens))
            for j, i in enumerate(range(start, end)):
                batch.token[j] = entries.tokens[i]
                batch.pos[j] = entries.positions[i]
                batch.n_seq_id[j] = len(entries.seqs[i])
                for k, seq in enumerate(entries.seqs[i]):
                    batch.seq_id[j][k] = seq
                batch.logits[j] = bool(entries.logits[i])
            batch.n_tokens = end - start
            status = lib.llama_decode(self._ctx, batch)
            self.fed += end - start if status == 0 else 0
            if status != 0:
                raise ConfigError(
                    f"llama_decode failed with status {status} on {end - start} tokens of a batch (1: the shared cache "
                    f"of {self.cells} cells is full: it keeps every token fed until the batch ends; -1: invalid batch); "
                    "give the batch more cells, or run fewer sequences at once (max_batch) or fewer max_new_tokens"
                )
            outputs = sum(bool(x) for x in entries.logits[start:end])
            if outputs:
                pointer = lib.llama_get_logits(self._ctx)
                rows.append(np.ctypeslib.as_array(pointer, shape=(outputs, vocab)).copy())
        if not rows:
            return np.zeros((0, vocab), dtype=np.float32)
        return rows[0] if len(rows) == 1 else np.concatenate(rows)

    def prefill(self, seq: int, prompt: list[int]) -> None:
        """Make ``prompt[:-1]`` the cells of llama.cpp sequence ``seq`` (which holds none): computed
        in the target's own context exactly as alone (cells from 0), then copied here
        (``llama_state_seq_get_data`` / ``set_data``: keys and values only, ~23 KB a token for the
        default target). Computing it here would not give the solo rows: for a forward of 64 tokens
        or more llama.cpp's CPU flash attention works in tiles of 64 cells counted from cell 0, so a
        prompt whose cells start elsewhere in the shared cache is summed in other groups."""
        lib, target = self._llama, self.target
        target.reset(prompt)
        size = lib.llama_state_seq_get_size(target._ctx, 0)
        buffer = (ctypes.c_uint8 * size)()
        lib.llama_state_seq_get_data(target._ctx, buffer, size, 0)
        if lib.llama_state_seq_set_data(self._ctx, buffer, size, seq) == 0:
            raise ConfigError(
                f"the shared cache of {self.cells} cells has no room for a prompt of {len(prompt)} tokens (it keeps every "
                "token fed until the batch ends); give the batch more cells, or run fewer sequences at once (max_batch)"
            )
        self.fed += len(prompt) - 1

    def retire(self, seq: int, position: int) -> None:
        """Move the cells of llama.cpp sequence ``seq`` at ``position`` and beyond to the garbage
        sequence (kept, never read), so that no hole opens before another sequence's cells."""
        self._llama.llama_memory_seq_cp(self._memory, seq, GARBAGE_SEQ, position, -1)
        self._llama.llama_memory_seq_rm(self._memory, seq, position, -1)

    def untag(self, seq: int) -> None:
        """Remove sequence ``seq`` from every cell (cells other ids hold stay)."""
        self._llama.llama_memory_seq_rm(self._memory, seq, 0, -1)

    def close_context(self) -> None:
        """Free the shared context and its batch (the target keeps its model)."""
        for slot in list(self.open_slots):
            self.close(slot)
        if self._batch is not None:
            self._llama.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self._llama.llama_free(self._ctx)
            self._ctx = None

    def __del__(self):
        self.close_context()


class LlamaCppSlot(LlamaCppAdapter):
    """One sequence of a ``LlamaCppBatch``: the ``LlamaCppAdapter`` contract, its sequence ids
    mapped to the slot's range, its forwards submitted to the batch, its freed cells retired."""

    def __init__(self, batch: LlamaCppBatch, index: int, wait: Callable[[], None] | None):
        target = batch.target
        self._model = self._ctx = self._batch = None  # owned by the target and the batch: close() frees none
        self._llama, self._memory = batch._llama, batch._memory
        self.batch, self.index, self.wait = batch, index, wait
        self.path, self.architecture = target.path, target.architecture
        self.vocab_size, self.max_context, self.eos_token_ids = target.vocab_size, target.max_context, target.eos_token_ids
        self.n_seq_max, self.n_batch, self.prefill_batch = batch.paths, target.n_batch, target.prefill_batch
        self.n_threads = target.n_threads
        self.extra_buffers = target.extra_buffers
        self._cached_len = 0
        self._tokens = []
        self._clear_tree()

    def set_threads(self, n_threads: int) -> None:
        self.n_threads = int(n_threads)
        self._llama.llama_set_n_threads(self.batch._ctx, self.n_threads, self.n_threads)

    def _global(self, seqs: Sequence[Sequence[int]]) -> list[list[int]]:
        return [[self.batch.global_id(self.index, s) for s in ids] for ids in seqs]

    def _decode(self, tokens, positions, seqs, logits, chunk: int | None = None) -> np.ndarray:
        """A round's forward: submitted to the batch, run by its flush (``wait``); this sequence's rows."""
        entries = _Submission([int(t) for t in tokens], list(positions), self._global(seqs), [bool(x) for x in logits])
        self.batch.submit(self.index, entries)
        if self.wait is None:
            self.batch.flush()
        else:
            self.wait()
        return self.batch.take_result(self.index)

    def _tag(self, source: int, target: int, end: int) -> None:
        lib, batch = self._llama, self.batch
        lib.llama_memory_seq_cp(self._memory, batch.global_id(self.index, source), batch.global_id(self.index, target), -1, end)

    def _drop_from(self, position: int) -> None:
        """Retire the committed sequence's cells from ``position`` on and every extra path's cells."""
        self.batch.retire(self.batch.global_id(self.index, 0), position)
        for seq in range(1, self._next_seq):
            self.batch.retire(self.batch.global_id(self.index, seq), position)
            self.batch.untag(self.batch.global_id(self.index, seq))

    def retire_all(self) -> None:
        """Retire every cell of this sequence (its reset, or its close)."""
        self._next_seq = max(self._next_seq, 1)
        self._drop_from(0)
        self._cached_len = 0

    def reset(self, prompt_ids: Sequence[int]) -> None:
        """Start a sequence: its old cells retired, prompt_ids[:-1] prefilled as alone
        (``LlamaCppBatch.prefill``), prompt_ids[-1] the pending root."""
        prompt = check_prompt(prompt_ids, self.max_context)
        self._check_tokens(prompt)
        self.retire_all()
        self._tokens = prompt
        self._clear_tree()
        if len(prompt) > 1:
            self.batch.prefill(self.batch.global_id(self.index, 0), prompt)
            self._cached_len = len(prompt) - 1

    def close(self) -> None:
        """Leave the batch (cells retired, ids freed)."""
        batch = getattr(self, "batch", None)
        if batch is not None and batch._ctx:
            batch.close(self)

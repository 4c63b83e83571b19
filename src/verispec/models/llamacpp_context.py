"""The llama.cpp context parameters ``LlamaCppAdapter`` asks for (docs/llamacpp.md, "Context
parameters"), chosen in one place so that a benchmark can build the same context and a test can
check the choice without loading a model.
"""

from __future__ import annotations

from dataclasses import dataclass

KV_TYPES = {"f16": 1, "f32": 0}  # ggml_type of the KV cache: GGML_TYPE_F16 (llama.cpp's default), GGML_TYPE_F32


@dataclass(frozen=True)
class ContextSettings:
    """What the adapter sets in ``llama_context_params`` (the rest stays llama.cpp's default).

    n_ctx: cells asked for; n_batch = n_ubatch: tokens of one ``llama_decode`` (a prefill chunk
    and a round both fit one physical batch); n_seq_max: sequence ids (root-to-leaf paths of the
    widest tree); n_outputs_max: rows of logits one decode may return; threads: CPU threads;
    kv_type: "f16" or "f32"; flash_attn: None (llama.cpp's choice), True or False."""

    n_ctx: int
    n_batch: int
    n_seq_max: int
    n_outputs_max: int
    threads: int
    kv_type: str = "f16"
    flash_attn: bool | None = None

    @classmethod
    def choose(cls, context: int, round_batch: int, prefill_batch: int, n_seq_max: int, threads: int,
               kv_type: str = "f16", flash_attn: bool | None = None) -> ContextSettings:
        """The settings for a context of ``context`` tokens whose rounds decode up to
        ``round_batch`` tokens and whose prefill decodes chunks of ``prefill_batch``."""
        return cls(
            n_ctx=context,
            # one physical batch (n_ubatch) holds a whole prefill chunk: llama.cpp would split it otherwise
            n_batch=min(max(round_batch, prefill_batch), context),
            n_seq_max=n_seq_max,
            # rows are only asked for inside rounds; llama.cpp reserves room for at least n_seq_max
            # output rows and asserts it fits n_outputs_max (the logits buffer: rows x vocabulary floats)
            n_outputs_max=max(round_batch, n_seq_max),
            threads=threads,
            kv_type=kv_type,
            flash_attn=flash_attn,
        )

    def fill(self, lib, params) -> None:
        """Write these settings into ``params`` (a ``llama_context_params`` of ``lib``, llama_cpp)."""
        params.n_ctx = self.n_ctx
        params.n_batch = params.n_ubatch = self.n_batch
        params.n_seq_max = self.n_seq_max
        params.n_outputs_max = self.n_outputs_max
        params.n_threads = params.n_threads_batch = self.threads
        params.kv_unified = True  # one cell buffer: seq_cp tags cells instead of copying a stream
        params.swa_full = True  # sliding-window layers keep every cell, so a rollback never misses one
        params.type_k = params.type_v = KV_TYPES[self.kv_type]
        # None: llama.cpp decides (on for CPUs); off, attention is computed in float32 throughout
        params.flash_attn_type = {None: lib.LLAMA_FLASH_ATTN_TYPE_AUTO, True: lib.LLAMA_FLASH_ATTN_TYPE_ENABLED,
                                  False: lib.LLAMA_FLASH_ATTN_TYPE_DISABLED}[self.flash_attn]
        params.no_perf = True

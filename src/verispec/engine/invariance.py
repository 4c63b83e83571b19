"""Batch-invariant decoding (``batch_invariant=True`` / ``--batch-invariant``): the target's native
runner shapes every forward with the measured ``models.row_shape.RowShape``, so a row's logits do not
depend on how many tokens shared its forward, and a seed gives plain sampling's text bit for bit
(docs/drafter-invariance.md). A single-sequence mode of the native (torch) runner."""

from __future__ import annotations

from verispec.errors import ConfigError
from verispec.models.row_shape import RowShape, invariant_row_shape


def enable_batch_invariance(target, shape: RowShape | None = None) -> RowShape:
    """Turn the mode on for ``target`` (an ``HFModelAdapter`` on the native runner) with ``shape``, or
    the shape measured for this machine (probed once, cached on disk). Returns the shape in force.
    Raises ConfigError for other runners and backends, and where no measured shape is invariant."""
    from verispec.models.native_llama import NativeLlamaRunner

    runner = getattr(target, "runner", None)
    if not isinstance(runner, NativeLlamaRunner):
        backend = getattr(target, "backend", type(target).__name__)
        raise ConfigError(
            f"batch-invariant mode needs the native Llama runner (backend 'auto' or 'native' with a Llama-architecture "
            f"target); this target runs on {backend!r}: drop batch_invariant / --batch-invariant"
        )
    runner.row_shape = invariant_row_shape(runner, target.vocab_size) if shape is None else shape
    return runner.row_shape


def row_shape_of(target) -> RowShape | None:
    """The RowShape in force on ``target``'s runner, None when the mode is off."""
    return getattr(getattr(target, "runner", None), "row_shape", None)


def fit_rounds_to_rows(decoder, shape: RowShape) -> None:
    """Size the rounds the engine chooses itself so one round scores at most ``max_rows`` tokens (the
    root and its nodes: one forward, as the cost model expects); shapes the user gave (--tree, an
    explicit L, K paths) are kept and a longer forward is split into chunks by the runner."""
    most_nodes = shape.max_rows - 1
    drafter = decoder.drafter
    if getattr(drafter, "deterministic", False) and hasattr(drafter, "max_nodes"):
        drafter.max_nodes = min(drafter.max_nodes, most_nodes)
    if decoder.adaptive_draft_len:
        decoder.draft_len = max(1, min(decoder.draft_len, most_nodes))

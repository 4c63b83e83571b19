"""Batch-invariant row shapes for the native Llama forward (docs/drafter-invariance.md).

A row scored inside a k-token forward can differ in its last bits from the same row scored alone:
the linear layers' GEMM kernels change with the number of rows M (and a row's result can depend on
its index within the forward), and the attention's reductions change with the number of keys. With
a seed the engine then emits plain sampling's text only up to those bits (in bf16 a few draws per
thousand flip). ``RowShape`` removes both causes for single-sequence decoding:

* every forward is cut into chunks of at most ``max_rows`` real rows (later chunks see earlier
  chunks' cache entries through the mask: the function is unchanged), and each chunk is padded with
  dummy rows to at least ``min_rows``, so every product runs in the one kernel class of
  [min_rows, max_rows] rows, a plain step included;
* keys are passed up to the cache length rounded up to a multiple of ``key_align``, the extra keys
  masked and zeroed, so the attention's reductions see one length per ``key_align`` block.

Which (min_rows, max_rows) make rows bit-identical depends on the CPU, torch, dtype, model shapes
and threads, so it is measured (``probe_row_shape``: bit-equality of a plain and a chunked decode of
a synthetic chain, not timing) and cached on disk per machine (``invariant_row_shape``).
"""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from verispec.errors import ConfigError

KEY_ALIGN = 64  # keys passed in multiples of this: a multiple of every vector width and SDPA block here
# (min_rows, max_rows) tried by the probe, cheapest first: a small pad keeps a plain step cheap, a
# large cap keeps trees in one forward. The probe keeps the first whose rows are bit-identical.
CANDIDATES = ((1, 25), (1, 16), (2, 25), (2, 16), (2, 14), (4, 14), (4, 12), (4, 10), (4, 8), (4, 5), (8, 14), (15, 15))
PROBE_VERSION = 4  # bump when the probe's checks change: cached results of older probes are ignored


@dataclass(frozen=True)
class RowShape:
    """How the native runner shapes every forward in batch-invariant mode.

    min_rows (P): rows of every chunk after padding with dummy rows (dummies last, dropped);
    max_rows (C): real rows per chunk (a longer forward is split); key_align (A): keys passed up to a
    multiple of A, the padding masked and zeroed.
    """

    min_rows: int
    max_rows: int
    key_align: int = KEY_ALIGN

    def __post_init__(self):
        for name in ("min_rows", "max_rows", "key_align"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"RowShape {name} must be a positive int, got {value!r}")

    def chunks(self, num_rows: int) -> list[tuple[int, int]]:
        """[start, end) row ranges of at most ``max_rows`` real rows covering ``num_rows``."""
        return [(a, min(a + self.max_rows, num_rows)) for a in range(0, num_rows, self.max_rows)]

    def padded(self, num_rows: int) -> int:
        """Rows of a chunk of ``num_rows`` real rows once padded."""
        return max(num_rows, self.min_rows)

    def key_length(self, end: int) -> int:
        """Keys passed to attention for a cache of ``end`` entries: ``end`` rounded up to ``key_align``."""
        return -(-end // self.key_align) * self.key_align


def _chain_tokens(length: int, vocab_size: int) -> list[int]:
    """A fixed synthetic token chain (no tokenizer needed; deterministic, spread over the vocabulary)."""
    return [(7919 * i + 13) % vocab_size for i in range(length)]


def _chunk_sizes(max_rows: int) -> list[int]:
    """Every size in [1, max_rows], interleaved large/small so chunks start at many offsets."""
    sizes, low, high = [], 1, max_rows
    while low <= high:
        sizes.append(high)
        if low != high:
            sizes.append(low)
        low, high = low + 1, high - 1
    return sizes


def _tree_round(runner, tokens: list[int], first: int, size: int, vocab_size: int) -> tuple[torch.Tensor, int]:
    """Score ``size`` tree nodes after ``runner.length`` cached entries: the chain's next tokens as a
    path, each followed by a decoy sibling, so the path's keys are not contiguous in the cache; then
    keep the path (a commit). Returns (the path's logits rows, path length)."""
    base = runner.length
    depth = (size + 1) // 2
    node_tokens, node_positions, ancestors = [], [], []
    path: list[int] = []
    for step in range(depth):
        for decoy in (False, True):
            if decoy and len(node_tokens) == size:
                break
            token = tokens[first + step]
            node_tokens.append((token + 1) % vocab_size if decoy else token)
            node_positions.append(first + step)
            ancestors.append(path + [len(node_tokens) - 1])
        path.append(2 * step)
    allowed = torch.zeros(size, base + size, dtype=torch.bool)
    allowed[:, :base] = True
    for row, nodes in enumerate(ancestors):
        allowed[row, [base + node for node in nodes]] = True
    rows = runner.forward(node_tokens, node_positions, allowed, keep=size)
    runner.keep_entries(base, [base + node for node in path])
    return rows[path], depth


@torch.no_grad()
def rows_invariant(runner, shape: RowShape, vocab_size: int, prefix_len: int | None = None) -> bool:
    """Whether ``runner`` with ``shape`` gives bit-identical logits rows for a synthetic token chain
    decoded plainly (one token per forward, padded to min_rows) and (a) in chained chunks of every
    size in [1, max_rows], then (b) as token trees of every size in [2, max_rows] whose path nodes
    are interleaved with decoy siblings (so the path's keys are not contiguous in the cache, as in
    a draft tree), each tree's path kept like a commit.

    The chain starts after a prefill of ``prefix_len`` tokens (default: 3 before the larger of
    key_align and the KV buffers' initial capacity), so the decode crosses a key-alignment boundary
    and a buffer growth; rows are compared with ``torch.equal`` (bitwise, NaN never equal).
    """
    sizes = _chunk_sizes(shape.max_rows)
    tree_sizes = [size for size in sizes if size > 1]
    if prefix_len is None:  # cross a key-alignment boundary and the KV buffers' first growth
        prefix_len = max(shape.key_align, runner.kv.min_capacity) - 3
    total = prefix_len + sum(sizes) + sum((size + 1) // 2 for size in tree_sizes)
    tokens = _chain_tokens(total, vocab_size)
    previous = runner.row_shape
    runner.row_shape = shape
    try:
        runner.reset()
        runner.forward(tokens[:prefix_len], list(range(prefix_len)), None, keep=1)
        grouped, start = [], prefix_len
        for size in sizes:
            grouped.append(runner.forward(tokens[start:start + size], list(range(start, start + size)), None, keep=size))
            start += size
        for size in tree_sizes:
            rows, depth = _tree_round(runner, tokens, start, size, vocab_size)
            grouped.append(rows)
            start += depth
        grouped = torch.cat(grouped)
        runner.reset()
        runner.forward(tokens[:prefix_len], list(range(prefix_len)), None, keep=1)
        for row, position in enumerate(range(prefix_len, total)):
            plain = runner.forward([tokens[position]], [position], None, keep=1)
            if not torch.equal(plain[0], grouped[row]):
                return False
        return True
    finally:
        runner.row_shape = previous
        runner.reset()


def probe_row_shape(runner, vocab_size: int, candidates=CANDIDATES, key_align: int = KEY_ALIGN) -> RowShape | None:
    """The first of ``candidates`` (min_rows, max_rows) whose rows ``rows_invariant`` finds identical,
    or None if none is."""
    for min_rows, max_rows in candidates:
        shape = RowShape(min_rows, max_rows, key_align)
        if rows_invariant(runner, shape, vocab_size):
            return shape
    return None


def _cpu_signature() -> str:
    """CPU model name and flags (they choose the GEMM kernels); the platform string elsewhere."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "flags", "Features", "CPU part") and key not in fields:
            fields[key] = value.strip()
    return json.dumps(fields, sort_keys=True)


def probe_key(runner) -> str:
    """What determines the kernels a forward runs: CPU, torch, dtype, device, threads, the model's
    layer shapes and whether weights are prepacked. A hex digest, the cache file's name."""
    config = runner.model.config
    shapes = [runner.num_heads, runner.num_kv_heads, runner.head_dim, len(runner.layers),
              int(config.hidden_size), int(config.intermediate_size), int(config.vocab_size)]
    parts = [_cpu_signature(), torch.__version__, str(runner.param.dtype), str(runner.param.device),
             str(torch.get_num_threads()), json.dumps(shapes), str(runner.prepacked), str(PROBE_VERSION)]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]


def _cache_file(runner) -> Path:
    from verispec.models.loading import cache_root

    return cache_root() / "row-shapes" / f"{probe_key(runner)}.json"


def invariant_row_shape(runner, vocab_size: int, use_cache: bool = True) -> RowShape:
    """The measured invariant RowShape for this runner's model, dtype, CPU and threads: read from the
    on-disk cache (``cache_root()/row-shapes``) or probed once and saved. Raises ConfigError when no
    candidate gives identical rows."""
    path = _cache_file(runner)
    cached = _read_cache(path) if use_cache else None
    if cached is not None:
        shape = cached[0]
        if shape is None:
            _refuse(runner)
        return shape
    shape = probe_row_shape(runner, vocab_size)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        record = {"shape": None if shape is None else asdict(shape), "candidates": [list(c) for c in CANDIDATES]}
        temporary = path.with_suffix(f".{id(runner)}.tmp")
        temporary.write_text(json.dumps(record))
        temporary.replace(path)  # atomic: a concurrent reader sees the old file or the whole new one
    if shape is None:
        _refuse(runner)
    return shape


def _read_cache(path: Path) -> tuple[RowShape | None] | None:
    """(the cached probe result,) or None when there is no usable cache file (absent or damaged:
    then the caller probes again and overwrites it)."""
    try:
        record = json.loads(path.read_text())
        return (None if record["shape"] is None else RowShape(**record["shape"]),)
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _refuse(runner) -> None:
    raise ConfigError(
        f"batch-invariant mode: no row shape of {[list(c) for c in CANDIDATES]} (min rows, max rows) gives "
        f"bit-identical rows for this model in {runner.param.dtype} with {torch.get_num_threads()} threads on this "
        "CPU; run without it, or use --dtype fp32 (its batch variance is ~1e-5 of a logit)"
    )

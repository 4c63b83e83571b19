"""``verispec bench --batch-size 1,2,4,8``: speculative against plain batched decoding, by batch size.

For every dataset x temperature x batch size B, the prompts are decoded in groups of B (prompt i
with the next B - 1, cyclically, so every B decodes every prompt equally often) with
``generate_batch``: once by plain batched decoding (``ar``: one token per sequence and forward)
and once by every method of the sweep, configurations alternating per group (the order rotates
from group to group) so load drifts of a shared machine hit them alike. Each (B, configuration)
has its own decoder, all starting alike (the token trees learn from every prompt they decode).
Prompt i decodes with seed ``seed * 1_000_000 + i`` in every configuration.

Per row: total tokens/s (all tokens of all groups over their wall time), mean tokens/s of one
sequence (its tokens over the time until it finished), block efficiency (tokens per target
forward the sequence took part in), and the speedup of total tokens/s over plain batched
decoding of the same B: the seed table "speedup by scenario and batch size" on this pair.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from verispec.bench.metrics import BASELINE
from verispec.bench.report import Table, _json_safe, fmt, markdown_table
from verispec.bench.runner import WARMUP_TOKENS, Sweep, prompt_seed
from verispec.errors import ConfigError

MAX_BATCH_SIZE = 256


def parse_batch_sizes(text: str) -> list[int]:
    """``--batch-size`` as a list of distinct sizes >= 1, e.g. "1,2,4,8"."""
    sizes = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= MAX_BATCH_SIZE:
            raise ConfigError(f"--batch-size takes whole numbers in [1, {MAX_BATCH_SIZE}] separated by commas, e.g. 1,2,4,8; "
                              f"got {text!r}")
        if int(part) not in sizes:
            sizes.append(int(part))
    return sizes


@dataclass
class BatchRow:
    """One configuration at one batch size on one dataset and temperature (seeds pooled)."""

    dataset: str
    temperature: float
    batch_size: int
    config: str
    sequences: int
    tokens: int
    seconds: float
    tokens_per_second: float
    tokens_per_second_per_sequence: float
    block_efficiency: float
    speedup: float  # total tokens/s over plain batched decoding's at the same batch size


@dataclass
class _Totals:
    tokens: int = 0
    seconds: float = 0.0
    calls: int = 0
    sequence_rates: list | None = None

    def add(self, outputs, seconds: float) -> None:
        self.tokens += sum(o.new_tokens for o in outputs)
        self.calls += sum(o.target_calls for o in outputs)
        self.seconds += seconds
        self.sequence_rates = (self.sequence_rates or []) + [o.tokens_per_second for o in outputs]


def groups(count: int, size: int) -> list[list[int]]:
    """Prompt indices decoded together: groups of ``size`` starting every ``size`` prompts (cyclic)."""
    return [[(first + j) % count for j in range(size)] for first in range(0, count, size)]


class BatchSweep:
    """The batch-size sweep of one ``BenchConfig`` (methods x K x L of the config's first values
    of temperature-independent settings; every temperature and seed)."""

    def __init__(self, sweep: Sweep, batch_sizes: list[int]):
        self.sweep = sweep
        self.batch_sizes = batch_sizes
        self.specs = list(sweep.specs)

    def _decoders(self, temperature: float) -> dict[str, object]:
        sweep = self.sweep
        decoders = {BASELINE: sweep._decoder(BASELINE, temperature=temperature)}
        for spec in self.specs:
            decoder = sweep._decoder(spec.method, spec.num_drafts, spec.draft_len, temperature)
            # token trees size themselves: K and L mean nothing there
            tree = getattr(decoder.drafter, "deterministic", False)
            decoders[f"{spec.method} (token trees)" if tree else f"{spec.method}-K{spec.num_drafts}-L{spec.draft_len}"] = decoder
        return decoders

    def run(self, progress=None) -> list[BatchRow]:
        config = self.sweep.config
        rows = []
        for dataset in self.sweep.datasets:
            prompts = self.sweep.encode(dataset)
            for temperature in config.temperatures:
                for size in self.batch_sizes:
                    decoders = self._decoders(temperature)
                    if config.warmup:  # first-call allocations (the slotted KV cache) out of the timings
                        for decoder in decoders.values():
                            decoder.generate_batch(prompts[:size], max_new_tokens=min(WARMUP_TOKENS, config.max_new_tokens),
                                                   max_batch=size)
                    totals = {name: _Totals() for name in decoders}
                    names = list(decoders)
                    turn = 0
                    for seed in config.seeds:
                        for group in groups(len(prompts), size):
                            order = names[turn % len(names):] + names[: turn % len(names)]
                            turn += 1
                            batch = [prompts[i] for i in group]
                            seeds = [prompt_seed(seed, i) for i in group]
                            for name in order:
                                tic = time.perf_counter()
                                outputs = decoders[name].generate_batch(batch, seeds=seeds, max_batch=size)
                                failed = [(i, o.error) for i, o in zip(group, outputs) if o.error is not None]
                                if failed:  # a prompt the pair cannot decode (too long, ...): no number would mean anything
                                    raise ConfigError(f"prompt {failed[0][0]} of {dataset.name} cannot be decoded: {failed[0][1]}")
                                totals[name].add(outputs, time.perf_counter() - tic)
                                if progress is not None:
                                    progress(len(batch))
                    rows += self._rows(dataset.name, temperature, size, totals)
        return rows

    @staticmethod
    def _rows(dataset: str, temperature: float, size: int, totals: dict[str, _Totals]) -> list[BatchRow]:
        plain = totals[BASELINE]
        plain_rate = plain.tokens / plain.seconds if plain.tokens and plain.seconds else float("nan")
        rows = []
        for name, total in totals.items():
            rate = total.tokens / total.seconds if total.seconds else float("nan")
            rows.append(BatchRow(
                dataset, temperature, size, name, len(total.sequence_rates or []), total.tokens, total.seconds, rate,
                statistics.mean(total.sequence_rates) if total.sequence_rates else float("nan"),
                total.tokens / total.calls if total.calls else float("nan"), rate / plain_rate,
            ))
        return rows


def batch_table(rows: list[BatchRow]) -> Table:
    header = ["dataset", "T", "B", "config", "tok/s total", "tok/s per seq", "BE", "speedup vs plain same B"]
    cells = [
        [r.dataset, f"{r.temperature:g}", str(r.batch_size), r.config, fmt(r.tokens_per_second, 1),
         fmt(r.tokens_per_second_per_sequence, 1), fmt(r.block_efficiency), f"{fmt(r.speedup)}x"]
        for r in rows
    ]
    note = ("plain = ar (one token per sequence per batched forward); one process, configurations alternating per "
            "group of B prompts; wall-clock times, so a loaded machine moves absolute rates (compare within a B)")
    return Table("Speedup by batch size", header, cells, note)


def write_batch_reports(out_dir, rows: list[BatchRow], meta: dict) -> dict[str, Path]:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "batch_summary.json", "markdown": out / "batch_summary.md"}
    paths["json"].write_text(json.dumps(_json_safe({"meta": meta, "rows": [asdict(r) for r in rows]}), indent=1))
    meta_lines = [f"- {key}: {value}" for key, value in meta.items()]
    paths["markdown"].write_text("\n".join(["# verispec bench --batch-size", "", *meta_lines, "", markdown_table(batch_table(rows))]) + "\n")
    return paths


def batch_meta(config, batch_sizes: list[int]) -> dict:
    import torch

    return {
        "date": time.strftime("%Y-%m-%d %H:%M"), "cpu": platform.processor() or platform.machine(),
        "threads": torch.get_num_threads(), "dtype": config.dtype, "batch_sizes": batch_sizes,
        "max_new_tokens": config.max_new_tokens, "limit": config.limit, "seeds": config.seeds,
    }

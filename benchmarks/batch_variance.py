"""Batch variance on the real default target: how often does a draw flip because a row was
scored inside a k-token tree forward instead of alone? And how many seeded texts equal plain
sampling's (docs/drafter-invariance.md)?

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/batch_variance.py flips \\
        [--dtype fp32 bf16] [--prompts 10] [--tokens 96] [--chunks 4 16 32] [--json FILE]
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/batch_variance.py identical \\
        [--dtype fp32] [--prompts 20] [--tokens 128] [--drafts tree ngram head] [--heldout] \\
        [--invariant off on] [--json FILE]

Prompts: the first turns of Spec-Bench (/work/shared/data/spec_bench/question.jsonl, or --data)
whose question_id is NOT divisible by 5 (those are held out for evaluation), in file order
(--offset skips the first ones); with --heldout, those divisible by 5 instead (the evaluation
prompts: this measures, it tunes nothing).

flips: per prompt, plain decoding scores each token alone (a 1-token forward over the KV cache)
and draws it: greedy (argmax) and seeded Gumbel at T = 0.8 (seed = the prompt's index in that list, noise
at the token's absolute position, exactly as ``--method ar``). The same continuation is then
scored again in chains of k tokens (one forward scores k rows: the pending root and k - 1
known tokens, then all k are committed), and each row's draw is repeated with the same noise.
A flip is a position whose draw differs; its gap is how far apart the two tokens' scores were
in the row scored alone (greedy: the logit difference; Gumbel: (log p + G) difference).
Reported per dtype x draw x k: flips per 1,000 tokens, the gaps, and the largest |logit
difference| between the two scorings of a row (median and max over rows).

identical: per prompt, ``--method ar`` and each draft's default rule (token trees + qfree;
n-gram + gumbel; the shipped draft head + gumbel, "head") with the same seed at T = 0.8: are the token ids identical? At a mismatch, the
first differing position's gap (as above) in the row re-scored after a prefill of the common
prefix (an estimate of plain decoding's own row, whose KV entries came from 1-token forwards): a
batch-variance flip when that gap is of the size of the row differences measured by ``flips``.
``--invariant on``: every decoder (ar included) and the re-scoring adapter run the batch-invariant
row shape measured for this machine (``models.row_shape``).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch

from verispec.bench.datasets import spec_bench_prompts
from verispec.core.noise import GumbelNoise, gumbel_argmax
from verispec.core.rows import LogitRows
from verispec.core.sampling import SamplingParams
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.invariance import enable_batch_invariance
from verispec.models.default import encode_prompt, load_default_target
from verispec.models.hf import HFModelAdapter

DATA = Path("/work/shared/data/spec_bench/question.jsonl")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TEMPERATURE = 0.8
DRAWS = {"greedy": SamplingParams(0.0), "gumbel-T0.8": SamplingParams(TEMPERATURE)}


@dataclass
class FlipRecord:
    dtype: str
    draw: str
    chunk: int
    tokens: int
    flips: int
    flips_per_1000: float
    gaps: list[float] = field(default_factory=list)
    row_diff_median: float = 0.0
    row_diff_max: float = 0.0


def non_held_out_prompts(path: Path, count: int, offset: int = 0, heldout: bool = False):
    """Spec-Bench first turns whose id is not divisible by 5 (``heldout``: whose id is), in file
    order: ``count`` of them after the first ``offset``."""
    prompts = [p for p in spec_bench_prompts(path) if (int(p.prompt_id) % 5 == 0) == heldout]
    return prompts[offset : offset + count]


def _draw(logits: torch.Tensor, params: SamplingParams, noise: GumbelNoise, position: int) -> int:
    rows = LogitRows(logits, params)
    return gumbel_argmax(rows, 0, noise, position)


def _gap(logits: torch.Tensor, params: SamplingParams, noise: GumbelNoise, position: int, a: int, b: int) -> float:
    """Score of token a minus score of token b in the row ``logits`` (1, V)."""
    row = logits[0].double()
    if params.greedy:
        return float(row[a] - row[b])
    log_p = torch.log_softmax(row / params.temperature, dim=-1).numpy()
    g = noise.gumbel(position, np.array([a, b]))
    return float(log_p[a] + g[0] - log_p[b] - g[1])


@torch.no_grad()
def alone_pass(adapter: HFModelAdapter, prompt: list[int], tokens: int, params, noise):
    """Plain decoding, each row scored alone: (tokens drawn, their (1, V) logits)."""
    adapter.reset(prompt)
    drawn, rows = [], []
    for index in range(tokens):
        logits = adapter.score([-1], [-1]).float().cpu()
        token = _draw(logits, params, noise, len(prompt) + index)
        adapter.commit([], token)
        drawn.append(token)
        rows.append(logits)
    return drawn, rows


@torch.no_grad()
def chunk_pass(adapter: HFModelAdapter, prompt: list[int], drawn: list[int], chunk: int):
    """The same continuation scored in chains of ``chunk`` rows per forward: (len(drawn), V) logits."""
    adapter.reset(prompt)
    rows, start = [], 0
    while start < len(drawn):
        size = min(chunk, len(drawn) - start)
        known = drawn[start : start + size - 1]
        logits = adapter.score([-1, *known], [-1, *range(size - 1)]).float().cpu()
        rows.append(logits)
        adapter.commit(list(range(1, size)), drawn[start + size - 1])
        start += size
    return torch.cat(rows)


def measure_flips(args) -> list[FlipRecord]:
    prompts = non_held_out_prompts(args.data, args.prompts, args.offset)
    records = []
    for dtype_name in args.dtype:
        model, tokenizer = load_default_target(DTYPES[dtype_name])
        adapter = HFModelAdapter(model)
        for draw_name, params in DRAWS.items():
            per_chunk = {k: FlipRecord(dtype_name, draw_name, k, 0, 0, 0.0) for k in args.chunks}
            diffs = {k: [] for k in args.chunks}
            for index, prompt in enumerate(prompts):
                ids = encode_prompt(tokenizer, prompt.text)
                noise = GumbelNoise(args.offset + index)
                drawn, alone = alone_pass(adapter, ids, args.tokens, params, noise)
                for k in args.chunks:
                    chunked = chunk_pass(adapter, ids, drawn, k)
                    record = per_chunk[k]
                    for offset, (row, token) in enumerate(zip(alone, drawn)):
                        position = len(ids) + offset
                        other = _draw(chunked[offset : offset + 1], params, noise, position)
                        diffs[k].append(float((chunked[offset] - row[0]).abs().max()))
                        record.tokens += 1
                        if other != token:
                            record.flips += 1
                            record.gaps.append(_gap(row, params, noise, position, token, other))
                print(f"{dtype_name} {draw_name} prompt {prompt.prompt_id}: "
                      + ", ".join(f"k={k} flips {per_chunk[k].flips}/{per_chunk[k].tokens}" for k in args.chunks), flush=True)
            for k, record in per_chunk.items():
                record.flips_per_1000 = 1000.0 * record.flips / max(record.tokens, 1)
                record.row_diff_median = float(np.median(diffs[k]))
                record.row_diff_max = float(np.max(diffs[k]))
                records.append(record)
    return records


def measure_identical(args) -> list[dict]:
    prompts = non_held_out_prompts(args.data, args.prompts, args.offset, args.heldout)
    results = []
    for dtype_name in args.dtype:
        model, tokenizer = load_default_target(DTYPES[dtype_name])
        for invariant in args.invariant:
            results += identical_runs(args, model, tokenizer, prompts, dtype_name, invariant == "on")
    return results


def identical_runs(args, model, tokenizer, prompts, dtype_name: str, invariant: bool) -> list[dict]:
    """The ``identical`` rows of one dtype, with or without the batch-invariant mode (``--method ar``
    then uses it too: both must run the same row shapes to be comparable)."""
    results = []
    common = dict(tokenizer=tokenizer, temperature=TEMPERATURE, max_new_tokens=args.tokens, eos_token_id=[],
                  seed=args.seed, batch_invariant=invariant)
    plain = SpeculativeDecoder(model, None, method="ar", **common)
    decoders = {draft: SpeculativeDecoder(model, None if draft == "tree" else draft, **common) for draft in args.drafts}
    adapter = HFModelAdapter(model)
    if invariant:
        enable_batch_invariance(adapter)
        print(f"{dtype_name}: batch-invariant row shape {plain.row_shape}", flush=True)
    params = SamplingParams(TEMPERATURE)
    for prompt in prompts:
        ids = encode_prompt(tokenizer, prompt.text)
        reference = plain.generate(ids).token_ids
        for draft, decoder in decoders.items():
            output = decoder.generate(ids)
            row = {"dtype": dtype_name, "invariant": invariant, "prompt_id": prompt.prompt_id, "category": prompt.category, "draft": draft,
                   "method": output.method, "identical": output.token_ids == reference,
                   "block_efficiency": output.block_efficiency}
            if not row["identical"]:
                first = next(i for i, (a, b) in enumerate(zip(output.token_ids, reference)) if a != b)
                with torch.no_grad():
                    adapter.reset(ids + reference[:first])
                    logits = adapter.score([-1], [-1]).float().cpu()
                row.update(first_mismatch=first, gap=_gap(logits, params, GumbelNoise(args.seed), len(ids) + first,
                                                         reference[first], output.token_ids[first]))
            results.append(row)
            print(json.dumps(row), flush=True)
    for draft in args.drafts:
        rows = [r for r in results if r["draft"] == draft]
        mode = "batch-invariant" if invariant else "default shapes"
        print(f"{dtype_name} {mode} {draft}: {sum(r['identical'] for r in rows)} of {len(rows)} identical to --method ar", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=["flips", "identical"])
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["fp32"])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--offset", type=int, default=0, help="skip this many prompts (to extend an earlier run)")
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--chunks", type=int, nargs="+", default=[4, 16, 32])
    parser.add_argument("--drafts", nargs="+", default=["tree", "ngram"], choices=["tree", "ngram", "head"])
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--invariant", nargs="+", choices=["off", "on"], default=["off"],
                        help="'identical' without and/or with the batch-invariant mode (ar and the drafts alike)")
    parser.add_argument("--heldout", action="store_true", help="held-out prompts (ids divisible by 5) for 'identical'")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    start = time.perf_counter()
    if args.mode == "flips":
        records = [asdict(r) for r in measure_flips(args)]
        for r in records:
            gaps = ", ".join(f"{g:.2e}" for g in r["gaps"]) or "-"
            print(f"{r['dtype']} {r['draw']:12s} k={r['chunk']:2d}: {r['flips']} flips / {r['tokens']} tokens "
                  f"= {r['flips_per_1000']:.2f} per 1000; gaps [{gaps}]; |dlogit| median {r['row_diff_median']:.2e} "
                  f"max {r['row_diff_max']:.2e}")
    else:
        records = measure_identical(args)
    meta = {"mode": args.mode, "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "seconds": time.perf_counter() - start}
    print(json.dumps(meta))
    if args.json:
        args.json.write_text(json.dumps({"meta": meta, "records": records}, indent=1))


if __name__ == "__main__":
    main()

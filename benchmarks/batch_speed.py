"""Batched decoding speed: plain and speculative, by batch size, interleaved in one process.

    python benchmarks/batch_speed.py [--batch-sizes 1,2,4] [--prompts 0-3] [--tokens 32]
                                     [--repeats 3] [--threads 1] [--dtype auto]

For every batch size B, the HumanEval prompts are split into groups of B (prompt i goes with the
next B - 1, cyclically, so every B decodes the same prompts) and each group is decoded greedily by
    plain     ``generate_batch`` with method "ar" (plain batched decoding)
    default   ``generate_batch`` with the default draft (token trees + q-free)
and, at B = 1, by ``generate`` itself (today's single-sequence path). Configurations alternate
per group (their order rotates every repeat), so load drifts hit them alike. Printed per B:
total tokens/s (all tokens of all groups / their wall time), mean tokens/s per sequence, block
efficiency, the speedup of default over plain of the same B, and the total throughput relative
to ``generate`` of one sequence alone: medians over repeats with [min, max].
Greedy outputs are checked against ``generate``'s (differences = float batch-variance flips).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from verispec.cli.generate import DTYPES


def parse_range(text: str) -> list[int]:
    start, _, end = text.partition("-")
    return list(range(int(start), int(end or start) + 1))


def groups(count: int, size: int) -> list[list[int]]:
    """Prompt indices in groups of ``size``: the prompts decoded together (cyclic wrap-around)."""
    return [[(first + j) % count for j in range(size)] for first in range(0, count, size)]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--prompts", default="0-3", help="HumanEval task ids, e.g. 0-3")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="auto", choices=list(DTYPES))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from verispec.bench.datasets import humaneval_prompts
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt, load_default_target

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    ids = parse_range(args.prompts)
    model, tokenizer = load_default_target(DTYPES[args.dtype])
    tasks = humaneval_prompts(limit=max(ids) + 1)
    prompts = [encode_prompt(tokenizer, tasks[i].text) for i in ids]
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    plain = SpeculativeDecoder(model, method="ar", **common)
    default = SpeculativeDecoder(model, **common)
    default.generate(prompts[0])  # warm-up: measures the token trees' cost curve once, as generate does
    reference = [default.generate(p).token_ids for p in prompts]

    configs = {"plain": plain, "default": default}
    # (B, config) -> per repeat: (total tokens, wall seconds, [per-sequence tok/s], [block efficiency])
    results: dict[tuple[int, str], list[tuple[int, float, list[float], list[float]]]] = {}
    mismatches = checked = 0
    for repeat in range(args.repeats):
        for size in sizes:
            names = list(configs) + (["generate"] if size == 1 else [])
            names = names[repeat % len(names):] + names[: repeat % len(names)]
            totals = {name: [0, 0.0, [], []] for name in names}
            for group in groups(len(prompts), size):
                batch = [prompts[i] for i in group]
                for name in names:
                    tic = time.perf_counter()
                    if name == "generate":
                        outputs = [default.generate(batch[0])]
                    else:
                        outputs = configs[name].generate_batch(batch)
                    wall = time.perf_counter() - tic
                    total = totals[name]
                    total[0] += sum(o.new_tokens for o in outputs)
                    total[1] += wall
                    total[2] += [o.new_tokens / o.seconds for o in outputs]
                    total[3] += [o.block_efficiency for o in outputs]
                    mismatches += sum(o.token_ids != reference[i] for o, i in zip(outputs, group))
                    checked += len(outputs)
            for name, total in totals.items():
                results.setdefault((size, name), []).append(tuple(total))

    def spread(values):
        return f"{statistics.median(values):7.2f} [{min(values):.2f}, {max(values):.2f}]"

    solo = [tokens / wall for tokens, wall, _, _ in results[(1, "generate")]]
    print(f"{cpu_name()}, {args.dtype} ({next(model.parameters()).dtype}), {torch.get_num_threads()} thread(s), "
          f"HumanEval {args.prompts}, {args.tokens} tokens, greedy, {args.repeats} repeats, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'B':>2}  {'config':>8}  {'total tok/s':>22}  {'tok/s per seq':>22}  {'BE':>5}  "
          f"{'vs plain same B':>22}  {'total vs generate B=1':>22}")
    for size in sizes:
        for name in ["generate", *configs] if size == 1 else list(configs):
            runs = results[(size, name)]
            total = [tokens / wall for tokens, wall, _, _ in runs]
            per_seq = [statistics.mean(rates) for _, _, rates, _ in runs]
            efficiency = statistics.mean(be for _, _, _, bes in runs for be in bes)
            versus_plain = [t / (p[0] / p[1]) for t, p in zip(total, results[(size, "plain")])]
            versus_solo = [t / s for t, s in zip(total, solo)]
            print(f"{size:>2}  {name:>8}  {spread(total):>22}  {spread(per_seq):>22}  {efficiency:5.2f}  "
                  f"{spread(versus_plain):>22}  {spread(versus_solo):>22}")
    print(f"greedy outputs differing from generate's: {mismatches} of {checked} sequences decoded")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

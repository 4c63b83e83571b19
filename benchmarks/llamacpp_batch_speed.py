"""Batched decoding speed on the llama.cpp backend: B sequences in one context vs one alone.

    python benchmarks/llamacpp_batch_speed.py [--batch-sizes 1,2,4] [--prompts 0-3] [--tokens 32]
                                              [--repeats 3] [--threads 1] [--target default]

The HumanEval prompts are split into groups of B (prompt i with the next B - 1, cyclically, so
every B decodes the same prompts); each group is decoded greedily by
    plain     ``generate_batch`` with method "ar" (one llama_decode per round for the B sequences)
    default   ``generate_batch`` with the default draft (token trees + q-free), sized by the batch budget
and, at B = 1, by ``generate`` itself (plain-1 / default-1: one sequence alone, its own context).
Configurations alternate per prompt (each decodes its group starting there), their order rotating
every repeat. Printed per B: total
tokens/s (all tokens / wall time) and per CPU second of this process, and the total throughput
relative to ``generate`` alone of the same config (plain or default): medians over repeats with
[min, max]. Every batch runs with max_batch = the largest B, so one shared batch context serves
all sizes (creating one costs ~1 s). Greedy outputs are checked against plain ``generate``'s.
"""

from __future__ import annotations

import argparse
import statistics
import time

from batch_speed import (  # the torch batch benchmark's helpers (same folder)
    add_group_arguments, copy_default_decoder, cpu_name, encoded_humaneval, parse_range, plain_and_warm_default,
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_group_arguments(parser)
    parser.add_argument("--target", default="default", help="llama.cpp target: default, gemma3-270m or a .gguf path")
    args = parser.parse_args(argv)
    from verispec.models.llamacpp import load_gguf_tokenizer, load_llamacpp_adapter

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    ids = parse_range(args.prompts)  # the task ids, to name a prompt whose output differs
    tokenizer = load_gguf_tokenizer(args.target)
    target = load_llamacpp_adapter(args.target, n_threads=args.threads)
    prompts = encoded_humaneval(tokenizer, args.prompts)
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    plain, reference, first = plain_and_warm_default(target, common, prompts)

    configs = [(b, name) for b in sizes for name in ("plain", "default")] + [(1, "plain-alone"), (1, "default-alone")]
    decoders = {key: plain if key[1].startswith("plain") else copy_default_decoder(first, target, common) for key in configs}
    widest = max(sizes)
    if widest > 1:  # the shared batch context is created once, outside the timings
        plain.generate_batch(prompts[:2], max_batch=widest, max_new_tokens=1)
    runs: dict[tuple[int, str], list[tuple[int, float, float]]] = {}  # -> per repeat (tokens, wall, cpu)
    mismatches = {key: [0, 0] for key in configs}  # -> [differing, decoded]
    for repeat in range(args.repeats):
        order = configs[repeat % len(configs):] + configs[: repeat % len(configs)]
        totals = {key: [0, 0.0, 0.0] for key in configs}
        for start in range(len(prompts)):  # interleaved by prompt: every config's group starting here, in turn
            for key in order:
                size, name = key
                if start % size:
                    continue
                group = [(start + j) % len(prompts) for j in range(size)]
                batch = [prompts[i] for i in group]
                wall, cpu = time.perf_counter(), time.process_time()
                if name.endswith("-alone"):
                    outputs = [decoders[key].generate(batch[0])]
                else:
                    outputs = decoders[key].generate_batch(batch, max_batch=widest)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                totals[key][0] += sum(o.new_tokens for o in outputs)
                totals[key][1] += wall
                totals[key][2] += cpu
                for o, i in zip(outputs, group):
                    if o.token_ids != reference[i]:
                        mismatches[key][0] += 1
                        first = next((j for j, (a, b) in enumerate(zip(o.token_ids, reference[i])) if a != b), None)
                        print(f"differs: {name} B={size} prompt {ids[i]} from token {first}, stop {o.stop_reason} "
                              f"{o.error or ''}", flush=True)
                mismatches[key][1] += len(outputs)
        for key, total in totals.items():
            runs.setdefault(key, []).append(tuple(total))

    def spread(values):
        return f"{statistics.median(values):6.2f} [{min(values):.2f}, {max(values):.2f}]"

    print(f"{cpu_name()}, llama.cpp {target.path.name}, {args.threads} thread(s), HumanEval {args.prompts}, "
          f"{args.tokens} tokens, greedy, {args.repeats} repeats, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'B':>2}  {'config':>13}  " + "  ".join(f"{c:>21}" for c in ("total tok/s", "total tok/cpu-s", "vs alone (wall)", "vs alone (cpu)")))
    for key in configs:
        series, alone = runs[key], runs[(1, key[1].split("-")[0] + "-alone")]
        cells = [
            [t / w for t, w, _ in series],
            [t / c for t, _, c in series],
            [(t / w) / (ta / wa) for (t, w, _), (ta, wa, _) in zip(series, alone)],
            [(t / c) / (ta / ca) for (t, _, c), (ta, _, ca) in zip(series, alone)],
        ]
        print(f"{key[0]:>2}  {key[1]:>13}  " + "  ".join(f"{spread(c):>21}" for c in cells))
    print("greedy outputs differing from plain generate's: "
          + ", ".join(f"{name}-{size} {bad} of {total}" for (size, name), (bad, total) in mismatches.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

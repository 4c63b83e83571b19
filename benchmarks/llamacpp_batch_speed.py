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
import copy
import statistics
import time

from batch_speed import cpu_name, parse_range  # the torch batch benchmark's helpers (same folder)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--prompts", default="0-3", help="HumanEval task ids, e.g. 0-3")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target", default="default", help="llama.cpp target: default, gemma3-270m or a .gguf path")
    args = parser.parse_args(argv)
    from verispec.bench.datasets import humaneval_prompts
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt
    from verispec.models.llamacpp import load_gguf_tokenizer, load_llamacpp_adapter

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    ids = parse_range(args.prompts)
    tokenizer = load_gguf_tokenizer(args.target)
    target = load_llamacpp_adapter(args.target, n_threads=args.threads)
    tasks = humaneval_prompts(limit=max(ids) + 1)
    prompts = [encode_prompt(tokenizer, tasks[i].text) for i in ids]
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    plain = SpeculativeDecoder(target, method="ar", **common)
    reference = [plain.generate(p).token_ids for p in prompts]
    first = SpeculativeDecoder(target, **common)
    first.generate(prompts[0])  # the token trees' cost curve, measured once

    def fresh_default() -> SpeculativeDecoder:
        """A default decoder in ``first``'s state: every (config, B) learns from the same prompts alike."""
        decoder = SpeculativeDecoder(target, **common)
        decoder.drafter.cost = first.drafter.cost
        decoder.drafter.adjacency = copy.deepcopy(first.drafter.adjacency)
        decoder.drafter.estimates = copy.deepcopy(first.drafter.estimates)
        return decoder

    configs = [(b, name) for b in sizes for name in ("plain", "default")] + [(1, "plain-alone"), (1, "default-alone")]
    decoders = {key: plain if key[1].startswith("plain") else fresh_default() for key in configs}
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

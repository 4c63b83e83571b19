"""Target-aware token trees (the default draft) beside plain decoding and transformers' prompt lookup.

Usage:
    python benchmarks/token_tree_speed.py [--dataset humaneval|specbench] [--start 0] [--limit 40]
        [--max-new-tokens 128] [--temperature 0] [--repeats 1] [--dtype auto|fp32|bf16] [--threads 1]
        [--per-category 5] [--json OUT.json]

One process, one copy of the target, torch at --threads threads; for every prompt the three
configurations run back to back, their order rotated between prompts and repeats (A B C, B C A, ...):
    verispec plain   SpeculativeDecoder(method="ar"): one target forward per token
    verispec tree    SpeculativeDecoder(target): the default, token trees + the q-free rule
    hf lookup        model.generate(prompt_lookup_num_tokens=4) (transformers' prompt lookup)
All stop at the tokenizer's EOS or --max-new-tokens. Block efficiency (BE) = new tokens / target
forwards after the prefill (transformers' forwards counted with a forward hook). The tree
decoder measures its target's cost curve once before the timed prompts (a warm-up prompt).

Held-out data: HumanEval 0-39 and Spec-Bench ids divisible by 5 are for evaluation only
(--dataset specbench takes --per-category prompts of ids divisible by 5 from every category).
Tune on HumanEval 40+ (--start 40) instead.

Printed: per prompt and in total, tokens/s of each, BE, the ratios tree / plain and tree / lookup
(total tokens over total seconds), and the tree's time per round split into target forward,
drafting, verification (incl. the adjacency refresh) and the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict

import torch

CONFIGS = ("plain", "tree", "lookup")


from draft_compare import add_run_arguments, load_prompts, run_lookup  # noqa: E402  (one definition of the held-out
# prompt choice, the shared settings and the prompt-lookup run)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser)
    parser.add_argument("--no-lookup", action="store_true", help="leave transformers' prompt lookup out")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)

    from verispec.cli.generate import resolve_dtype
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt, fast_dtype_name, load_default_target
    from verispec.models.hf import HFModelAdapter

    torch.set_num_threads(args.threads)
    dtype_name = fast_dtype_name() if args.dtype == "auto" else args.dtype
    model, tokenizer = load_default_target(resolve_dtype(dtype_name))
    target = HFModelAdapter(model)
    eos = tokenizer.eos_token_id
    common = dict(tokenizer=tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    plain = SpeculativeDecoder(target, None, method="ar", **common)
    tree = SpeculativeDecoder(target, **common)
    warm = encode_prompt(tokenizer, "Write a Python function that adds two numbers.")
    tree.generate(warm)  # first readings of the online cost model; first-call allocations stay out of the numbers
    plain.generate(warm)
    configs = [c for c in CONFIGS if not (args.no_lookup and c == "lookup")]
    if "lookup" in configs:
        run_lookup(model, warm, args, eos)

    prompts = load_prompts(args)
    records = []
    rounds = defaultdict(float)
    costs = tree.cost_model.table(32)  # learned online from the warm-up's rounds
    print(f"# dtype {dtype_name}, threads {args.threads}, T={args.temperature}, {len(prompts)} prompts x "
          f"{args.repeats} repeats, max {args.max_new_tokens} new tokens; round cost (x one token, after warm-up) "
          f"{[(n, round(float(costs[n - 1] / costs[0]), 2)) for n in (1, 4, 8, 16, 32)]}", flush=True)
    for repeat in range(args.repeats):
        for index, (prompt_id, category, text) in enumerate(prompts):
            ids = encode_prompt(tokenizer, text)
            shift = (index + repeat) % len(configs)
            row = {"prompt": prompt_id, "category": category, "repeat": repeat}
            for config in configs[shift:] + configs[:shift]:
                if config == "lookup":
                    row[config] = run_lookup(model, ids, args, eos)
                    continue
                decoder = plain if config == "plain" else tree
                decoder.seed = 1000 * repeat + index
                out = decoder.generate(ids)
                row[config] = {"tokens": out.new_tokens, "seconds": out.seconds, "forwards": out.target_calls}
                if config == "tree":
                    parts = out.time_breakdown()
                    for part, seconds in parts.items():
                        rounds[part] += seconds
                    rounds["rounds"] += len(out.steps)
                    rounds["nodes"] += sum(s.tree_nodes for s in out.steps)
                    row[config]["mean_nodes"] = sum(s.tree_nodes for s in out.steps) / max(len(out.steps), 1)
            records.append(row)
            print(f"{prompt_id:20s} {category:14s} " + "  ".join(
                f"{c} {row[c]['tokens'] / row[c]['seconds']:6.1f} tok/s BE {row[c]['tokens'] / row[c]['forwards']:.2f}" for c in configs
            ) + f"  tree/plain {(row['tree']['tokens'] / row['tree']['seconds']) / (row['plain']['tokens'] / row['plain']['seconds']):.2f}",
                flush=True)

    def rate(rows, config):
        return sum(r[config]["tokens"] for r in rows) / sum(r[config]["seconds"] for r in rows)

    def be(rows, config):
        return sum(r[config]["tokens"] for r in rows) / sum(r[config]["forwards"] for r in rows)

    def per_prompt_ratio_spread(rows, a, b):
        ratios = [(r[a]["tokens"] / r[a]["seconds"]) / (r[b]["tokens"] / r[b]["seconds"]) for r in rows]
        return min(ratios), statistics.median(ratios), max(ratios)

    groups = {"all": records}
    if args.dataset == "specbench":
        for category in dict.fromkeys(r["category"] for r in records):
            groups[category] = [r for r in records if r["category"] == category]
    print()
    header = "| prompts | plain tok/s | tree tok/s | tree BE | tree / plain (min / median / max per prompt) |"
    if "lookup" in configs:
        header += " lookup tok/s | lookup BE | tree / lookup |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    summary = {}
    for name, rows in groups.items():
        ratio = rate(rows, "tree") / rate(rows, "plain")
        low, mid, high = per_prompt_ratio_spread(rows, "tree", "plain")
        line = (f"| {name} ({len(rows)}) | {rate(rows, 'plain'):.1f} | {rate(rows, 'tree'):.1f} | {be(rows, 'tree'):.2f} | "
                f"{ratio:.2f}x ({low:.2f} / {mid:.2f} / {high:.2f}) |")
        summary[name] = {"plain": rate(rows, "plain"), "tree": rate(rows, "tree"), "tree_be": be(rows, "tree"), "tree_over_plain": ratio}
        if "lookup" in configs:
            line += f" {rate(rows, 'lookup'):.1f} | {be(rows, 'lookup'):.2f} | {rate(rows, 'tree') / rate(rows, 'lookup'):.2f}x |"
            summary[name].update(lookup=rate(rows, "lookup"), lookup_be=be(rows, "lookup"))
        print(line)
    n = max(rounds["rounds"], 1)
    print(f"\ntree rounds: {int(rounds['rounds'])}, mean nodes {rounds['nodes'] / n:.1f}; per round: target forward "
          f"{1000 * rounds['target'] / n:.2f} ms, drafting {1000 * rounds['draft'] / n:.2f} ms, verification + adjacency "
          f"refresh {1000 * rounds['verify'] / n:.2f} ms, other {1000 * rounds['other'] / n:.2f} ms "
          f"(overhead = {100 * (rounds['draft'] + rounds['verify'] + rounds['other']) / max(rounds['target'], 1e-9):.1f}% of the target time)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "dtype": dtype_name, "records": records, "summary": summary,
                       "rounds": dict(rounds)}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Drafts and rules side by side on the default target: plain decoding, the training-free token
trees, the EAGLE-3 head with any rule, per Spec-Bench category and on HumanEval.

Usage:
    python benchmarks/draft_compare.py [--dataset humaneval|specbench] [--start 0] [--limit 40]
        [--per-category 5] [--max-new-tokens 128] [--temperature 0] [--repeats 1] [--threads 1]
        [--dtype auto|fp32|bf16] [--config NAME=DRAFT:METHOD[:K[:L]] ...] [--lookup] [--json OUT.json]

Each --config is one decoder over the same target adapter: DRAFT is "none" (plain decoding, METHOD
"ar"), "tree" (token trees), "ngram", "head" (the shipped head) or a head directory; METHOD any
registry rule; K drafts of length L (chains when K = 1). Default configurations:
    plain=none:ar  tree=tree:qfree  head-sd=head:sd:1:3  head-spectr=head:spectr:2:3
All configurations run back to back for every prompt in one process, their order rotated between
prompts and repeats (A B C D, B C D A, ...), so machine load hits them alike. --lookup adds
transformers' prompt lookup (generate(prompt_lookup_num_tokens=4)).

Held-out data: HumanEval 0-39 and Spec-Bench ids divisible by 5 are evaluation prompts
(--dataset specbench takes --per-category of them per category); tune on HumanEval 40+ (--start 40).

Printed per group (all prompts, each category): tokens/s and block efficiency (BE = new tokens /
target forwards after prefill) of each configuration, the ratio of each to plain (total tokens over
total seconds) with its per-prompt min / median / max, and each configuration's time per round
split into drafting, target forward, verification and the rest.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict

import torch

SPEC_BENCH = "/work/shared/data/spec_bench/question.jsonl"
DEFAULT_CONFIGS = ("plain=none:ar", "tree=tree:qfree", "head-sd=head:sd:1:3", "head-spectr=head:spectr:2:3")


def parse_config(text: str) -> dict:
    name, _, spec = text.partition("=")
    parts = spec.split(":")
    if not name or len(parts) < 2:
        raise SystemExit(f"--config {text!r}: expected NAME=DRAFT:METHOD[:K[:L]]")
    return {"name": name, "draft": parts[0], "method": parts[1],
            "num_drafts": int(parts[2]) if len(parts) > 2 else 1, "draft_len": int(parts[3]) if len(parts) > 3 else 4}


def load_prompts(args):
    from verispec.bench.datasets import humaneval_prompts

    if args.dataset == "humaneval":
        return [(p.prompt_id, "humaneval", p.text) for p in humaneval_prompts(args.limit, offset=args.start)]
    rows = [json.loads(line) for line in open(args.spec_bench)]
    taken: dict[str, int] = defaultdict(int)
    prompts = []
    for row in rows:
        # ids divisible by 5 are held out for evaluation; --tuning takes the others
        held_out = row["question_id"] % 5 == 0
        if held_out != getattr(args, "tuning", False) and taken[row["category"]] < args.per_category:
            taken[row["category"]] += 1
            prompts.append((f"spec-bench/{row['question_id']}", row["category"], row["turns"][0]))
    return prompts


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The prompt choice (what ``load_prompts`` reads) and the decoding settings every prompt-set
    benchmark here shares, with one set of defaults so their runs compare."""
    parser.add_argument("--dataset", default="humaneval", choices=["humaneval", "specbench"])
    parser.add_argument("--spec-bench", default=SPEC_BENCH)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--limit", type=int, default=40)
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--dtype", default="auto", choices=["auto", "fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=1)


def run_lookup(model, ids, args, eos):
    """transformers' prompt lookup (generate(prompt_lookup_num_tokens=4)) on one prompt: new tokens,
    seconds, and target forwards after the prefill (counted by a forward hook held for this call only)."""
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    input_ids = torch.tensor([ids])
    kwargs = dict(do_sample=args.temperature > 0, max_new_tokens=args.max_new_tokens, prompt_lookup_num_tokens=4,
                  eos_token_id=eos, pad_token_id=eos)
    if args.temperature > 0:
        kwargs.update(temperature=args.temperature, top_k=0, top_p=1.0)
    tic = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), **kwargs)
    seconds = time.perf_counter() - tic
    hook.remove()
    return {"tokens": int(out.shape[1] - len(ids)), "seconds": seconds, "forwards": max(len(calls) - 1, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_arguments(parser)
    parser.add_argument("--config", action="append", default=None, help="NAME=DRAFT:METHOD[:K[:L]] (repeatable)")
    parser.add_argument("--lookup", action="store_true", help="add transformers' prompt lookup")
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
    configs = [parse_config(c) for c in (args.config or DEFAULT_CONFIGS)]
    if "plain" not in [c["name"] for c in configs]:
        configs.insert(0, parse_config("plain=none:ar"))
    common = dict(tokenizer=tokenizer, temperature=args.temperature, max_new_tokens=args.max_new_tokens, seed=0)
    decoders = {}
    for config in configs:
        draft = None if config["draft"] == "none" else config["draft"]
        decoders[config["name"]] = SpeculativeDecoder(
            target, draft, method=config["method"], num_drafts=config["num_drafts"], draft_len=config["draft_len"], **common
        )
    names = list(decoders) + (["lookup"] if args.lookup else [])
    warm = encode_prompt(tokenizer, "Write a Python function that adds two numbers.")
    for decoder in decoders.values():  # cost curves, first-call allocations: out of the numbers
        decoder.generate(warm)
    if args.lookup:
        run_lookup(model, warm, args, eos)

    prompts = load_prompts(args)
    records = []
    parts = {name: defaultdict(float) for name in decoders}
    print(f"# dtype {dtype_name}, threads {args.threads}, T={args.temperature}, {len(prompts)} prompts x "
          f"{args.repeats} repeats, max {args.max_new_tokens} new tokens; configs "
          + ", ".join(f"{c['name']}={c['draft']}:{c['method']}:{c['num_drafts']}:{c['draft_len']}" for c in configs), flush=True)
    for repeat in range(args.repeats):
        for index, (prompt_id, category, text) in enumerate(prompts):
            ids = encode_prompt(tokenizer, text)
            shift = (index + repeat) % len(names)
            row = {"prompt": prompt_id, "category": category, "repeat": repeat}
            for name in names[shift:] + names[:shift]:
                if name == "lookup":
                    row[name] = run_lookup(model, ids, args, eos)
                    continue
                decoder = decoders[name]
                decoder.seed = 1000 * repeat + index
                out = decoder.generate(ids)
                row[name] = {"tokens": out.new_tokens, "seconds": out.seconds, "forwards": out.target_calls}
                for part, seconds in out.time_breakdown().items():
                    parts[name][part] += seconds
                parts[name]["rounds"] += len(out.steps)
            records.append(row)
            print(f"{prompt_id:18s} {category:14s} " + "  ".join(
                f"{n} {row[n]['tokens'] / row[n]['seconds']:5.1f}/s BE {row[n]['tokens'] / row[n]['forwards']:.2f}" for n in names
            ), flush=True)

    def rate(rows, name):
        return sum(r[name]["tokens"] for r in rows) / sum(r[name]["seconds"] for r in rows)

    def be(rows, name):
        return sum(r[name]["tokens"] for r in rows) / sum(r[name]["forwards"] for r in rows)

    def spread(rows, name):
        ratios = [(r[name]["tokens"] / r[name]["seconds"]) / (r["plain"]["tokens"] / r["plain"]["seconds"]) for r in rows]
        return min(ratios), statistics.median(ratios), max(ratios)

    groups = {"all": records}
    if args.dataset == "specbench":
        for category in dict.fromkeys(r["category"] for r in records):
            groups[category] = [r for r in records if r["category"] == category]
    others = [n for n in names if n != "plain"]
    print()
    header = "| prompts | plain tok/s | " + " | ".join(f"{n}: tok/s, BE, / plain (min / med / max)" for n in others) + " |"
    print(header)
    print("|" + "---|" * (2 + len(others)))
    summary = {}
    for group, rows in groups.items():
        cells = []
        summary[group] = {"plain": rate(rows, "plain")}
        for name in others:
            low, mid, high = spread(rows, name)
            ratio = rate(rows, name) / rate(rows, "plain")
            cells.append(f"{rate(rows, name):.1f}, {be(rows, name):.2f}, {ratio:.2f}x ({low:.2f} / {mid:.2f} / {high:.2f})")
            summary[group][name] = {"tok_s": rate(rows, name), "be": be(rows, name), "over_plain": ratio,
                                    "per_prompt_min_median_max": [low, mid, high]}
        print(f"| {group} ({len(rows)}) | {rate(rows, 'plain'):.1f} | " + " | ".join(cells) + " |")
    print()
    for name, totals in parts.items():
        n = max(totals["rounds"], 1)
        print(f"{name:12s} {int(totals['rounds'])} rounds; per round ms: draft {1000 * totals['draft'] / n:.2f}, target "
              f"{1000 * totals['target'] / n:.2f}, verify {1000 * totals['verify'] / n:.2f}, other {1000 * totals['other'] / n:.2f}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "dtype": dtype_name, "records": records, "summary": summary,
                       "parts": {k: dict(v) for k, v in parts.items()}}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

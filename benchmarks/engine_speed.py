"""Engine speed on the default pair: plain target sampling vs SD, BV and multi-draft
rules at K = 2, 3, L = 4, 8, temperature 0 and 0.6, on HumanEval prompts, in ONE run so the
ratios are measured side by side. Prints a table and the process's peak memory.

    .venv/bin/python benchmarks/engine_speed.py --prompts 3 --max-new-tokens 48 --dtype fp32 --threads 1
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import torch

from verispec.bench.datasets import humaneval_prompts
from verispec.cli.generate import DTYPES
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError
from verispec.models import BACKENDS
from verispec.models.default import encode_prompt, load_default_target
from verispec.models.hf import HFModelAdapter


def run_config(model, tokenizer, draft, prompts, method, num_drafts, draft_len, temperature, max_new_tokens, seed):
    decoder = SpeculativeDecoder(
        model, None if method == "ar" else draft, tokenizer=tokenizer, method=method, num_drafts=num_drafts,
        draft_len=draft_len, temperature=temperature, max_new_tokens=max_new_tokens, eos_token_id=[], seed=seed,
    )
    tokens = calls = 0
    seconds = 0.0
    for ids in prompts:
        out = decoder.generate(ids)
        tokens += out.new_tokens
        calls += out.target_calls
        seconds += out.seconds
    return {"tokens": tokens, "target_calls": calls, "seconds": seconds, "block_efficiency": tokens / calls, "tokens_per_second": tokens / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--multi", default="spectr,rrsw,traversal,gmpbv", help="multi-draft rules to compare")
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch default)")
    parser.add_argument("--backend", default="auto", choices=BACKENDS,
                        help="adapter runner (models.hf): native Llama forward (auto) or transformers' forward")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    model, tokenizer = load_default_target(DTYPES[args.dtype])
    model = HFModelAdapter(model, backend=args.backend)  # one adapter (and cache) for every configuration
    draft = args.draft
    if draft != "ngram":
        from verispec.models.default import load_model

        draft = HFModelAdapter(load_model(draft, DTYPES[args.dtype])[0], backend=args.backend)
    prompts = [encode_prompt(tokenizer, p.text) for p in humaneval_prompts(args.prompts)]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    configs = []
    for temperature in temperatures:
        configs.append(("ar", 1, 1, temperature))
        for method in ("sd", "bv"):
            configs += [(method, 1, length, temperature) for length in (4, 8)]
        for method in args.multi.split(","):
            configs += [(method, k, length, temperature) for k in (2, 3) for length in (4, 8)]
    run_config(model, tokenizer, draft, prompts[:1], "sd", 1, 4, 0.0, 8, 0)  # warm-up
    rows = []
    baseline = {}
    for method, k, length, temperature in configs:
        start = time.perf_counter()
        try:
            result = run_config(model, tokenizer, draft, prompts, method, k, length, temperature, args.max_new_tokens, args.seed)
        except ConfigError as error:
            print(f"skip {method} K={k} L={length}: {error}")
            continue
        if method == "ar":
            baseline[temperature] = result["tokens_per_second"]
        result.update(method=method, K=k, L=length, temperature=temperature, speedup=result["tokens_per_second"] / baseline[temperature])
        rows.append(result)
        print(
            f"{method:16s} K={k} L={length} T={temperature:<4} BE={result['block_efficiency']:.2f} "
            f"tok/s={result['tokens_per_second']:.1f} speedup={result['speedup']:.2f}x ({time.perf_counter() - start:.0f}s)",
            flush=True,
        )
    peak_gb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2
    print(f"\nrunner: {model.backend}")
    print("\n| method | K | L | T | block efficiency | tokens/s | speedup vs plain |\n|---|---|---|---|---|---|---|")
    for temperature in temperatures:
        subset = [r for r in rows if r["temperature"] == temperature]
        best = max((r for r in subset if r["method"] != "ar"), key=lambda r: r["speedup"], default=None)
        for r in subset:
            mark = "**" if r is best else ""
            print(f"| {mark}{r['method']}{mark} | {r['K']} | {r['L']} | {r['temperature']} | {r['block_efficiency']:.2f} | {r['tokens_per_second']:.1f} | {mark}{r['speedup']:.2f}x{mark} |")
    print(f"\npeak resident memory: {peak_gb:.2f} GB (torch threads: {torch.get_num_threads()}, dtype {args.dtype}, draft {args.draft}, {args.prompts} HumanEval prompts x {args.max_new_tokens} tokens)")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"rows": rows, "peak_gb": peak_gb}, handle, indent=1)


if __name__ == "__main__":
    main()

"""Compare drafts for the default target at T = 0.6 and T = 0 in one process (the target's logits are
computed once per sequence set): the n-gram draft and any number of neural draft directories.

    .venv/bin/python benchmarks/draft_check.py --draft src/verispec/assets/default_draft \
        --sequences RUN/data/eval --json out.json

Sequences: the recorded held-out continuations at T = 0.6 (``--sequences``, distill eval shards) or
fresh ones; at T = 0 the target's greedy continuations of the same prompts. Cost ratios are timed
in alternation with the target (bf16 by default, context ~200 tokens).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from verispec.core.sampling import SamplingParams
from verispec.distill import check
from verispec.distill.data import load_shards
from verispec.models.default import load_model
from verispec.models.default_draft import register

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft", action="append", default=[], help="neural draft directory (repeatable)")
    parser.add_argument("--sequences", required=True, help="held-out eval shards (prompts + T=0.6 target continuations)")
    parser.add_argument("--num-prompts", type=int, default=32)
    parser.add_argument("--greedy-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", default="0.6,0")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    parser.add_argument("--timing-steps", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    register()  # the sub-vocabulary draft architecture (idempotent)
    dtype = DTYPES[args.dtype]

    started = time.perf_counter()
    target, tokenizer = load_model("default", dtype)
    drafts = {path: load_model(path, dtype)[0] for path in args.draft}
    records = load_shards(args.sequences, "*.pt")[: args.num_prompts]
    sampled = [(r["tokens"].tolist(), int(r["prompt_len"])) for r in records]
    vocab = check.model_vocab_size(target)
    results = []
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        if temperature == 0.6:
            sequences = sampled
        else:
            prompts = [tokens[:n] for tokens, n in sampled]
            sequences = check.target_sequences(target, tokenizer, prompts, args.greedy_new_tokens, temperature)
        params = SamplingParams(temperature)
        target_logits = check.sequence_logits(target, sequences)
        context = check.context_for_timing(sequences)
        target_step = check.decode_step_timer(target, params, context)
        candidates = {"ngram": ([check.ngram_probs(vocab, t, n) for t, n in sequences], True,
                                check.ngram_step_timer(vocab, params, context))}
        for path, model in drafts.items():
            candidates[path] = (check.sequence_logits(model, sequences), False, check.decode_step_timer(model, params, context))
        for name, (rows, are_probs, draft_step) in candidates.items():
            alpha = check.alpha_from_logits(target_logits, rows, params, params, rows_are_probs=are_probs)
            cost = check.measure_cost_ratio(target_step, draft_step, args.timing_steps)
            report = check.build_report("default", name, [], params, params, alpha, cost, len(sequences), args.dtype)
            row = report.to_dict()
            results.append(row)
            print(
                f"T={temperature:<4} {name:40s} alpha {row['alpha']:.3f} ± {row['alpha_std_over_sequences']:.3f} "
                f"({row['positions']} pos)  c {row['cost_ratio']:.3f} (target {row['target_ms_per_token']:.1f} ms, "
                f"draft {row['draft_ms_per_token']:.2f} ms)  best L {row['best_L']}  predicted {row['predicted_speedup']:.2f}x  "
                f"{row['verdict']}",
                flush=True,
            )
    print(f"total {time.perf_counter() - started:.0f} s")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=1)


if __name__ == "__main__":
    main()

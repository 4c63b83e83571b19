"""Cost of one EAGLE-3 head draft step relative to one target decode step, per draft-vocabulary size
(the goal: a head step stays <= ~10% of a target forward).

    .venv/bin/python benchmarks/head_vocab_cost.py --draft-vocab 8192,16384,32768 --repeats 3

The heads are randomly initialised at the default target's width (HeadConfig.for_target): a step's
cost does not depend on the weights' values, only on the shapes. Each repeat times, for every
vocabulary size in turn, ``--steps`` target steps and head steps in alternation (A B A B, same
context, ``distill.check.measure_cost_ratio``): the target step is a KV-cached one-token decode
(transformers forward + probabilities over V), the head step the embedding lookup + one midlayer
pass over one entry against the cached context + LM head + q over V (``distill.head_check``).
Printed: the median over repeats of the per-repeat ratio of medians, and its min / max.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from verispec.core.sampling import SamplingParams
from verispec.distill.check import context_for_timing, decode_step_timer, measure_cost_ratio
from verispec.distill.data import encode_truncated, split_prompts
from verispec.distill.head_check import head_step_timer
from verispec.models.default import load_model
from verispec.models.eagle_head import Eagle3Head, HeadConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--draft-vocab", default="8192,16384,32768", help="draft vocabulary sizes (comma-separated)")
    parser.add_argument("--context", type=int, default=200, help="tokens of context (a held-out prompt, repeated)")
    parser.add_argument("--steps", type=int, default=30, help="timed steps per repeat and size")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--dtype", default="fp32", choices=list(DTYPES))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    dtype = DTYPES[args.dtype]
    target, tokenizer = load_model("default", dtype, "cpu")
    prompt = split_prompts("heldout")[0]
    context = context_for_timing([(encode_truncated(tokenizer, prompt.text, args.context), 0)], args.context)
    params = SamplingParams(args.temperature)
    sizes = [int(x) for x in args.draft_vocab.split(",") if x.strip()]
    heads = {}
    for size in sizes:
        torch.manual_seed(0)
        head = Eagle3Head(HeadConfig.for_target(target.config, draft_vocab_size=size), torch.arange(size))
        for p in head.parameters():
            torch.nn.init.normal_(p, std=0.02)
        heads[size] = head.to(dtype).eval()
    results: dict[int, list[dict]] = {size: [] for size in sizes}
    with torch.no_grad():
        for _ in range(args.repeats):
            for size in sizes:
                target_step = decode_step_timer(target, params, context)
                results[size].append(measure_cost_ratio(target_step, head_step_timer(target, heads[size], params, context),
                                                        args.steps))
    print(f"head step / target decode step, {args.dtype}, {args.threads} thread(s), context {len(context)}, "
          f"{args.steps} interleaved steps x {args.repeats} repeats")
    print(f"{'draft vocab':>11} {'c median':>9} {'c min':>7} {'c max':>7} {'head ms':>8} {'target ms':>10}")
    for size in sizes:
        ratios = [r["cost_ratio"] for r in results[size]]
        head_ms = statistics.median(r["draft_ms_per_token"] for r in results[size])
        target_ms = statistics.median(r["target_ms_per_token"] for r in results[size])
        print(f"{size:>11} {statistics.median(ratios):>9.3f} {min(ratios):>7.3f} {max(ratios):>7.3f} "
              f"{head_ms:>8.2f} {target_ms:>10.2f}")


if __name__ == "__main__":
    main()

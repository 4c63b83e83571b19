"""What a round that drafts nothing costs beside a plain decoding step, on the default target.

Usage:
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/root_only_round.py [--prompts 2] [--tokens 48]
        [--temperatures 0,0.6] [--repeats 2]

Two decoders on the same target, run back to back per prompt with the order alternating:
  plain      ``SpeculativeDecoder(method="ar")``
  root-only  the default token-tree decoder with a cost curve under which no tree ever pays
             (``CostCurve(((1, 1.0), (2, 50.0)))``) and no probes: every round is the root alone,
             through the token-tree round (candidate lookup, the policy's bound, adjacency refresh,
             the q-free walk, the estimates' update, the cost model's reading)
Prompts: Spec-Bench qa first turns whose id is NOT divisible by 5 (training prompts). Printed per
temperature: the median over rounds of each decoder's time outside the target forward (drafting,
verification and bookkeeping), its parts for the root-only rounds, and the median target forward.
Times are of this machine at this moment (a shared machine inflates every short interval now and
then, hence medians); compare the two columns of one run only.
"""

from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

SPEC_BENCH = "/work/shared/data/spec_bench/question.jsonl"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from verispec.cli.generate import resolve_dtype
    from verispec.distill.data import split_prompts
    from verispec.draft.tree_policy import CostCurve, ProbeSchedule
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.engine.drafters import TokenTreeDrafter
    from verispec.models.default import encode_prompt, fast_dtype_name, load_default_target

    torch.set_num_threads(1)
    model, tokenizer = load_default_target(resolve_dtype(fast_dtype_name()))
    prompts = [p for p in split_prompts("train", SPEC_BENCH) if p.category == "qa"][: args.prompts]
    print(f"# {len(prompts)} training qa prompts x {args.repeats} repeats x {args.tokens} tokens, 1 thread; "
          f"load average {os.getloadavg()[0]:.1f}")
    for temperature in (float(t) for t in args.temperatures.split(",")):
        overhead = {"plain": [], "root-only": []}
        target, parts = [], []
        for prompt in prompts:
            ids = encode_prompt(tokenizer, prompt.text)
            for repeat in range(args.repeats):
                never = TokenTreeDrafter(model.config.vocab_size, cost=CostCurve(((1, 1.0), (2, 50.0))),
                                         probes=ProbeSchedule(every=10**9))
                decoders = {
                    "plain": SpeculativeDecoder(model, None, tokenizer=tokenizer, method="ar", temperature=temperature,
                                                max_new_tokens=args.tokens),
                    "root-only": SpeculativeDecoder(model, never, tokenizer=tokenizer, temperature=temperature,
                                                    max_new_tokens=args.tokens),
                }
                for name in ("plain", "root-only") if repeat % 2 == 0 else ("root-only", "plain"):
                    for step in decoders[name].generate(ids).steps:
                        if step.tree_nodes != 1:
                            raise SystemExit("a round drafted: the never-paying cost curve did not hold")
                        overhead[name].append(step.draft_seconds + step.verify_seconds + step.other_seconds)
                        target.append(step.target_seconds)
                        if name == "root-only":
                            parts.append((step.draft_seconds, step.verify_seconds, step.other_seconds))
        ms = lambda values: 1e3 * statistics.median(values)  # noqa: E731
        print(f"T = {temperature}: outside the forward, plain {ms(overhead['plain']):.3f} ms, root-only "
              f"{ms(overhead['root-only']):.3f} ms per round (medians over {len(overhead['plain'])} / "
              f"{len(overhead['root-only'])} rounds); root-only parts: propose {ms([p[0] for p in parts]):.3f}, "
              f"refresh + walk {ms([p[1] for p in parts]):.3f}, commit {ms([p[2] for p in parts]):.3f} ms; "
              f"target forward {ms(target):.1f} ms")


if __name__ == "__main__":
    main()

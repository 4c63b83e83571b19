"""Where a batched token-tree round's time goes outside the batched forward, phase by phase.

Usage:
    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/batch_round_phases.py [--prompts 0-7] [--tokens 64]
        [--batch 4] [--repeats 1] [--configs plain,default]

The batched twin of ``round_phases.py``: every prompt in one ``generate_batch`` call with
``max_batch`` B (``batch_speed.py --join``'s setting), greedy, after one untimed warm-up pass; the
default decoder starts from the state ``batch_speed.py`` gives it (one cost curve measured on the
first prompt, that prompt's adjacency table and acceptance estimates). Each phase is timed by
wrapping the function that does it (perf_counter around every call, summed; the sequences run one
at a time, so no two wrapped calls overlap) and printed as microseconds per batched round (one
round = one target flush), all sequences together:
  forward       ``BatchedLlamaRunner.flush`` (the batched forward itself)
    mask          its ``_mask`` + ``_key_bias`` (the padded attention's bias)
  adjacency     ``AdjacencyTable.update`` / ``update_rows`` (top-k of the scored rows)
  roots         ``TokenTreeDrafter._root_candidates`` (copy matches, the root's candidates)
  grow          ``grow_tree``
  split         ``split_scored_tokens`` (the batch budget; it grows the lazy orders it reads)
    order growth  ``BestFirstOrder.grow`` (the trees' growth: in the split, and after it)
    settled       ``_settled`` (the split's stopping test)
  tree mask     ``tree_attention_mask`` (each sequence's own pattern)
  rows + walk   ``LogitRows`` + ``qfree_walk``
  feedback      ``observe_walk`` + the drafter's ``commit`` + the adapter's ``commit``
  round         wall time / rounds
  rest          round - the above (the turns, the engine loops, everything unwrapped)
Wall clock on a shared machine: compare configurations of one run only.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from round_phases import timed  # noqa: E402  (the wrapper that sums a function's seconds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", default="0-7")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--configs", default="plain,default")
    args = parser.parse_args(argv)

    import torch

    import verispec.engine.decoder as decoder_module
    import verispec.engine.drafters as drafters_module
    import verispec.engine.batch as batch_module
    import verispec.draft.tree_policy as policy_module
    import verispec.engine.batch_budget as budget_module
    import verispec.models.hf as hf_module
    from batch_speed import copy_default_decoder, encoded_humaneval, plain_and_warm_default
    from verispec.engine.drafters import TokenTreeDrafter
    from verispec.models.batch_runner import BatchedLlamaRunner
    from verispec.models.default import load_default_target
    from verispec.models.hf import HFModelAdapter
    from verispec.models.token_tree import AdjacencyTable

    torch.set_num_threads(1)
    model, tokenizer = load_default_target(torch.bfloat16)
    prompts = encoded_humaneval(tokenizer, args.prompts)
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    plain, reference, first = plain_and_warm_default(model, common, prompts)

    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    phases = {
        "forward": (BatchedLlamaRunner, "flush"), "mask": (BatchedLlamaRunner, "_mask"),
        "key bias": (BatchedLlamaRunner, "_key_bias"),
        "adjacency": (AdjacencyTable, "update"), "roots": (TokenTreeDrafter, "_root_candidates"),
        "grow": (drafters_module, "grow_tree"), "split": (batch_module, "split_scored_tokens"),
        "order growth": (getattr(policy_module, "BestFirstOrder", None), "grow"), "settled": (budget_module, "_settled"),
        "tree mask": (hf_module, "tree_attention_mask"), "rows": (decoder_module, "LogitRows"),
        "walk": (decoder_module, "qfree_walk"), "observe_walk": (TokenTreeDrafter, "observe_walk"),
        "drafter commit": (TokenTreeDrafter, "commit"), "adapter commit": (HFModelAdapter, "commit"),
    }
    phases["adjacency rows"] = (AdjacencyTable, "update_rows")
    # older code (to compare a commit before these phases existed): 0 for what it lacks
    phases = {key: (holder, name) for key, (holder, name) in phases.items() if hasattr(holder, name)}
    for key, (holder, name) in phases.items():
        timed(holder, name, totals, key)
    flush = BatchedLlamaRunner.flush

    def counting_flush(self):  # a round: a flush with queued forwards
        counts["rounds"] += bool(self._requests)
        return flush(self)

    BatchedLlamaRunner.flush = counting_flush

    names = args.configs.split(",")
    decoders = {name: plain if name == "plain" else copy_default_decoder(first, model, common) for name in names}
    for name in names[1:]:
        decoders[name].target.runner.share_weights_from(first.target.runner)
    per_config = {name: defaultdict(float) for name in names}
    mismatches = dict.fromkeys(names, 0)
    for repeat in range(-1, args.repeats):  # -1 warms up, not counted
        for name in names[repeat % len(names):] + names[: repeat % len(names)]:
            totals.clear()
            counts.clear()
            tic = time.perf_counter()
            outputs = decoders[name].generate_batch(prompts, max_batch=args.batch)
            wall = time.perf_counter() - tic
            if repeat < 0:
                continue
            mismatches[name] += sum(o.token_ids != ref for o, ref in zip(outputs, reference))
            for key, seconds in totals.items():
                per_config[name][key] += seconds
            per_config[name]["round"] += wall
            per_config[name]["rounds"] += counts["rounds"]
            per_config[name]["tokens"] += sum(o.new_tokens for o in outputs)
    keys = [*phases, "round"]
    print(f"# HumanEval {args.prompts}, {args.tokens} tokens, B = {args.batch} (join), greedy, {args.repeats} repeats, "
          f"1 thread; microseconds per batched round (mean); load average {os.getloadavg()[0]:.1f}; "
          f"{time.strftime('%Y-%m-%d %H:%M')}")
    print("| phase | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    for key in keys:
        print(f"| {key} | " + " | ".join(f"{1e6 * per_config[n][key] / max(per_config[n]['rounds'], 1):.0f}" for n in names) + " |")
    inside = ("mask", "key bias", "order growth", "settled")  # inside the forward, or the split
    wrapped = [k for k in phases if k not in inside]
    print("| rest | " + " | ".join(
        f"{1e6 * (per_config[n]['round'] - sum(per_config[n][k] for k in wrapped)) / max(per_config[n]['rounds'], 1):.0f}"
        for n in names) + " |")
    print("| rounds | " + " | ".join(f"{per_config[n]['rounds']:.0f}" for n in names) + " |")
    print("| tokens/s | " + " | ".join(f"{per_config[n]['tokens'] / per_config[n]['round']:.1f}" for n in names) + " |")
    print("| outputs differing from plain | " + " | ".join(str(mismatches[n]) for n in names) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

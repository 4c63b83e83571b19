"""Fit the token trees' acceptance priors on tuning prompts, and replay size rules on their rounds.

Decodes tuning prompts (HumanEval outside 0-39, Spec-Bench ids not divisible by 5: never the
held-out ones) with the default draft, a fresh decoder per prompt (as a new ``verispec generate``
process), recording every round's whole best-first candidate order and, after the run, the path
the q-free walk takes through it given the emitted text (``robustness.hindsight``).

Fit: for every class (source, bucket, rank) the rate at which the walk moved into a candidate of
that class when it reached the candidate's parent, over every offered node (not only the nodes
the policy kept), shrunk toward a fallback with 4 pseudo-trials: rank 0 toward the class's rate
over all ranks (itself shrunk toward the shipped prior), rank r toward rank r - 1 and never above it
(a worse sibling is never likelier). Printed as the ``ACCEPT_PRIOR`` table of
``draft.tree_policy``.

Replay (``--replay``): the recorded rounds re-cut by two size rules over the recorded order and
the cost table the run ended with: the round's own ratio, (1 + cumulative score) / cost, and the
gain over plain decoding, (1 + cumulative score) - cost / cost(1) (``best_prefix``); each against
the hindsight oracle of ``robustness.py`` (the best prefix per round), as modelled tokens per second.

    PYTHONPATH=src OMP_NUM_THREADS=1 python benchmarks/acceptance_priors.py --humaneval 24 --per-category 4 \\
        --temperatures 0,0.6 --replay
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from robustness import hindsight, run_default  # noqa: E402

PSEUDO_TRIALS = 4.0
RANKS = 3


def tuning_prompts(humaneval: int, per_category: int):
    from verispec.distill.data import default_spec_bench_path, split_prompts

    prompts = split_prompts("train", default_spec_bench_path())
    chosen = [p for p in prompts if p.category == "humaneval"][:humaneval]
    by_category = defaultdict(list)
    for prompt in prompts:
        if prompt.category != "humaneval" and len(by_category[prompt.category]) < per_category:
            by_category[prompt.category].append(prompt)
    return chosen + [p for group in by_category.values() for p in group]


def record_rounds(model, tokenizer, prompts, temperature: float, max_new_tokens: int) -> list[dict]:
    """Per prompt: its rounds (offered order, the policy's cut, the hindsight path) and the cost table."""
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    runs = []
    for index, prompt in enumerate(prompts):
        decoder = SpeculativeDecoder(model, tokenizer=tokenizer, temperature=temperature, max_new_tokens=max_new_tokens)
        output, trees, _ = run_default(decoder, encode_prompt(tokenizer, prompt.text), index)
        emitted, position, rounds = output.token_ids, 0, []
        for tree, step in zip(trees, output.steps):
            offered = tree.offered if tree.offered is not None else tree
            rounds.append({"parents": offered.parents, "classes": offered.classes, "scores": offered.scores,
                           "chosen": tree.num_nodes, "path": hindsight(tree, emitted[position:]),
                           "remaining": len(emitted) - position})
            position += step.new_tokens
        table = decoder.cost_model.table(1 + max(len(r["parents"]) for r in rounds)).tolist()
        runs.append({"id": prompt.prompt_id, "rounds": rounds, "table": table})
        print(f"  {prompt.prompt_id:<14} T = {temperature}: {len(rounds)} rounds", file=sys.stderr, flush=True)
    return runs


def trials(runs) -> dict:
    """(source, bucket, rank) -> [trials, hits] over every offered node whose parent the walk reached."""
    counts = defaultdict(lambda: [0, 0])
    for run in runs:
        for r in run["rounds"]:
            if len(r["parents"]) == 1 or r["remaining"] <= 1:  # nothing offered, or no room for a draft token
                continue
            reached = set(r["path"]) | {0}
            for node in range(1, len(r["parents"])):
                if r["parents"][node] in reached:
                    entry = counts[tuple(r["classes"][node])]
                    entry[0] += 1
                    entry[1] += node in reached
    return counts


def fit(counts: dict) -> dict:
    from verispec.draft.tree_policy import ACCEPT_PRIOR

    table = {}
    for source, bucket in sorted({key[:2] for key in ACCEPT_PRIOR}):
        pooled = [sum(counts.get((source, bucket, rank), (0, 0))[i] for rank in range(RANKS)) for i in (0, 1)]
        fallback = (pooled[1] + PSEUDO_TRIALS * ACCEPT_PRIOR[(source, bucket, 0)]) / (pooled[0] + PSEUDO_TRIALS)
        for rank in range(RANKS):
            n, hits = counts.get((source, bucket, rank), (0, 0))
            fallback = min((hits + PSEUDO_TRIALS * fallback) / (n + PSEUDO_TRIALS), fallback)
            table[(source, bucket, rank)] = (round(fallback, 3), n)
    return table


class RecordedCosts:
    """A run's final cost table as a ``draft.tree_policy.CostTable``."""

    def __init__(self, costs):
        self.costs = np.asarray(costs, dtype=float)

    def table(self, n_max: int) -> np.ndarray:
        return self.costs[:n_max]


def cut(scores, costs, rule: str) -> int:
    """Nodes kept by ``rule``: "gain" (the shipped ``best_prefix``) or "ratio" (the round's own
    tokens per cost, the rule before it; first maximum as well)."""
    if rule == "gain":
        from verispec.draft.tree_policy import best_prefix

        return best_prefix(scores, RecordedCosts(costs))[0]
    keep, best, total = 1, 1.0 / costs[0], 0.0
    for nodes in range(2, len(scores) + 1):
        total += scores[nodes - 1]
        if (1.0 + total) / costs[nodes - 1] > best:
            keep, best = nodes, (1.0 + total) / costs[nodes - 1]
    return keep


def replay(runs, rule: str | None) -> tuple[float, float]:
    """(modelled tokens per second of the rule, of the hindsight oracle); rule None: the run's own cut."""
    tokens = seconds = oracle_tokens = oracle_seconds = 0.0
    for run in runs:
        costs = run["table"]
        for r in run["rounds"]:
            size = len(r["parents"])
            emitted = [min(sum(node < k for node in r["path"]) + 1, r["remaining"]) for k in range(1, size + 1)]
            kept = r["chosen"] if rule is None else cut(r["scores"], costs, rule)
            best = max(range(size), key=lambda k: emitted[k] / costs[k])
            tokens, seconds = tokens + emitted[kept - 1], seconds + costs[kept - 1]
            oracle_tokens, oracle_seconds = oracle_tokens + emitted[best], oracle_seconds + costs[best]
    return tokens / seconds, oracle_tokens / oracle_seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--humaneval", type=int, default=24, help="tuning HumanEval prompts (default 24)")
    parser.add_argument("--per-category", type=int, default=4, help="tuning Spec-Bench prompts per category (default 4)")
    parser.add_argument("--temperatures", default="0,0.6")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--replay", action="store_true", help="also replay the size rules on the recorded rounds")
    args = parser.parse_args(argv)
    from verispec.cli.generate import resolve_dtype
    from verispec.models.default import fast_dtype_name, load_default_target, read_cpuinfo

    torch.set_num_threads(1)
    dtype = fast_dtype_name()
    model, tokenizer = load_default_target(resolve_dtype(dtype))
    prompts = tuning_prompts(args.humaneval, args.per_category)
    cpu = next((line.split(":", 1)[1].strip() for line in read_cpuinfo().splitlines() if line.startswith("model name")), "?")
    print(f"# {len(prompts)} tuning prompts x {args.max_new_tokens} tokens, {dtype}, {cpu}")
    by_temperature = {float(t): record_rounds(model, tokenizer, prompts, float(t), args.max_new_tokens)
                      for t in args.temperatures.split(",")}
    counts = trials([run for runs in by_temperature.values() for run in runs])
    print("ACCEPT_PRIOR = {")
    table = fit(counts)
    for source, bucket in sorted({key[:2] for key in table}, key=lambda k: (k[0] != "copy", k[1])):
        cells = [(rank, *table[(source, bucket, rank)]) for rank in range(RANKS)]
        print("    " + " ".join(f"({source!r}, {bucket}, {rank}): {rate}," for rank, rate, _ in cells)
              + "  # trials " + " / ".join(str(n) for *_, n in cells))
    print("}")
    if args.replay:
        for temperature, runs in by_temperature.items():
            own, oracle = replay(runs, None)
            line = [f"T = {temperature}: as run {own:.2f} tok/s ({own / oracle:.1%} of the oracle's {oracle:.2f})"]
            for rule in ("ratio", "gain"):
                rate, _ = replay(runs, rule)
                line.append(f"{rule} {rate:.2f} ({rate / oracle:.1%})")
            print("  " + "; ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())

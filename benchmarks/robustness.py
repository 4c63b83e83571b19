"""Never slower than plain decoding? The default (token trees + the q-free rule, sized each round by
the online cost model) against plain decoding on held-out prompts, with an oracle for the policy.

Usage:
    python benchmarks/robustness.py [--limit N] [--per-category 3] [--categories qa,rag] [--humaneval N] [--max-new-tokens 128]
        [--threads 1,2] [--temperatures 0,0.6] [--load | --no-load] [--repeats 2] [--warm] [--ceiling]
        [--dtype auto] [--ignore-eos] [--adjacency FILE] [--json OUT.json]

Prompts: held-out only (``verispec.distill.data.split_prompts("heldout")``): HumanEval 0-39 and
Spec-Bench ids divisible by 5, at most --per-category per Spec-Bench category; --limit N keeps N
HumanEval prompts and N Spec-Bench prompts (taken round-robin over the categories); --categories keeps
only the named Spec-Bench categories, --humaneval N only the first N HumanEval prompts.

Conditions (OpenMP threads wait passively, as under the ``verispec`` command; set OMP_WAIT_POLICY to
override): every combination of --threads (torch threads), --temperatures (0 = greedy; seeded
draws with seed = the prompt's index otherwise) and load: without, then with a CPU-bound process of
this script's own pinned to core 0 (started before and killed after the loaded runs; --load /
--no-load keep only one). Within a condition, for every prompt, plain and default run back to
back, --repeats times, the order alternating (A B, B A, ...). Each run gets fresh decoders (an
empty adjacency table, or a copy of --adjacency FILE, and a cost model at its prior, as a new
``verispec generate`` process has); --warm keeps one decoder per configuration for the whole
condition (a server).

--ignore-eos decodes exactly --max-new-tokens tokens in both configurations (no EOS stop, as
serving benchmarks fix their output lengths). Use it at T > 0 in bf16: the seeded texts of plain and
default are the same draws, but a near tie that the forward's shape flips (far more often in bf16
than in fp32) changes the rest of the text, and when one text then ends after 17 tokens and the
other after 96, the ratio with prefill compares a prefill-bound run with a decode-bound one.

Printed per condition: per prompt tokens/s of both and the ratio default / plain (total tokens over
total seconds of its repeats), the same ratio without the prefill ("decode": the fair one when
the texts differ in length, at T > 0 with draws that depend on the draft), the default's block
efficiency and share of root-only rounds; per
category the geometric mean of its prompts' ratios; overall the geometric mean of the per-prompt
ratios and the total-time ratio (all plain seconds per token over all default seconds per token);
the worst prompt.

Oracle: every round's full best-first candidate list (before the policy cut it) is recorded; after
the run, knowing the emitted text, each prefix size s of that list gives the accepted length the
q-free walk would have had (the target's tokens are the emitted ones: exact for greedy, and for
seeded draws when the draws are keyed by position; with a round-keyed generator the hindsight is
approximate at T > 0) and the cost of scoring s tokens from the cost model at the end of the run
(seconds, overhead included). The oracle takes each round's best tokens-per-second prefix; printed:
the policy's tokens per second of modelled cost as a fraction of the oracle's.

Ceiling (--ceiling): at T > 0 the oracle knows the draws, which no policy deciding before a round
can. After each run every round's offered order is scored by one more target forward (an adapter
of its own, after the round's context), giving each node's true probability of being drawn at its
parent; the same prefixes cut by expected tokens (from those probabilities) minus a price of time,
the price iterated to the rate the expectations reach (Dinkelbach), give the best such a policy
could do, printed as a fraction of the oracle's tokens per second. The gap between the policy and
the ceiling is what better acceptance estimates could still win; the gap above it, the draws' luck.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace


# as the command line does before torch loads: waiting OpenMP threads sleep instead of spinning, so a
# busy core slows a 2-thread forward down instead of stalling it (an explicit value wins)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

SPEC_BENCH = "/work/shared/data/spec_bench/question.jsonl"


@dataclass
class RunRecord:
    """One prompt under one condition: both configurations' totals over the repeats."""

    prompt_id: str
    category: str
    plain_tokens: int = 0
    plain_seconds: float = 0.0
    plain_prefill_seconds: float = 0.0
    default_tokens: int = 0
    default_seconds: float = 0.0
    default_prefill_seconds: float = 0.0
    target_calls: int = 0
    rounds: int = 0
    root_only_rounds: int = 0
    policy_tokens: float = 0.0
    policy_cost: float = 0.0
    oracle_tokens: float = 0.0
    oracle_cost: float = 0.0
    hindsight_mismatches: int = 0  # rounds whose recorded walk differs from the emitted tokens
    ceiling: list = field(default_factory=list)  # --ceiling: a CeilingRound per round of every repeat

    @property
    def ratio(self) -> float:
        return (self.default_tokens / self.default_seconds) / (self.plain_tokens / self.plain_seconds)

    @property
    def decode_ratio(self) -> float:
        """The same without the prefill: what matters when the two texts differ in length (T > 0
        with draws that depend on the draft), where the prefill is spread over different counts."""
        plain = self.plain_tokens / (self.plain_seconds - self.plain_prefill_seconds)
        return self.default_tokens / (self.default_seconds - self.default_prefill_seconds) / plain


@dataclass
class Condition:
    threads: int
    temperature: float
    load: bool
    records: list[RunRecord] = field(default_factory=list)


def held_out_prompts(limit: int | None, per_category: int, spec_bench: str, categories=None, humaneval_count=None):
    from verispec.distill.data import split_prompts

    prompts = split_prompts("heldout", spec_bench)
    if categories:
        prompts = [p for p in prompts if p.category == "humaneval" or p.category in categories]
    humaneval = [p for p in prompts if p.category == "humaneval"]
    by_category: dict[str, list] = defaultdict(list)
    for prompt in prompts:
        if prompt.category != "humaneval" and len(by_category[prompt.category]) < per_category:
            by_category[prompt.category].append(prompt)
    # round-robin over the categories, Spec-Bench's own (16 held-out prompts each: translation,
    # summarization, qa, math_reasoning, rag) before MT-bench's, so a small --limit still spans several
    groups = sorted((group for group in by_category.values() if group), key=lambda group: -sum(1 for p in prompts if p.category == group[0].category))
    spec_bench = []
    for depth in range(per_category):
        spec_bench += [group[depth] for group in groups if depth < len(group)]
    if limit is not None:
        humaneval, spec_bench = humaneval[:limit], spec_bench[:limit]
    if humaneval_count is not None:
        humaneval = humaneval[:humaneval_count]
    return humaneval + spec_bench


def hindsight(tree, emitted: list[int]) -> list[int]:
    """Node indices of ``tree.offered`` that the q-free walk visits below the root when the target
    emits ``emitted`` from the round's root on (increasing: parents come first)."""
    offered = tree.offered if tree.offered is not None else tree
    children = offered.children_of()
    path, node = [], 0
    for token in emitted:
        node = children[node].get(int(token))
        if node is None:
            break
        path.append(node)
    return path


@dataclass
class RoundPrefixes:
    """One round of a run, per prefix size s = 1..n of its offered order: the tokens the walk emits
    in hindsight and the modelled cost; with what the round was (where it started in the emitted
    text, the tokens left from there, the size the policy kept, the tokens it emitted)."""

    offered: object  # the round's whole best-first order (a CandidateTree)
    position: int  # emitted tokens before the round
    remaining: int  # emitted tokens from the round on
    kept: int  # nodes the policy kept
    new_tokens: int
    tokens: list[int]
    costs: list[float]


def round_prefixes(trees, output, cost_table) -> list[RoundPrefixes]:
    """``RoundPrefixes`` of every round of a run (module docstring: the oracle), costs from ``cost_table``."""
    emitted, position, rounds = output.token_ids, 0, []
    for tree, step in zip(trees, output.steps):
        offered = tree.offered if tree.offered is not None else tree
        path, remaining = hindsight(tree, emitted[position:]), len(emitted) - position
        sizes = range(1, offered.num_nodes + 1)
        rounds.append(RoundPrefixes(offered, position, remaining, tree.num_nodes, step.new_tokens,
                                    [min(sum(node < size for node in path) + 1, remaining) for size in sizes],
                                    [float(cost_table[size - 1]) for size in sizes]))
        position += step.new_tokens
    return rounds


def hindsight_best(tokens, costs) -> int:
    """The oracle's prefix of a round (an index): the most tokens per modelled second in hindsight."""
    return max(range(len(tokens)), key=lambda i: tokens[i] / costs[i])


def score_policy(record: RunRecord, rounds: list[RoundPrefixes]) -> None:
    """Add the policy's and the oracle's tokens and modelled costs of every round (module docstring)."""
    for r in rounds:
        best, chosen = hindsight_best(r.tokens, r.costs), r.kept - 1
        record.policy_tokens += r.tokens[chosen]
        record.policy_cost += r.costs[chosen]
        record.oracle_tokens += r.tokens[best]
        record.oracle_cost += r.costs[best]
        record.hindsight_mismatches += int(min(r.new_tokens, r.remaining) != r.tokens[chosen])


@dataclass
class CeilingRound:
    """One round for ``ceiling_fraction``: per prefix size s = 1..n of the offered order, the tokens
    the walk emitted in hindsight, the modelled cost, and the tokens expected from the target's
    true probabilities of the offered nodes (1 + the sum of their reach probabilities, at most the
    tokens left)."""

    tokens: list[int]
    costs: list[float]
    expected: list[float]


def true_reach(probe, context: list[int], offered, params) -> list[float]:
    """Reach probability of every node of ``offered`` (a ``CandidateTree``; node 0 the root, the last
    token of ``context``): the product along its path of the target's probability of drawing each
    node's token at its parent, from one forward of ``probe`` (a target adapter of its own) over the
    whole offered tree after ``context``, with the run's sampling parameters ``params``."""
    from verispec.core.sampling import logits_to_probs

    probe.reset(context)
    rows = logits_to_probs(probe.score(list(offered.tokens), list(offered.parents)), params)
    reach = [1.0]
    for node in range(1, offered.num_nodes):
        parent = offered.parents[node]
        reach.append(reach[parent] * float(rows[parent, offered.tokens[node]]))
    return reach


def ceiling_rounds(probe, ids, output, rounds: list[RoundPrefixes], params) -> list[CeilingRound]:
    """``CeilingRound``s of one run: its ``round_prefixes`` with the true expectations added."""
    emitted, ceiling = output.token_ids, []
    for r in rounds:
        reach = true_reach(probe, list(ids) + list(emitted[:r.position]), r.offered, params)
        expected = [min(1.0 + sum(reach[1:size]), r.remaining) for size in range(1, len(r.tokens) + 1)]
        ceiling.append(CeilingRound(r.tokens, r.costs, expected))
    return ceiling


def ceiling_fraction(rounds: list[CeilingRound], iterations: int = 50) -> float:
    """Tokens per modelled second of the best cut a policy deciding before each round could make if
    it knew the offered nodes' true probabilities (not the draws), as a fraction of the hindsight
    oracle's. The cut maximises expected tokens minus a price of time, the price set by Dinkelbach's
    iteration to the rate the expectations reach (the long-run optimum; no peeking at the draws)."""
    price = 1.0
    for _ in range(iterations):
        chosen = [max(range(len(r.costs)), key=lambda k, r=r: r.expected[k] - price * r.costs[k] / r.costs[0]) for r in rounds]
        updated = sum(r.expected[k] for r, k in zip(rounds, chosen)) / sum(r.costs[k] / r.costs[0] for r, k in zip(rounds, chosen))
        if abs(updated - price) < 1e-9:
            break
        price = updated
    best = [hindsight_best(r.tokens, r.costs) for r in rounds]
    ceiling = sum(r.tokens[k] for r, k in zip(rounds, chosen)) / sum(r.costs[k] for r, k in zip(rounds, chosen))
    return ceiling / (sum(r.tokens[k] for r, k in zip(rounds, best)) / sum(r.costs[k] for r, k in zip(rounds, best)))


def run_default(decoder, ids, seed: int):
    """Generate with the default decoder, recording every round's candidate tree. A round the
    policy knew to be root-only comes without its offered order (``propose`` skips growing it);
    the oracle needs it, so it is grown here, and the seconds that takes are taken off the round's
    drafting time before the cost model reads it and off the run's total (returned as ``extra``)."""
    trees = []
    drafter = decoder.drafter
    propose, learn = type(drafter).propose, type(decoder)._learn
    pending, extra = [0.0], [0.0]

    def recording(*args, **kwargs):
        tree = propose(drafter, *args, **kwargs)
        if tree.offered is None:
            tic = time.perf_counter()
            tree = replace(tree, offered=drafter.offered_tree(*args, **kwargs))
            pending[0] += time.perf_counter() - tic
        trees.append(tree)
        return tree

    def learning(step, *args):
        step.draft_seconds -= pending[0]
        extra[0] += pending[0]
        pending[0] = 0.0
        return learn(decoder, step, *args)

    drafter.propose, decoder._learn = recording, learning
    decoder.seed = seed
    try:
        output = decoder.generate(ids)
    finally:
        del drafter.propose, decoder._learn
    return output, trees, extra[0]


def start_load() -> subprocess.Popen:
    """A CPU-bound process pinned to core 0 (this script's own; killed by ``stop_load``)."""
    return subprocess.Popen(
        [sys.executable, "-c", "import os; os.sched_setaffinity(0, {0})\nwhile True: pass"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )


def stop_load(process: subprocess.Popen) -> None:
    process.kill()
    process.wait()


def run_condition(condition: Condition, model, tokenizer, prompts, args) -> None:
    from verispec.cli.generate import adjacency_flag
    from verispec.engine.decoder import SpeculativeDecoder
    from verispec.models.default import encode_prompt

    torch.set_num_threads(condition.threads)
    common = dict(tokenizer=tokenizer, temperature=condition.temperature, max_new_tokens=args.max_new_tokens)
    if args.ignore_eos:
        common["eos_token_id"] = []  # no EOS: every run decodes exactly max_new_tokens

    adjacency = adjacency_flag(args)  # "none": an empty table, as verispec generate

    def decoders():
        return SpeculativeDecoder(model, None, method="ar", **common), SpeculativeDecoder(model, adjacency=adjacency, **common)

    probe = None
    if args.ceiling:  # a target adapter of its own: its forwards leave the decoders' caches alone
        from verispec.models.hf import HFModelAdapter

        probe = HFModelAdapter(model)
    shared = decoders() if args.warm else None
    if shared is not None:  # first-call allocations and the first cost readings stay out of the numbers
        shared[1].generate(encode_prompt(tokenizer, "Write a Python function that adds two numbers."))
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(tokenizer, prompt.text)
        record = RunRecord(prompt.prompt_id, prompt.category)
        for repeat in range(args.repeats):
            plain, default = shared or decoders()
            order = ("plain", "default") if repeat % 2 == 0 else ("default", "plain")
            for config in order:
                if config == "plain":
                    plain.seed = index
                    output = plain.generate(ids)
                    record.plain_tokens += output.new_tokens
                    record.plain_seconds += output.seconds
                    record.plain_prefill_seconds += output.prefill_seconds
                    continue
                output, trees, extra = run_default(default, ids, index)
                record.default_tokens += output.new_tokens
                record.default_seconds += output.seconds - extra
                record.default_prefill_seconds += output.prefill_seconds
                record.target_calls += output.target_calls
                record.rounds += len(output.steps)
                record.root_only_rounds += output.root_only_rounds
                rounds = round_prefixes(trees, output, default.cost_model.table(max(t.offered.num_nodes for t in trees)))
                score_policy(record, rounds)
                if probe is not None:
                    record.ceiling += ceiling_rounds(probe, ids, output, rounds, default.params)
        condition.records.append(record)
        print(f"  {prompt.prompt_id:<18} {prompt.category:<15} {record.ratio:6.3f}", file=sys.stderr, flush=True)


def geometric_mean(values) -> float:
    values = list(values)
    return math.exp(statistics.fmean(math.log(v) for v in values)) if values else float("nan")


def summary(condition: Condition) -> dict:
    records = condition.records
    categories = defaultdict(list)
    for record in records:
        categories[record.category].append(record.ratio)
    plain_rate = sum(r.plain_seconds for r in records) / sum(r.plain_tokens for r in records)
    default_rate = sum(r.default_seconds for r in records) / sum(r.default_tokens for r in records)
    worst = min(records, key=lambda r: r.ratio)
    policy = sum(r.policy_tokens for r in records) / sum(r.policy_cost for r in records)
    oracle = sum(r.oracle_tokens for r in records) / sum(r.oracle_cost for r in records)
    return {
        "per_category": {c: geometric_mean(v) for c, v in categories.items()},
        "geomean_ratio": geometric_mean(r.ratio for r in records),
        "geomean_decode_ratio": geometric_mean(r.decode_ratio for r in records),
        "total_time_ratio": plain_rate / default_rate,
        "worst": (worst.prompt_id, worst.category, worst.ratio),
        "oracle_fraction": policy / oracle,
        "root_only_share": sum(r.root_only_rounds for r in records) / max(1, sum(r.rounds for r in records)),
        "hindsight_mismatches": sum(r.hindsight_mismatches for r in records),
        "ceiling_fraction": ceiling_fraction([c for r in records for c in r.ceiling]) if records[0].ceiling else None,
    }


def print_condition(condition: Condition) -> dict:
    load = "with a CPU-bound process on core 0" if condition.load else "no load of its own"
    print(f"\n## threads {condition.threads}, T = {condition.temperature}, {load}")
    print(f"{'prompt':<18} {'category':<15} {'tokens*':>11} {'plain t/s':>9} {'default t/s':>11} {'ratio':>6} "
          f"{'decode':>6} {'BE':>5} {'root-only':>9}")
    for r in condition.records:
        print(f"{r.prompt_id:<18} {r.category:<15} {f'{r.plain_tokens}/{r.default_tokens}':>11} {r.plain_tokens / r.plain_seconds:>9.2f} "
              f"{r.default_tokens / r.default_seconds:>11.2f} {r.ratio:>6.3f} {r.decode_ratio:>6.3f} "
              f"{r.default_tokens / r.target_calls:>5.2f} {r.root_only_rounds / max(1, r.rounds):>9.0%}")
    result = summary(condition)
    print("  * tokens of all repeats, plain/default (equal at T = 0); ratio: tokens/s incl. prefill, decode: without it")
    for category, ratio in result["per_category"].items():
        print(f"  category {category:<15} geometric mean ratio {ratio:.3f}")
    worst = result["worst"]
    print(f"  overall: geometric mean of per-prompt ratios {result['geomean_ratio']:.3f} (decode only "
          f"{result['geomean_decode_ratio']:.3f}), total-time ratio "
          f"{result['total_time_ratio']:.3f}; worst prompt {worst[0]} ({worst[1]}) {worst[2]:.3f}")
    print(f"  policy vs oracle (same candidates, same cost table, best size in hindsight per round): "
          f"{result['oracle_fraction']:.1%} of its tokens per second; root-only rounds {result['root_only_share']:.0%}; "
          f"rounds whose hindsight walk differs from the run {result['hindsight_mismatches']}")
    if result["ceiling_fraction"] is not None:
        print(f"  ceiling (the same offered orders cut knowing each node's true probability, not the draws): "
              f"{result['ceiling_fraction']:.1%} of the oracle's tokens per second")
    return result


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            return next(line.split(":", 1)[1].strip() for line in handle if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or "unknown CPU"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="N HumanEval and N Spec-Bench held-out prompts (default: all)")
    parser.add_argument("--per-category", type=int, default=3, help="Spec-Bench prompts per category (default 3)")
    parser.add_argument("--categories", default=None, help="comma list of Spec-Bench categories to keep (default: all)")
    parser.add_argument("--humaneval", type=int, default=None, help="HumanEval prompts to keep (default: --limit, else all 40)")
    parser.add_argument("--spec-bench", default=None, help=f"Spec-Bench question.jsonl (default: the development copy, else {SPEC_BENCH})")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", default="1,2", help="comma list of torch thread counts (default 1,2)")
    parser.add_argument("--temperatures", default="0,0.6", help="comma list (default 0,0.6; 0 = greedy)")
    loads = parser.add_mutually_exclusive_group()
    loads.add_argument("--load", dest="loads", action="store_const", const=(True,), help="only with the competing process")
    loads.add_argument("--no-load", dest="loads", action="store_const", const=(False,), help="only without it")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each configuration per prompt (default 2)")
    parser.add_argument("--warm", action="store_true", help="one decoder per configuration for a whole condition")
    parser.add_argument("--ceiling", action="store_true",
                        help="also the best any policy deciding before a round could reach: each round's offered "
                             "nodes scored by one more target forward (about doubles the run time)")
    parser.add_argument("--dtype", default="auto", help="auto (bf16 where the CPU has it natively), fp32 or bf16")
    parser.add_argument("--adjacency", default="none", metavar="none|FILE",
                        help="the default's starting adjacency table, as verispec generate's --adjacency (default none: empty)")
    parser.add_argument("--ignore-eos", action="store_true",
                        help="decode exactly --max-new-tokens tokens, no EOS stop (equal lengths when texts differ)")
    parser.add_argument("--json", default=None, help="write every record and summary to this file")
    args = parser.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]
    if args.repeats < 1 or args.max_new_tokens < 1 or min(threads) < 1 or min(temperatures) < 0:
        parser.error("--repeats, --max-new-tokens and --threads must be >= 1 and temperatures >= 0")

    from verispec.cli.generate import resolve_dtype
    from verispec.models.default import fast_dtype_name, load_default_target

    dtype = fast_dtype_name() if args.dtype == "auto" else args.dtype
    model, tokenizer = load_default_target(resolve_dtype(dtype))
    from verispec.distill.data import default_spec_bench_path

    categories = args.categories.split(",") if args.categories else None
    prompts = held_out_prompts(args.limit, args.per_category, args.spec_bench or default_spec_bench_path() or SPEC_BENCH,
                               categories, args.humaneval)
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {cpu_name()}, {os.cpu_count()} cores, {dtype}, "
          f"{len(prompts)} held-out prompts x {args.repeats} repeats, {'exactly' if args.ignore_eos else 'max'} {args.max_new_tokens} new tokens, "
          f"{'warm decoders' if args.warm else 'fresh decoders per run'}; load average before: {os.getloadavg()[0]:.1f}")
    results = []
    for load in args.loads or (False, True):
        process = start_load() if load else None
        try:
            for thread_count in threads:
                for temperature in temperatures:
                    condition = Condition(thread_count, temperature, load)
                    run_condition(condition, model, tokenizer, prompts, args)
                    results.append({"threads": thread_count, "temperature": temperature, "load": load,
                                    "summary": print_condition(condition), "records": [asdict(r) for r in condition.records]})
        finally:
            if process is not None:
                stop_load(process)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"args": vars(args), "cpu": cpu_name(), "dtype": dtype, "conditions": results}, handle, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

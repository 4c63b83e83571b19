"""Batched decoding speed: plain and speculative, by batch size, interleaved in one process.

    python benchmarks/batch_speed.py [--batch-sizes 1,2,4] [--prompts 0-3] [--tokens 32]
                                     [--repeats 3] [--threads 1] [--dtype auto] [--device cpu]

For every batch size B, the HumanEval prompts are split into groups of B (prompt i goes with the
next B - 1, cyclically, so every B decodes the same prompts) and each group is decoded greedily by
    plain     ``generate_batch`` with method "ar" (plain batched decoding)
    default   ``generate_batch`` with the default draft (token trees + q-free), sized by the batch budget
and, at B = 1, by ``generate`` itself (today's single-sequence path). Configurations alternate
per group (their order rotates every repeat), so load drifts hit them alike. Printed per B:
total tokens/s (all tokens of all groups / their wall time), mean tokens/s per sequence, block
efficiency, the speedup of default over plain of the same B, and the total throughput relative
to ``generate`` of one sequence alone: medians over repeats with [min, max]; rates also per second
of the process's CPU time (``time.process_time``), which other processes' load inflates far less
than wall time on a shared machine. ``--budget N`` adds the default draft with at most N scored
tokens per forward split evenly between the sequences (``engine.batch.EvenSplit``);
``--drafter-choice`` adds "own": every sequence sizes its tree with its own cost model.
``--join`` adds "plain-join" and "default-join" (B > 1): all prompts in ONE ``generate_batch`` call
with ``max_batch`` B, so a finished sequence's place is taken by the next prompt (B sequences keep
running until the last prompts drain); their "vs plain" column compares with plain-join. Groups
that run to completion instead lose the rounds in which their last sequences finish alone.
Greedy outputs are checked against plain decoding's (differences = float batch-variance flips).
Each (configuration, B) has its own decoder, all in the same state at the start (one cost curve,
copies of one warmed adjacency table and acceptance estimates): the token trees learn from every
prompt, so a shared decoder would let a configuration profit from the run before it.
"""

from __future__ import annotations

import argparse
import copy
import platform
import statistics
import time
from dataclasses import dataclass, field

import torch

from verispec.cli.generate import DTYPE_CHOICES, resolve_dtype


@dataclass
class Run:
    """One configuration at one batch size over all prompt groups of one repeat."""

    tokens: int = 0
    wall: float = 0.0
    cpu: float = 0.0
    sequence_rates: list[float] = field(default_factory=list)
    block_efficiencies: list[float] = field(default_factory=list)

    def add(self, outputs, wall: float, cpu: float) -> None:
        self.tokens += sum(o.new_tokens for o in outputs)
        self.wall += wall
        self.cpu += cpu
        self.sequence_rates += [o.new_tokens / o.seconds for o in outputs]
        self.block_efficiencies += [o.block_efficiency for o in outputs]

    @property
    def wall_rate(self) -> float:
        return self.tokens / self.wall

    @property
    def cpu_rate(self) -> float:
        return self.tokens / self.cpu


def parse_range(text: str) -> list[int]:
    start, _, end = text.partition("-")
    return list(range(int(start), int(end or start) + 1))


def groups(count: int, size: int) -> list[list[int]]:
    """Prompt indices in groups of ``size``: the prompts decoded together (cyclic wrap-around)."""
    return [[(first + j) % count for j in range(size)] for first in range(0, count, size)]


def cpu_name() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def add_group_arguments(parser: argparse.ArgumentParser) -> None:
    """Batch sizes, prompts and repeats: the settings the batch benchmarks share, with one set of defaults."""
    parser.add_argument("--batch-sizes", default="1,2,4")
    parser.add_argument("--prompts", default="0-3", help="HumanEval task ids, e.g. 0-3")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)


def encoded_humaneval(tokenizer, id_range: str) -> list[list[int]]:
    """The HumanEval prompts with the task ids of ``id_range`` (e.g. "0-3"), encoded for the target."""
    from verispec.bench.datasets import humaneval_prompts
    from verispec.models.default import encode_prompt

    ids = parse_range(id_range)
    tasks = humaneval_prompts(limit=max(ids) + 1)
    return [encode_prompt(tokenizer, tasks[i].text) for i in ids]


def plain_and_warm_default(target, common: dict, prompts):
    """Plain decoding (method "ar"), its outputs (the references every configuration is checked
    against), and a default decoder that measured its token trees' cost curve once on the first
    prompt, as generate does, so no timed configuration pays for that."""
    from verispec.engine.decoder import SpeculativeDecoder

    plain = SpeculativeDecoder(target, method="ar", **common)
    reference = [plain.generate(p).token_ids for p in prompts]
    first = SpeculativeDecoder(target, **common)
    first.generate(prompts[0])
    return plain, reference, first


def copy_default_decoder(first, target, common: dict):
    """A default decoder in the state ``first`` had after its first prompt: the token trees learn
    from every prompt (adjacency table, acceptance estimates), so each (configuration, B) keeps its
    own copy, all starting alike and seeing the same prompts in the same order; one cost curve."""
    from verispec.engine.decoder import SpeculativeDecoder

    decoder = SpeculativeDecoder(target, **common)
    decoder.drafter.cost = first.drafter.cost
    decoder.drafter.adjacency = copy.deepcopy(first.drafter.adjacency)
    decoder.drafter.estimates = copy.deepcopy(first.drafter.estimates)
    return decoder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_group_arguments(parser)
    parser.add_argument("--dtype", default="auto", choices=DTYPE_CHOICES)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda[:N]; auto dtype on a GPU: bf16")
    parser.add_argument("--drafter-choice", action="store_true",
                        help="also run the default draft with every sequence sizing its own tree by its own cost model "
                             "(engine.batch.drafter_choice: the policy before the batch budget)")
    parser.add_argument("--join", action="store_true",
                        help="also decode ALL prompts in one generate_batch with max_batch B (plain-join, default-join): "
                             "a finished sequence's place is taken by the next prompt, so B sequences stay running "
                             "until the last prompts drain, as in a server with continuous batching")
    parser.add_argument("--budget", type=int, default=0,
                        help="also run the default draft with at most this many scored tokens per forward, split "
                             "evenly between the sequences (engine.batch.EvenSplit); 0: not run")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    from verispec.engine.batch import EvenSplit, drafter_choice
    from verispec.models.default import load_default_target

    sizes = [int(b) for b in args.batch_sizes.split(",")]
    model, tokenizer = load_default_target(resolve_dtype(args.dtype, args.device), args.device)
    prompts = encoded_humaneval(tokenizer, args.prompts)
    common = dict(tokenizer=tokenizer, temperature=0, max_new_tokens=args.tokens, eos_token_id=[])
    plain, reference, first = plain_and_warm_default(model, common, prompts)
    budgets = {"plain": None, "default": None, "generate": None}
    if args.drafter_choice:
        budgets["own"] = drafter_choice
    if args.budget:
        budgets[f"split{args.budget}"] = EvenSplit(args.budget)
    if args.join:
        budgets["plain-join"] = budgets["default-join"] = None

    def fresh_default():
        """``copy_default_decoder`` sharing ``first``'s weights (one copy of the model in memory)."""
        decoder = copy_default_decoder(first, model, common)
        decoder.target.runner.share_weights_from(first.target.runner)
        return decoder

    decoders = {(size, name): plain if name.startswith("plain") else fresh_default() for size in sizes for name in budgets
                if (name != "generate" or size == 1) and (not name.endswith("-join") or size > 1)}
    runs: dict[tuple[int, str], list[Run]] = {}  # (B, config) -> one Run per repeat
    mismatches: dict[str, list[int]] = {}  # config -> [differing, decoded]
    for repeat in range(args.repeats):
        for size in sizes:
            names = [name for name in budgets if (size, name) in decoders and not name.endswith("-join")]
            names = names[repeat % len(names):] + names[: repeat % len(names)]
            joining = [name for name in budgets if (size, name) in decoders and name.endswith("-join")]
            joining = joining[repeat % 2:] + joining[: repeat % 2] if joining else []
            totals = {name: Run() for name in names + joining}
            for group in groups(len(prompts), size):
                batch = [prompts[i] for i in group]
                for name in names:
                    wall, cpu = time.perf_counter(), time.process_time()
                    decoder = decoders[(size, name)]
                    if name == "generate":
                        outputs = [decoder.generate(batch[0])]
                    else:
                        outputs = decoder.generate_batch(batch, budget=budgets[name])
                    totals[name].add(outputs, time.perf_counter() - wall, time.process_time() - cpu)
                    counts = mismatches.setdefault(name, [0, 0])
                    counts[0] += sum(o.token_ids != reference[i] for o, i in zip(outputs, group))
                    counts[1] += len(outputs)
            for name in joining:  # every prompt in one call, B at a time: the places of finished ones refill
                wall, cpu = time.perf_counter(), time.process_time()
                outputs = decoders[(size, name)].generate_batch(prompts, max_batch=size)
                totals[name].add(outputs, time.perf_counter() - wall, time.process_time() - cpu)
                counts = mismatches.setdefault(name, [0, 0])
                counts[0] += sum(o.token_ids != reference[i] for i, o in enumerate(outputs))
                counts[1] += len(outputs)
            for name, total in totals.items():
                runs.setdefault((size, name), []).append(total)

    def spread(values):
        return f"{statistics.median(values):6.2f} [{min(values):.2f}, {max(values):.2f}]"

    machine = cpu_name() if args.device == "cpu" else f"{torch.cuda.get_device_name(args.device)} ({cpu_name()})"
    print(f"{machine}, {args.dtype} ({next(model.parameters()).dtype}), {torch.get_num_threads()} thread(s), "
          f"HumanEval {args.prompts}, {args.tokens} tokens, greedy, {args.repeats} repeats, {time.strftime('%Y-%m-%d %H:%M')}")
    print("tok/s: wall clock; tok/cpu-s: per second of this process's CPU time (robust to other processes' load)")
    columns = ["total tok/s", "tok/s per seq", "total tok/cpu-s", "vs plain same B (cpu)", "vs generate (cpu)", "vs generate (wall)"]
    print(f"{'B':>2}  {'config':>9}  {'BE':>5}  " + "  ".join(f"{c:>21}" for c in columns))
    solo = runs[(1, "generate")]
    for size in sizes:
        for name in [name for name in budgets if (size, name) in decoders]:
            series = runs[(size, name)]
            efficiency = statistics.mean(be for run in series for be in run.block_efficiencies)
            cells = [
                [r.tokens / r.wall for r in series],
                [statistics.mean(r.sequence_rates) for r in series],
                [r.tokens / r.cpu for r in series],
                [r.cpu_rate / p.cpu_rate for r, p in zip(series, runs[(size, "plain-join" if name.endswith("-join") else "plain")])],
                [r.cpu_rate / s.cpu_rate for r, s in zip(series, solo)],
                [r.wall_rate / s.wall_rate for r, s in zip(series, solo)],
            ]
            print(f"{size:>2}  {name:>9}  {efficiency:5.2f}  " + "  ".join(f"{spread(c):>21}" for c in cells))
    print("greedy outputs differing from plain generate's (float batch variance: a near tie flips with the forward's "
          "shape; bf16 more than fp32): " + ", ".join(f"{name} {bad} of {total}" for name, (bad, total) in mismatches.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

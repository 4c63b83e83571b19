"""Old vs new ``below_mass_all`` (the q̃ row ranks of ALGORITHMS.md §7.2), measured side by side in
one process: the cost behind GMPBV's and SpecTr-GBV★'s verification time (issue 10).

Usage:
    OMP_NUM_THREADS=1 python benchmarks/below_mass_speed.py [--repeats 100] [--inner 1] [--clock wall] [--vocab 50000]
                                                            [--num-drafts 4] [--draft-len 8]

old = ``tests/verify/below_mass_reference.py`` (one ``np.argsort`` per row, ``np.lexsort`` on exact
ties); new = ``verispec.verify.greedy_selection.below_mass_all`` (one int64 value sort of packed
(ratio, id) keys, ``sorted_local_order``).

Table 1, one call per row: the dense row pair of ``verify_speed.py``'s synthetic model (V entries,
no zeros), the same pair truncated to its top 5% (exact zeros in p and q), and p ≡ q (every ratio
tied). Table 2, one ``verify()`` call of ``gmpbv`` / ``spectr-gbv-star`` on ``verify_speed.py``'s
trees with the old function patched into the rule modules vs the new one, same tree and same
random numbers; the outputs (tokens, modification window) must be equal or the script stops.

Interleaving: each repeat times old and new back to back on the same input, the order flipped
every repeat (A B, B A, ...), garbage collector paused; with --inner N each repeat runs the pair N
times on its input (order still alternating) and keeps each side's min. --clock thread times the
thread's CPU time instead of wall time (time.thread_time_ns): on a loaded machine it leaves out the
time the process waits preempted, which wall time of a ~10 ms call always includes there. Reported per case: median ms of each,
the median of the per-repeat ratios old/new and their 10th-90th percentile spread, and the min and
p90 of each side (on a loaded machine the min is the least disturbed figure).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import platform
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]  # the test reference and verify_speed's trees

from tests.verify.below_mass_reference import below_mass_all_reference  # noqa: E402
from verify_speed import SyntheticPair, build_trees, draft_kind  # noqa: E402

from verispec.core.rng import SeededRng  # noqa: E402
from verispec.verify import greedy_selection, modification  # noqa: E402
from verispec.verify.registry import METHODS  # noqa: E402

NEW = greedy_selection.below_mass_all
PATCHED_MODULES = (greedy_selection, modification)  # the modules whose rule code calls below_mass_all


@contextlib.contextmanager
def below_mass_all_as(function):
    """Run the rules with ``function`` as their ``below_mass_all`` (benchmark only)."""
    saved = [module.below_mass_all for module in PATCHED_MODULES]
    for module in PATCHED_MODULES:
        module.below_mass_all = function
    try:
        yield
    finally:
        for module, previous in zip(PATCHED_MODULES, saved):
            module.below_mass_all = previous


CLOCKS = {
    "wall": time.perf_counter_ns,  # what a user waits for
    "thread": time.thread_time_ns,  # CPU time of this thread: excludes the time a loaded machine preempts it
}


def timed_ms(call, clock=time.perf_counter_ns) -> tuple[float, object]:
    start = clock()
    out = call()
    return (clock() - start) / 1e6, out


def interleaved(
    old_call, new_call, repeats: int, inner: int = 1, same=None, clock=time.perf_counter_ns
) -> tuple[np.ndarray, np.ndarray]:
    """(old ms, new ms), shape (repeats,) each; old_call(i) / new_call(i) run back to back, order
    flipped every time, ``inner`` times each on the same input i, keeping each side's min over
    those (the same work each time: the min drops the runs a loaded machine preempted).
    ``same(old_out, new_out)`` must hold for every repeat."""
    old_ms, new_ms = np.full(repeats, np.inf), np.full(repeats, np.inf)
    for i in range(repeats):
        gc.collect()
        gc.disable()
        try:
            for j in range(inner):
                if (i + j) % 2 == 0:
                    old_time, old_out = timed_ms(lambda: old_call(i), clock)
                    new_time, new_out = timed_ms(lambda: new_call(i), clock)
                else:
                    new_time, new_out = timed_ms(lambda: new_call(i), clock)
                    old_time, old_out = timed_ms(lambda: old_call(i), clock)
                old_ms[i], new_ms[i] = min(old_ms[i], old_time), min(new_ms[i], new_time)
        finally:
            gc.enable()
        if same is not None and not same(old_out, new_out):
            raise SystemExit(f"old and new differ at repeat {i}: {old_out!r} vs {new_out!r}")
    return old_ms, new_ms


def summary(label: str, old_ms: np.ndarray, new_ms: np.ndarray) -> str:
    ratios = old_ms / new_ms
    low, high = np.percentile(ratios, [10, 90])
    return (
        f"{label:<28} {np.median(old_ms):>9.3f} {np.median(new_ms):>9.3f} {np.median(ratios):>8.2f}x"
        f"   {low:>5.2f}-{high:<5.2f}x  {np.min(old_ms):>7.3f} {np.min(new_ms):>7.3f}"
        f"   {np.percentile(old_ms, 90):>7.2f} {np.percentile(new_ms, 90):>7.2f}"
    )


def top_fraction(vector: np.ndarray, fraction: float) -> np.ndarray:
    kept = np.zeros_like(vector)
    index = np.argsort(vector)[-max(1, int(fraction * len(vector))):]
    kept[index] = vector[index]
    return kept / kept.sum()


def row_cases(args) -> dict[str, list[tuple[np.ndarray, np.ndarray]]]:
    """Row pairs per case, ``args.num_rows`` each, from distinct synthetic prefixes."""
    cases: dict[str, list] = {"dense": [], "top 5% (zeros)": [], "p = q (all tied)": []}
    for index in range(args.num_rows):
        pair = SyntheticPair(args.vocab, seed=args.seed * 100_003 + index, noise=args.draft_noise)
        target, draft = pair.target(()), pair.draft(())
        cases["dense"].append((target, draft))
        cases["top 5% (zeros)"].append((top_fraction(target, 0.05), top_fraction(draft, 0.05)))
        cases["p = q (all tied)"].append((draft, draft))
    return cases


def same_result(old, new) -> bool:
    return (old.output_tokens, old.is_bonus, old.modification) == (new.output_tokens, new.is_bonus, new.modification)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vocab", type=int, default=50_000)
    parser.add_argument("--num-drafts", type=int, default=4)
    parser.add_argument("--draft-len", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--num-trees", type=int, default=20)
    parser.add_argument("--num-rows", type=int, default=10)
    parser.add_argument(
        "--inner", type=int, default=1, help="old/new runs per repeat on the same input, min kept (for a loaded machine)"
    )
    parser.add_argument("--draft-noise", type=float, default=0.6)
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="wall",
        help="wall time, or this thread's CPU time (robust to preemption on a loaded machine)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(
        f"below_mass_all old vs new: V={args.vocab} K={args.num_drafts} L={args.draft_len} repeats={args.repeats} inner={args.inner} clock={args.clock} "
        f"| python {platform.python_version()} numpy {np.__version__} | load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    # medians; spread = p10-p90 of the per-repeat ratios old/new; min and p90 of each side
    header = (
        f"{'case':<28} {'old ms':>9} {'new ms':>9} {'old/new':>9}   {'p10-p90':<12} {'old min':>7} {'new min':>7}"
        f"   {'old p90':>7} {'new p90':>7}"
    )
    print("\n" + header + "\n" + "-" * len(header))
    for label, rows in row_cases(args).items():
        for target, draft in rows:  # warm-up, and the outputs must be the same floats
            if not np.array_equal(below_mass_all_reference(target, draft), NEW(target, draft)):
                raise SystemExit(f"old and new below_mass_all differ on {label}")
        old_ms, new_ms = interleaved(
            lambda i: below_mass_all_reference(*rows[i % len(rows)]), lambda i: NEW(*rows[i % len(rows)]), args.repeats, args.inner,
            clock=CLOCKS[args.clock],
        )
        print(summary(f"row: {label}", old_ms, new_ms), flush=True)
    tree_args = SimpleNamespace(
        num_trees=args.num_trees, seed=args.seed, vocab=args.vocab, draft_noise=args.draft_noise,
        num_drafts=args.num_drafts, draft_len=args.draft_len,
    )
    trees = build_trees("paths", tree_args)
    for name in ("gmpbv", "spectr-gbv-star"):
        verifier = METHODS[name].verifier
        assert draft_kind(METHODS[name]) == "paths"

        def old(i, verifier=verifier):
            with below_mass_all_as(below_mass_all_reference):
                return verifier.verify(trees[i % len(trees)], SeededRng(i))

        def new(i, verifier=verifier):  # the same (no-op) patching, so both sides pay for it
            with below_mass_all_as(NEW):
                return verifier.verify(trees[i % len(trees)], SeededRng(i))

        for i in range(3):  # warm-up
            old(i), new(i)
        old_ms, new_ms = interleaved(old, new, args.repeats, args.inner, same=same_result, clock=CLOCKS[args.clock])
        print(summary(f"verify: {name}", old_ms, new_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

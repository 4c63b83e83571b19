"""Tree rules on full rows (before issue 16's support change) vs on the target's support (now),
side by side in one process: RRS, RRSw, SpecHub, traversal (ALGORITHMS.md §8, §9, §12).

Usage (from the repository root, in a git checkout):
    OMP_NUM_THREADS=1 python benchmarks/tree_rules_support.py [--base 082bf3c] [--vocab 128256]
        [--nodes 33] [--temperature 0.6] [--top-p 0.95] [--repeats 6] [--trees 3] [--rules ...]

"old" is verify/rrs.py, spechub.py and traversal.py as of commit --base (read with ``git show``:
every residual, P_u and R1 / R2 over full (V,) rows); "new" is the installed package. Both run on
the same trees (round_overhead.py's synthetic logits and tree shapes), the same LogitRows backend
and the same random numbers, interleaved (old, new, new, old, ...). Two times per rule:
  fresh   a new LogitRows per verify: the round as the engine runs it (row preparation included)
  cached  a second verify on the same LogitRows: rows already prepared (and built where the rule
          built them), so what is left is the rule's own arithmetic plus ``support`` / ``gather``
ratio = old / new per round: median and interquartile range. "agree": old and new emitted the
same tokens on every round (they should: same law, same random numbers).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import round_overhead as ro  # noqa: E402

from verispec.core.rng import SeededRng  # noqa: E402
from verispec.core.rows import LogitRows  # noqa: E402
from verispec.core.sampling import SamplingParams  # noqa: E402
from verispec.verify.registry import get_method  # noqa: E402

RULES = ["rrs", "rrsw", "spechub", "traversal"]


def old_verifiers(base: str) -> dict:
    """The tree rules as of ``base``, loaded as modules old_rrs / old_spechub / old_traversal."""
    root = Path(__file__).resolve().parents[1]
    folder = Path(tempfile.mkdtemp(prefix="old-tree-rules-"))
    modules = {}
    for name in ("rrs", "spechub", "traversal"):
        source = subprocess.run(["git", "show", f"{base}:src/verispec/verify/{name}.py"], cwd=root,
                                check=True, capture_output=True, text=True).stdout
        source = source.replace("from verispec.verify.rrs import top_down", "from old_rrs import top_down")
        path = folder / f"old_{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"old_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"old_{name}"] = module
        spec.loader.exec_module(module)
        modules[name] = module
    return {"rrs": modules["rrs"].RRS(), "rrsw": modules["rrs"].RRSw(), "spechub": modules["spechub"].SpecHub(),
            "traversal": modules["traversal"].TraversalVerification()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base", default="082bf3c")
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--nodes", type=int, default=33)
    parser.add_argument("--temperature", type=float, default=0.6)
    parser.add_argument("--top-p", type=float, default=0.95)
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--rules", nargs="+", default=RULES, choices=RULES)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    old = old_verifiers(args.base)
    params = SamplingParams(args.temperature, top_p=args.top_p)
    bank = ro.LogitBank(args.vocab, args.nodes + 1, 0)
    print(f"# V = {args.vocab}, {args.nodes} nodes, T = {args.temperature}, top_p = {args.top_p}; "
          f"{args.repeats} x {args.trees} rounds; ms per verify (median); old = {args.base}, new = working tree")
    print(f"{'rule':10} | {'fresh old':>9} {'new':>7} {'old/new':>7} {'IQR':>11} | "
          f"{'cached old':>10} {'new':>7} {'old/new':>7} {'IQR':>11} | agree")
    for rule in args.rules:
        trees = []
        for t in range(args.trees):
            bank.index.clear()
            skeleton = ro.draw_skeleton(rule, args.nodes, SeededRng(t), ro.DraftFn(bank, params))
            trees.append((skeleton, bank.target[[bank.row_of(p) for p in skeleton.prefixes]].contiguous()))
        variants = {"old": old[rule], "new": get_method(rule).verifier}
        times = {(kind, name): [] for kind in ("fresh", "cached") for name in variants}
        agree = True
        gc.disable()
        try:
            for repeat in range(args.repeats):
                for t, (skeleton, logits) in enumerate(trees):
                    order = ["old", "new"] if (repeat + t) % 2 == 0 else ["new", "old"]
                    outputs = {}
                    for name in order:
                        tree = skeleton.with_target(LogitRows(logits, params), validate=False)
                        for kind in ("fresh", "cached"):
                            tic = time.perf_counter()
                            result = variants[name].verify(tree, SeededRng(1000 * repeat + t))
                            times[kind, name].append(time.perf_counter() - tic)
                        outputs[name] = result.output_tokens
                    agree &= outputs["old"] == outputs["new"]
        finally:
            gc.enable()

        def cell(kind):
            before, after = np.array(times[kind, "old"]), np.array(times[kind, "new"])
            ratio = before / after
            return (f"{np.median(before) * 1e3:9.2f} {np.median(after) * 1e3:7.2f} {np.median(ratio):7.2f} "
                    f"{np.percentile(ratio, 25):5.2f}-{np.percentile(ratio, 75):<5.2f}")

        print(f"{rule:10} | {cell('fresh')} | {cell('cached'):>9}  | {agree}", flush=True)


if __name__ == "__main__":
    main()

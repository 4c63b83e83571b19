"""A/B of rule code: the rules of this checkout against the same rule files at an older git
ref, in ONE process, on the engine's lazy path (rows read through ``core.rows.LogitRows``).

Usage:
    python benchmarks/rule_code_ab.py --ref 082bf3c [--rules bv nss spectr qfree] [--vocab 128256]
        [--nodes 33] [--repeats 7] [--trees 3]

The old rule files (src/verispec/verify/<rule file>.py at --ref) are loaded as separate modules
next to the current package, so both variants share everything else (core.rows, the trees, the
random numbers); an old file that imports a helper which has moved since (e.g. bv.py from before
the row helpers moved to verify/path_rows.py) stops the run with a message naming it. Per cell: the trees and logits of ``round_overhead.py`` (same generator), then
old, new, old, new, ... per tree and repeat (the order flips every repeat), each timed like
round_overhead's "after" variant (LogitRows over the target logits, the rule, the accepted path).
Prints per rule: median ms old / new, and the ratio old/new of each (tree, repeat) pair, timed
back to back (median and 10th / 90th percentiles: the spread on a shared machine).
Outputs of old and new must agree on the same random numbers when the old code drew the same way
(both are exact; a differing draw order is reported, not an error).
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
import round_overhead as overhead  # noqa: E402

from verispec.core.rng import SeededRng  # noqa: E402
from verispec.verify.registry import get_method  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# rule name -> (file under src/verispec/verify, class name)
RULE_FILES = {
    "bv": ("bv", "BlockVerification"),
    "nss": ("nss", "NaiveSpecInfer"),
    "qfree": ("qfree", "QFreeTreeVerification"),
    "spectr": ("spectr", "SpecTr"),
    "sd": ("sd", "SpeculativeSampling"),
}


def old_verifier(rule: str, ref: str, workdir: Path):
    module_file, class_name = RULE_FILES[rule]
    source = subprocess.run(["git", "show", f"{ref}:src/verispec/verify/{module_file}.py"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout
    path = workdir / f"old_{module_file}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"old_{module_file}", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:  # the old file imports a helper that has moved since --ref
        raise SystemExit(f"the {module_file}.py of {ref} cannot run beside this checkout: {error}. Pick a later "
                         f"--ref, or leave {rule} out of --rules") from error
    return getattr(module, class_name)()


def measure(rule, old, new, vocab, nodes, params, bank, repeats, num_trees, seed):
    trees = []
    for t in range(num_trees):
        bank.index.clear()
        skeleton = overhead.draw_skeleton(rule, nodes, SeededRng(seed + t), overhead.DraftFn(bank, params))
        trees.append((skeleton, bank.target[[bank.row_of(p) for p in skeleton.prefixes]].contiguous()))
    times = {"old": [], "new": []}
    ratios, agree = [], True
    gc.disable()
    try:
        for repeat in range(repeats):
            for t, (skeleton, logits) in enumerate(trees):
                order = (("old", old), ("new", new)) if (repeat + t) % 2 == 0 else (("new", new), ("old", old))
                outputs, spent = {}, {}
                for name, verifier in order:
                    tic = time.perf_counter()
                    _, result = overhead.after(skeleton, logits, params, verifier, SeededRng(1000 * repeat + t))
                    spent[name] = time.perf_counter() - tic
                    times[name].append(spent[name])
                    outputs[name] = result.output_tokens
                agree &= outputs["old"] == outputs["new"]
                ratios.append(spent["old"] / spent["new"])  # one pair: same tree, same random numbers
    finally:
        gc.enable()
    return np.median(times["old"]) * 1e3, np.median(times["new"]) * 1e3, np.array(ratios), agree


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ref", required=True, help="git ref holding the old rule files")
    parser.add_argument("--rules", nargs="+", default=["bv", "nss", "qfree", "spectr"], choices=sorted(RULE_FILES))
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--nodes", type=int, default=33)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--trees", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"# old = {args.ref}, new = working tree; V = {args.vocab}, {args.nodes} nodes, 1 thread, "
          f"{args.repeats} repeats x {args.trees} trees, old/new interleaved; load {os.getloadavg()[0]:.2f}")
    print(f"{'rule':8} {'T':>4} {'top_p':>5} | {'old ms':>8} {'new ms':>8} | old/new per pair: median [p10, p90] | same outputs")
    bank = overhead.LogitBank(args.vocab, args.nodes + 1, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        for params in overhead.SAMPLING:
            for rule in args.rules:
                old = old_verifier(rule, args.ref, Path(tmp))
                new = get_method(rule).verifier
                old_ms, new_ms, ratios, agree = measure(rule, old, new, args.vocab, args.nodes, params, bank,
                                                        args.repeats, args.trees, args.seed)
                print(f"{rule:8} {params.temperature:4g} {params.top_p:5g} | {old_ms:8.2f} {new_ms:8.2f} | "
                      f"{np.median(ratios):6.1f} [{np.percentile(ratios, 10):5.1f}, {np.percentile(ratios, 90):5.1f}] | {agree}", flush=True)
    print(f"# load at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()

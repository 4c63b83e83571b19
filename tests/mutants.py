"""Mutation check of the exactness suite: apply plausible one-line bugs to a temporary
copy of ``src/`` and run the tests that must catch them. Every mutant must be caught.

    PYTHONPATH=src OMP_NUM_THREADS=1 python tests/mutants.py            # all mutants
    PYTHONPATH=src OMP_NUM_THREADS=1 python tests/mutants.py tie_select  # by name
    python tests/mutants.py --list

The mutants live in ``tests/mutant_catalog/``, one module per layer of ``src/verispec``. Each
mutant is a list of exact text substitutions (each must match exactly once, or the mutant
is reported NOT APPLIED: the source moved and the mutant needs updating) and the test files to
run. Prints a table: mutant -> caught or SURVIVED, the first failing tests, seconds. Exit status
1 if any mutant survived or could not be applied. Not collected by pytest (no ``test_`` prefix).

Equivalent mutants left out on purpose: where q(x) = 0 sits in the local order (ratio 0 instead of
+inf) never changes the law, since such tokens carry no draft mass and are never drafted.
Traversal's zeroing of the removed tokens in Q_u on the support (verify/traversal.py, ``q_now[...]
= 0``) is equivalent too: a child x is rejected only with a_u P_u(x) < Q_u(x), so the update sets
P_u(x) = 0 and every later surplus at x is [0 - Q_u(x)]_+ = 0 whatever Q_u(x) holds. The
root-alone shortcut's bound written as a ratio, (1 + k a) / cost(k) < 1 / cost(1), is the gain
form 1 + k a - cost(k) / cost(1) < 0 multiplied by cost(k) > 0: the same inequality.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script, sys.path[0] is tests/: import the catalog as tests.mutant_catalog
    sys.path.insert(1, str(REPO))

from tests.mutant_catalog import MUTANTS, PACKAGE, Mutant  # noqa: E402


def apply(mutant: Mutant, root: Path) -> str | None:
    """Edit the copy under ``root``; returns an error text if an edit does not match once."""
    for relative, old, new in mutant.edits:
        path = root / PACKAGE / relative
        text = path.read_text()
        count = text.count(old)
        if count != 1:
            return f"{relative}: pattern found {count} times"
        path.write_text(text.replace(old, new))
    return None


def run(mutant: Mutant, timeout: int) -> tuple[str, str, float]:
    with tempfile.TemporaryDirectory(prefix=f"mutant-{mutant.name}-") as tmp:
        root = Path(tmp)
        shutil.copytree(REPO / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        problem = apply(mutant, root)
        if problem:
            return "NOT APPLIED", problem, 0.0
        env = dict(os.environ, PYTHONPATH=str(root / "src"), OMP_NUM_THREADS="1", PYTHONDONTWRITEBYTECODE="1")
        start = time.perf_counter()
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pytest", "-q", "--maxfail=2", "-rf", "-p", "no:cacheprovider", *mutant.tests],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return "TIMEOUT", "", time.perf_counter() - start
        seconds = time.perf_counter() - start
        failed = re.findall(r"^FAILED (\S+)", proc.stdout, flags=re.M)
        if proc.returncode == 0:
            return "SURVIVED", "", seconds
        if not failed:
            return "ERROR", proc.stdout[-400:].replace("\n", " "), seconds
        return "caught", ", ".join(f.split("/")[-1] for f in failed), seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="mutants to run (default: all)")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--timeout", type=int, default=900)
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.names or m.name in args.names]
    if args.list or not chosen:
        for m in MUTANTS:
            print(f"{m.name:26s} {m.description}")
        return 0 if chosen or args.list else 2
    print(f"| mutant | what it breaks | result | caught by | s |\n|---|---|---|---|---|")
    bad = 0
    for mutant in chosen:
        status, detail, seconds = run(mutant, args.timeout)
        bad += status != "caught"
        print(f"| {mutant.name} | {mutant.description} | {status} | {detail} | {seconds:.0f} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

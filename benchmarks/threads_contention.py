"""Torch threads under CPU contention: ``verispec generate`` with 1 thread, 2 threads, and 2 threads
with OMP_WAIT_POLICY=PASSIVE, on a quiet machine and with a busy-loop hog on one core.

Each run is its own process (OpenMP reads OMP_* once, at start); configurations are interleaved
per repetition (A B C A B C ...), the hog starts before and stops after each group, and tokens/s
is the decode rate that ``generate`` prints (model loading excluded). A run that takes longer
than --timeout seconds is recorded as such.

    python benchmarks/threads_contention.py --reps 3 --tokens 24 --code-path /path/to/checkout/src
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

# None: OMP_WAIT_POLICY unset (libgomp's default: spin, then sleep); measure a checkout whose CLI does
# not set the policy itself (--code-path) to see that default
CONFIGS = {"1 thread": ("1", None), "2 threads": ("2", None), "2 threads PASSIVE": ("2", "PASSIVE"),
           "CLI default": (None, None)}  # neither variable set: what a user of --code-path's checkout gets
RATE = re.compile(r"([0-9.]+) tokens/s")


def run_once(threads: str, policy: str | None, tokens: int, timeout: float, code_path: str) -> float | None:
    env = {**os.environ, "PYTHONPATH": code_path}
    env.pop("OMP_WAIT_POLICY", None)
    env.pop("OMP_NUM_THREADS", None)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    if policy == "PASSIVE":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    command = [sys.executable, "-m", "verispec", "generate", "Write a short poem about the sea.", "--max-new-tokens", str(tokens),
               "--temperature", "0", "--seed", "0"]
    try:
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    match = RATE.search(done.stderr)
    if not match:
        raise RuntimeError(done.stderr[-2000:])
    return float(match.group(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--timeout", type=float, default=150.0)
    parser.add_argument("--code-path", default="src", help="PYTHONPATH of the verispec to measure")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma list of: {', '.join(CONFIGS)}")
    args = parser.parse_args()
    rates: dict[tuple[str, str], list[float | None]] = {}
    for rep in range(args.reps):
        for load in ("quiet", "hog"):
            hog = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if load == "hog" else None
            try:
                names = args.configs.split(",")
                names = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order per repetition
                for name in names:
                    threads, policy = CONFIGS[name]
                    started = time.monotonic()
                    rate = run_once(threads, policy, args.tokens, args.timeout, args.code_path)
                    rates.setdefault((load, name), []).append(rate)
                    print(f"rep {rep} {load:5s} {name:18s} {'timeout' if rate is None else f'{rate:6.1f} tok/s'} "
                          f"({time.monotonic() - started:.0f} s wall)", flush=True)
            finally:
                if hog is not None:
                    hog.kill()
                    hog.wait()
    print("\nload   config              median tok/s   min    max   (runs)")
    for (load, name), values in rates.items():
        done = [v for v in values if v is not None]
        timeouts = len(values) - len(done)
        summary = f"{statistics.median(done):8.1f}   {min(done):6.1f} {max(done):6.1f}" if done else "     n/a"
        print(f"{load:6s} {name:18s} {summary}   ({len(done)} runs{f', {timeouts} over {args.timeout:.0f} s' if timeouts else ''})")


if __name__ == "__main__":
    main()

"""How many torch (OpenMP) threads a decode uses by default: the cores this process may run on.

A decode of a small model is a long chain of short parallel regions, each ending at a barrier.
With OpenMP's default wait policy the threads spin at those barriers, and when another process
holds one of the cores a 2-thread decode collapsed (> 150 s for 24 tokens instead of ~5 s); with
``OMP_WAIT_POLICY=PASSIVE`` (set by the command line before torch loads) waiting threads sleep,
and 2 threads were then as fast or faster than 1 thread both on a busy machine and with a
busy-loop hog on one core (``benchmarks/threads_contention.py``: the Linux scheduler shares CPU
time per thread, so a decode with more threads also gets a larger share of a crowded machine).
So the default is simply the cores this process may use (``os.sched_getaffinity``, which honours
taskset and cgroup cpusets, unlike ``os.cpu_count``), shared among the workers, at least 1.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_threads(workers: int = 1, cores: int | None = None, environ=None) -> int:
    """Torch threads per decode for ``workers`` decodes running side by side: OMP_NUM_THREADS
    when the environment sets it (the user's choice wins), else the usable cores; divided among
    the workers, at least 1. cores / environ: for tests."""
    environ = os.environ if environ is None else environ
    if cores is None:
        explicit = environ.get("OMP_NUM_THREADS", "").strip()
        cores = int(explicit) if explicit.isdigit() and int(explicit) > 0 else usable_cores()
    return max(1, cores // max(1, workers))

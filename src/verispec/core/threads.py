"""How many torch (OpenMP) threads a decode should use on the cores this process actually gets.

A decode of a small model is a long chain of short parallel regions; every region ends at a
barrier. When another process holds one of the cores, a thread of the decode waits for its
partner at every barrier, so more threads than free cores makes a decode far SLOWER than one
thread (measured: ``benchmarks/threads_contention.py``). The default is therefore the cores this
process may run on (``os.sched_getaffinity``, which honours taskset / cgroup cpusets) minus the
ones other work keeps busy (the 1-minute load average), shared among the workers, at least 1.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask), else the machine's count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def default_threads(workers: int = 1, cores: int | None = None, load: float | None = None) -> int:
    """Torch threads per decode for ``workers`` decodes running side by side.

    cores / load: for tests; by default ``usable_cores()`` and the 1-minute load average (runnable
    processes, capped at the machine's cores, since this process's cores are all it can use).
    """
    cores = usable_cores() if cores is None else cores
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):
            load = 0.0
    free = max(1, round(cores - min(load, cores)))
    return max(1, free // max(1, workers))

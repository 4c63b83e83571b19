"""Several continuous batches side by side (``verispec serve --batch-replicas N``).

One ``BatchScheduler`` runs every round on one thread, so its forwards use the torch threads it was
given and no more. On a CPU where a second torch thread barely speeds up a forward (2-core machines:
it waits on memory, or spins while another process holds the core), the other cores are better used
by a second batch than by a second thread: ``ReplicatedBatches`` runs N batches, each with its own
loop thread, KV caches and token-tree tables, over ONE set of weights (the native runner's packed
and stacked weights are shared), and sends each request to the replica with the fewest requests
(running + waiting). A request's law and seeded text are its solo ones in any replica, as in one
batch. Each replica keeps its own token-tree tables: they are written every round, by that
replica's thread alone.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from verispec.core.threads import usable_cores
from verispec.serve.batching import BatchScheduler
from verispec.serve.workers import DecodeSettings, Job, JobEvent, QueueFull

# slots a replica keeps at least when the replica count is chosen for the user: fewer and its
# batch stays too small to gain from batching (4 sequences in one forward cost ~1.8x one alone)
MIN_SLOTS_PER_REPLICA = 4


def default_replicas(max_batch: int, device: str = "cpu", backend: str = "auto", cores: int | None = None) -> int:
    """``--batch-replicas`` when not given: one replica per usable core on a CPU with torch, as long
    as each keeps ``MIN_SLOTS_PER_REPLICA`` of ``max_batch`` slots; 1 on a GPU (the replicas would
    share one device) and on llama.cpp (one context per replica, each with its own cache). Measured
    on a 2-core Zen 5 (docs/numbers.md): 2 replicas x 1 torch thread served 1.05x / 1.24x the
    tokens of one batch x 1 thread at 4 / 8 clients, and one batch with 2 threads was the slowest."""
    if str(device) != "cpu" or backend == "llamacpp":
        return 1
    cores = usable_cores() if cores is None else cores
    return max(1, min(cores, int(max_batch) // MIN_SLOTS_PER_REPLICA))


class ReplicatedBatches:
    """The ``WorkerPool`` interface (submit / check / start / shutdown / queue_depth / busy_workers)
    over ``replicas``: batch schedulers over the same weights, each with its own thread."""

    scheduler = "batch"

    def __init__(self, replicas: list[BatchScheduler]):
        if not replicas:
            raise ValueError("ReplicatedBatches needs at least one batch scheduler")
        self.replicas = list(replicas)
        self.max_batch = sum(replica.max_batch for replica in self.replicas)
        self.max_queue = sum(replica.max_queue for replica in self.replicas)
        self.threads_per_worker = self.replicas[0].threads_per_worker
        self.workers = [worker for replica in self.replicas for worker in replica.workers]
        self._turns = itertools.count()  # ties between equally loaded replicas go round in turn
        # one admission lock for all replicas, held by ``submit`` while it tries them: a request is
        # refused only when every replica is full at one instant (sum of running + queued >= sum of
        # slots + queue places), never because one freed a place after it was tried
        self._admission_lock = threading.RLock()
        for replica in self.replicas:
            replica._admission.lock = self._admission_lock

    # hooks of the app (metrics): set on every replica
    @property
    def on_finished(self) -> Callable[[Job, JobEvent], None] | None:
        return self.replicas[0].on_finished

    @on_finished.setter
    def on_finished(self, hook) -> None:
        for replica in self.replicas:
            replica.on_finished = hook

    @property
    def on_step(self) -> Callable[[int], None] | None:
        return self.replicas[0].on_step

    @on_step.setter
    def on_step(self, hook) -> None:
        for replica in self.replicas:
            replica.on_step = hook

    @property
    def queue_depth(self) -> int:
        return sum(replica.queue_depth for replica in self.replicas)

    @property
    def busy_workers(self) -> int:
        return sum(replica.busy_workers for replica in self.replicas)

    @property
    def accepting(self) -> bool:
        return all(replica.accepting for replica in self.replicas)

    def start(self) -> None:
        for replica in self.replicas:
            replica.start()

    def shutdown(self, grace_seconds: float = 10.0) -> None:
        """Stop every replica accepting at once, then shut each down (their grace periods overlap:
        the first waits for its own requests while the others' keep running)."""
        for replica in self.replicas:
            replica._accepting = False
        for replica in self.replicas:
            replica.shutdown(grace_seconds)

    def check(self, settings: DecodeSettings) -> None:
        self.replicas[0].check(settings)

    def submit(self, job: Job) -> None:
        """Queue ``job`` on the least loaded replica that has room (equally loaded ones in turn, so
        requests that arrive one after another on an idle server still spread); ``QueueFull`` (with
        the shortest Retry-After) when none has, ``ShuttingDown`` once the server stops accepting."""
        with self._admission_lock:
            return self._submit(job)

    def _submit(self, job: Job) -> None:
        refusals: list[QueueFull] = []
        turn, count = next(self._turns), len(self.replicas)

        def load_then_turn(index: int) -> tuple[int, int]:
            replica = self.replicas[index]
            return replica.busy_workers + replica.queue_depth, (index - turn) % count

        for replica in (self.replicas[i] for i in sorted(range(count), key=load_then_turn)):
            try:
                return replica.submit(job)
            except QueueFull as full:
                refusals.append(full)
        raise min(refusals, key=lambda full: full.retry_after)

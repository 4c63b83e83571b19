"""Worker threads over one shared model: a bounded queue, N decoders, cancellation, shutdown.

The server's second scheduler (``--scheduler workers``; the default is the continuous batch of
``serve.batching``), and the one for targets the batched runner cannot run (llama.cpp, the
transformers forward). Each request is decoded alone, batch size 1: each of N worker threads
owns a target adapter (its own KV cache) and a draft adapter over the SAME ``torch`` modules
(weights shared, not copied; on bf16 CPU the native runner keeps one packed copy of the linear
weights per adapter, see ``models.native_llama``), builds a ``SpeculativeDecoder`` per request
and runs it. Requests wait in a bounded FIFO; a full queue is refused at once
(``QueueFull`` -> HTTP 429 with Retry-After) instead of piling up latency.

A decode is the engine's round generator; the worker checks the job's cancel flag (client gone),
its time limit and the pool's abort flag after every round and stops iterating, so a cancelled
request frees its worker within one round.

Torch threads: ``torch.set_num_threads`` is set inside every worker thread (OpenMP's thread count
is per calling thread) to ``threads_per_worker``, by default ``core.threads.default_threads``: the
cores this process may use divided among the workers (at least 1), so that N parallel decodes do
not oversubscribe the cores.
"""

from __future__ import annotations

import copy
import logging
import math
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from verispec.core.threads import default_threads
from verispec.engine.batch import token_tree_copy
from verispec.engine.cost_model import OnlineCostModel
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import TokenTreeDrafter
from verispec.engine.results import GenerationOutput
from verispec.engine.streaming import TextStream

LOG = logging.getLogger(__name__)
FINISH_REASONS = {"eos": "stop", "stop_string": "stop", "max_new_tokens": "length", "context": "length", "time_limit": "length"}


@dataclass(frozen=True)
class DecodeSettings:
    """Everything one request chooses: the rule and draft shape, sampling, limits, seed."""

    method: str
    num_drafts: int
    draft_len: int
    tree: tuple[int, ...] | None
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    stop: tuple[str, ...]
    seed: int


@dataclass
class TextDelta:
    """Newly settled text of a streamed answer."""

    text: str


@dataclass
class JobFinished:
    """A decode that ran to an end: EOS, stop string, max_tokens, context or time limit."""

    output: GenerationOutput
    text: str
    finish_reason: str  # OpenAI's: "stop" | "length"
    stop_reason: str  # the engine's (eos, stop_string, max_new_tokens, context) or time_limit
    queue_seconds: float
    worker: int


@dataclass
class JobFailed:
    """A decode that did not end normally. kind: cancelled | shutdown | internal."""

    kind: str
    message: str


JobEvent = TextDelta | JobFinished | JobFailed


@dataclass
class Job:
    """One request in the queue. ``emit`` is called from a worker thread (must be thread-safe)."""

    prompt_ids: list[int]
    settings: DecodeSettings
    emit: Callable[[JobEvent], None]
    stream: bool = False
    time_limit: float = math.inf
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.perf_counter)
    rounds: int = 0  # rounds decoded so far (read by tests and metrics)


class QueueFull(Exception):
    """The bounded queue is full; retry after ``retry_after`` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the request queue is full; retry after {retry_after} s")
        self.retry_after = retry_after


class ShuttingDown(Exception):
    """The pool no longer accepts requests."""


class Admission:
    """The requests a scheduler holds, queued or decoding, against its capacity (slots + queue
    places), counted under one lock: a request enters when it is submitted and leaves when its
    final event is reported, so handing it from the queue to a slot never changes the count. (The
    bounded ``queue.Queue`` counted only the queued ones: a request enqueued but not yet taken by
    a loop whose slot had just freed held a queue place, and a concurrent one got a spurious 429.)
    ``lock`` is re-entrant so that ``ReplicatedBatches`` can hold the one all replicas share while
    it tries each in turn."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.count = 0
        self.lock = threading.RLock()

    def enter(self) -> bool:
        """Count one more request if there is room; False (nothing counted) when full."""
        with self.lock:
            if self.count >= self.capacity:
                return False
            self.count += 1
            return True

    def leave(self) -> None:
        with self.lock:
            self.count -= 1


def decode_rounds(decoder: SpeculativeDecoder, prompt_ids: list[int]) -> Iterator[GenerationOutput]:
    """The engine's per-round snapshots (the generator behind ``generate`` and ``stream``).

    ``TextDecoding._run`` is the only per-round generator the engine has; stopping iteration
    stops the decode, which is how cancellation works without touching the engine.
    """
    return decoder._run(prompt_ids)


class Worker:
    """One decoding slot: its own target / draft adapters (own KV caches) and tokenizer copy.

    target_adapter: ``HFModelAdapter``; draft: an ``HFModelAdapter``, "ngram" or None (plain
    decoding only). The tokenizer is copied because Rust tokenizers refuse concurrent use from
    threads while another thread changes their settings ("Already borrowed").
    """

    def __init__(self, index: int, target_adapter, draft, tokenizer):
        self.index = index
        self.target = target_adapter
        self.draft = draft
        self.tokenizer = copy.deepcopy(tokenizer)
        self.token_tree: TokenTreeDrafter | None = None  # the tables this worker's token trees learn in
        # the round timings of this worker's own requests (its first decoder's model, at the target's
        # prior): they describe the machine, so later requests start from what earlier ones measured
        self.cost_model: OnlineCostModel | None = None

    def decoder(self, settings: DecodeSettings, target=None, draft=None) -> SpeculativeDecoder:
        """A decoder for one request over this worker's adapters, or over ``target`` and ``draft``
        (a batch's slot adapters; cheap: no model work). Token trees of this worker's own requests share one adjacency table and
        acceptance estimates, which describe the target: each request starts from what the
        earlier ones learned (as ``generate`` does from prompt to prompt), and so does their cost model."""
        decoder = SpeculativeDecoder(
            target or self.target,
            None if settings.method == "ar" else self.draft if draft is None else draft,
            tokenizer=self.tokenizer,
            method=settings.method,
            num_drafts=settings.num_drafts,
            draft_len=settings.draft_len,
            tree=None if settings.tree is None else list(settings.tree),
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
            max_new_tokens=settings.max_new_tokens,
            stop=settings.stop,
            seed=settings.seed,
            cost_model=self.cost_model if target is None else None,
        )
        if target is None and self.cost_model is None:
            self.cost_model = decoder.cost_model
        if target is None and isinstance(decoder.drafter, TokenTreeDrafter):
            if self.token_tree is None:
                self.token_tree = decoder.drafter
            else:
                decoder.drafter = token_tree_copy(self.token_tree)
        return decoder


def queue_job(scheduler, job: Job, slots: int) -> None:
    """A scheduler's ``submit`` (``WorkerPool`` and ``BatchScheduler`` share it): queue ``job`` or
    raise at once, never block: ``ShuttingDown`` once it stops accepting, ``QueueFull`` when the
    queue is full, with Retry-After = the running mean decode time x (queue + slots) / slots, where
    ``slots`` requests are decoded at once. Full means (running + queued) >= (slots + queue
    places), counted by ``scheduler._admission`` (see ``Admission``), not the queue's own size."""
    if not scheduler._accepting:
        raise ShuttingDown("the server is shutting down")
    if not scheduler._admission.enter():
        waiting = scheduler.max_queue + slots
        raise QueueFull(max(1, math.ceil(scheduler._mean_seconds * waiting / slots)))
    scheduler._queue.put_nowait(job)  # unbounded: the admission count bounds it


def drain_for_shutdown(scheduler, grace_seconds: float) -> None:
    """The first half of a scheduler's shutdown (``WorkerPool`` and ``serve.batching``'s
    ``BatchScheduler`` share it): stop accepting, let queued and running jobs finish for up to
    ``grace_seconds`` (until every admitted job has been reported), then set the abort flag
    (running decodes stop after their current round) and fail every job still queued with kind
    "shutdown"."""
    scheduler._accepting = False
    deadline = time.monotonic() + grace_seconds
    # the admission count, not queue_depth + busy_workers: a job the loop has taken from the queue
    # but not yet started is in neither, and the grace would end while it is about to run
    while time.monotonic() < deadline and scheduler._admission.count:
        time.sleep(0.02)
    scheduler._abort.set()
    while True:
        try:
            job = scheduler._queue.get_nowait()
        except queue.Empty:
            return
        if job is not None:
            scheduler._report(job, JobFailed("shutdown", "the server shut down before this request started"))


class WorkerPool:
    """N worker threads over a bounded queue of ``Job``s.

    workers: ``Worker`` objects (one thread each); max_queue >= 1: jobs waiting beyond the ones
    being decoded; on_finished(job, event): called in the worker thread after every job (metrics).
    """

    scheduler = "workers"

    def __init__(self, workers: list[Worker], max_queue: int, threads_per_worker: int | None = None,
                 on_finished: Callable[[Job, JobEvent], None] | None = None):
        if not workers:
            raise ValueError("a pool needs at least one worker")
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.workers = workers
        self.max_queue = max_queue
        self.threads_per_worker = threads_per_worker or default_threads(len(workers))
        self.on_finished = on_finished
        self._queue: queue.Queue[Job | None] = queue.Queue()  # bounded by the admission count
        self._admission = Admission(len(workers) + max_queue)  # every job from submit to its report
        self._lock = threading.Lock()
        self._busy = 0
        self._accepting = False
        self._abort = threading.Event()
        self._threads: list[threading.Thread] = []
        self._mean_seconds = 1.0  # running mean decode time, for Retry-After

    # ------------------------------------------------------------------ state
    @property
    def queue_depth(self) -> int:
        return self._queue.qsize()

    @property
    def busy_workers(self) -> int:
        with self._lock:
            return self._busy

    @property
    def accepting(self) -> bool:
        return self._accepting

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._threads:
            return
        self._accepting = True
        for worker in self.workers:
            thread = threading.Thread(target=self._serve, args=(worker,), name=f"verispec-worker-{worker.index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def shutdown(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting; let queued and running jobs finish for up to ``grace_seconds``; then
        cancel what is left (running decodes stop after their current round, queued jobs fail
        with kind "shutdown") and join the threads."""
        drain_for_shutdown(self, grace_seconds)
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads = []

    # ---------------------------------------------------------------- submit
    def submit(self, job: Job) -> None:
        """Queue a job or raise ``QueueFull`` / ``ShuttingDown`` at once (never blocks)."""
        queue_job(self, job, slots=len(self.workers))

    def check(self, settings: DecodeSettings) -> None:
        """Raise ``ConfigError`` if ``settings`` cannot make a decoder (bad method / shape).
        Building a decoder only reads the adapters, so worker 0's are safe to use from here."""
        self.workers[0].decoder(settings)

    # ----------------------------------------------------------------- worker
    def _serve(self, worker: Worker) -> None:
        torch.set_num_threads(self.threads_per_worker)
        for adapter in (worker.target, worker.draft):
            if hasattr(adapter, "set_threads"):  # llama.cpp contexts keep their own thread count
                adapter.set_threads(self.threads_per_worker)
        while True:
            job = self._queue.get()
            if job is None:
                return
            with self._lock:
                self._busy += 1
            try:
                event = self._run(worker, job)
            except Exception as error:  # a bug, not bad input: input is validated before queueing
                event = JobFailed("internal", f"{type(error).__name__}: {error}")
            finally:
                with self._lock:
                    self._busy -= 1
            try:
                self._report(job, event)
            except Exception:  # the hook failed; the request has its event, the worker goes on
                LOG.exception("the on_finished hook failed")

    def _run(self, worker: Worker, job: Job) -> JobEvent:
        queue_seconds = time.perf_counter() - job.enqueued_at
        if job.cancelled.is_set():
            return JobFailed("cancelled", "the client went away before the request started")
        if self._abort.is_set():
            return JobFailed("shutdown", "the server shut down before this request started")
        started = time.perf_counter()
        deadline = started + job.time_limit
        decoder = worker.decoder(job.settings)
        deltas = TextStream(job.settings.stop)
        rounds = decode_rounds(decoder, job.prompt_ids)
        output, stop_reason = None, None
        try:
            for output in rounds:
                job.rounds += 1
                if job.stream:
                    delta = deltas.push(output.text)
                    if delta:
                        job.emit(TextDelta(delta))
                if job.cancelled.is_set():
                    return JobFailed("cancelled", "the client went away")
                if self._abort.is_set():
                    return JobFailed("shutdown", "the server shut down during this request")
                if time.perf_counter() > deadline and output.stop_reason == "running":
                    stop_reason = "time_limit"
                    break
        finally:
            rounds.close()
        stop_reason = stop_reason or output.stop_reason
        self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - started)
        if job.stream:
            rest = deltas.push(output.text, final=True)
            if rest:
                job.emit(TextDelta(rest))
        return JobFinished(output, output.text, FINISH_REASONS[stop_reason], stop_reason, queue_seconds, worker.index)

    def _report(self, job: Job, event: JobEvent) -> None:
        """Hand the final event to the hook (metrics) and to the request; a failing hook must not
        kill the worker thread or leave the request waiting. The job leaves the admission count
        first, so a client that sends its next request on this answer finds its place free."""
        self._admission.leave()
        try:
            if self.on_finished is not None:
                self.on_finished(job, event)
        finally:
            job.emit(event)

"""Continuous batching: the server's default scheduler (``--scheduler batch``).

One loop thread decodes every request in ONE running batch (``engine.continuous.ContinuousBatch``):
each round is one packed target forward over all running requests' trees. A request joins the
batch between rounds as soon as a slot is free (at most ``max_batch`` decode at once), streams
its text deltas as its rounds settle tokens, and leaves when it ends: EOS, stop string,
max_tokens, the context, its time limit, or its client going away (seen at the end of its current
round). Requests waiting for a slot sit in a FIFO; a request that finds the running and waiting
ones filling every slot and queue place is refused at once (``QueueFull`` -> HTTP 429 with
Retry-After; counted by ``serve.workers.Admission``), as with the worker threads of ``serve.workers``.

Each request keeps its own decoder (rule, draft shape, sampling, seed, stop strings, limits), so
its law is its solo law and, with the drafter-invariant rules (ar, qfree, nss, gumbel) and its
seed, its text is the text of the same request sent alone (up to batch-variance float flips of
the packed forward). Token-tree requests share one adjacency table and acceptance estimates
(they describe the target and learn from every request); only one thread runs at a time, so the
sharing needs no lock.

A request with the server's draft model joins the batch too when the draft runs on the native
Llama runner: its draft forwards are packed with the other such requests' into one forward of a
second batched runner over the draft's weights (``engine.batch``). A request with a draft head
joins as well: its slot of the batched target forward returns its own hidden states, and the
requests' head steps run as one padded call of the head (loaded once, ``models.head_batch``).
Requests that cannot share the batched forwards (a draft model on another runner) are decoded on a
side worker (its own target and draft adapters over the same weights), one round of one such
request after each batched round, in arrival order: they are served, more slowly, and hold up the
batch by one of their rounds per round. A target the batched runner cannot run (the transformers
forward) cannot use this scheduler at all: ``build_server`` then refuses it with the advice to use
``--scheduler workers``. A llama.cpp target batches in one shared llama.cpp context
(``models.llamacpp_batch``).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from verispec.core.threads import default_threads
from verispec.engine.continuous import BatchSequence, ContinuousBatch
from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.drafters import ModelDrafter, NGramDrafter, TokenTreeDrafter
from verispec.engine.head_drafter import HeadDrafter, is_head_source, load_head_source
from verispec.models.native_llama import NativeLlamaRunner
from verispec.engine.streaming import TextStream
from verispec.serve.workers import (
    FINISH_REASONS,
    Admission,
    DecodeSettings,
    Job,
    JobEvent,
    JobFailed,
    JobFinished,
    TextDelta,
    Worker,
    decode_rounds,
    drain_for_shutdown,
    queue_job,
)

LOG = logging.getLogger(__name__)
BATCH_WORKER, SIDE_WORKER = 0, 1  # the ``worker`` of a response's speculative block


@dataclass
class _Running:
    """A request being decoded: its job, its text stream, when it started."""

    job: Job
    stream: TextStream
    started: float = field(default_factory=time.perf_counter)
    deadline: float = math.inf
    rounds: object = None  # the side path's round generator


class BatchScheduler:
    """The ``WorkerPool`` interface (submit / check / start / shutdown / queue_depth / busy_workers)
    over one continuous batch.

    target: the ``HFModelAdapter`` whose native runner's weights the batch runs (its own KV cache
    is not used); side: a ``Worker`` (own adapters over the same weights) for requests that cannot
    batch and for checking settings; max_batch: requests decoding at once; max_queue: requests
    waiting beyond them; threads: torch threads of the loop (default: every core this process
    may use); on_finished(job, event): called after every request (metrics); on_step(size):
    called after every batched round with the number of requests in it (metrics).
    """

    scheduler = "batch"

    def __init__(self, target, side: Worker, max_batch: int = 8, max_queue: int = 8, threads: int | None = None,
                 on_finished: Callable[[Job, JobEvent], None] | None = None):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.side = side
        self.batch_target = target  # the adapter whose runner's weights the batch multiplies with
        self.workers = [side]
        self.max_batch = int(max_batch)
        self.max_queue = max_queue
        self.threads_per_worker = threads or default_threads(1)
        self.on_finished = on_finished
        self.on_step: Callable[[int], None] | None = None
        # the batch's own decoder only lends its token-tree tables to the requests' decoders
        parent = SpeculativeDecoder(target, "tree", tokenizer=side.tokenizer, method="qfree")
        # the draft model batches when it runs on the native runner (its weights in a batched runner)
        draft = side.draft if isinstance(getattr(side.draft, "runner", None), NativeLlamaRunner) else None
        self.batch = ContinuousBatch(parent, max_batch=max_batch, threads=self.threads_per_worker, draft=draft)
        # a head is loaded once, so that the requests' head steps run as one call of one module
        self._head = load_head_source(side.draft, target) if is_head_source(side.draft) else None
        self._queue: queue.Queue[Job | None] = queue.Queue()  # bounded by the admission count
        self._admission = Admission(self.max_batch + max_queue)  # every job from submit to its report
        self._in_batch: dict[BatchSequence, _Running] = {}
        self._side_waiting: list[Job] = []
        self._side_running: _Running | None = None
        self._accepting = False
        self._abort = threading.Event()
        self._thread: threading.Thread | None = None
        self._mean_seconds = 1.0  # running mean decode time, for Retry-After

    # ------------------------------------------------------------------ state
    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot (queued, or admitted but not yet in a running round)."""
        return self._queue.qsize() + len(self.batch.waiting) + len(self._side_waiting)

    @property
    def busy_workers(self) -> int:
        """Requests being decoded (in the batch or on the side worker)."""
        return len(self.batch.running) + (self._side_running is not None)

    @property
    def accepting(self) -> bool:
        return self._accepting

    # -------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._thread is not None:
            return
        self._accepting = True
        self._thread = threading.Thread(target=self._loop, name="verispec-batch-scheduler", daemon=True)
        self._thread.start()

    def shutdown(self, grace_seconds: float = 10.0) -> None:
        """Stop accepting; let queued and running requests finish for up to ``grace_seconds``; then
        stop the rest (running ones after their current round, queued ones never start: both fail
        with kind "shutdown") and join the loop."""
        drain_for_shutdown(self, grace_seconds)
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=60)
            self._thread = None

    # ---------------------------------------------------------------- submit
    def submit(self, job: Job) -> None:
        """Queue a job or raise ``QueueFull`` / ``ShuttingDown`` at once (never blocks)."""
        queue_job(self, job, slots=self.max_batch)

    def check(self, settings: DecodeSettings) -> None:
        """Raise ``ConfigError`` if ``settings`` cannot make a decoder (bad method / shape)."""
        self.side.decoder(settings)

    def batches(self, settings: DecodeSettings) -> bool:
        """Whether a request with ``settings`` decodes in the batch (its draft is the token trees,
        the n-gram draft, none, a head, or a draft model the batch runs) rather than on the side
        worker (a draft model off the native runner)."""
        drafter = self.side.decoder(settings, draft=self._head).drafter
        if isinstance(drafter, ModelDrafter):
            return self.batch.draft_batches
        return drafter is None or isinstance(drafter, (TokenTreeDrafter, NGramDrafter, HeadDrafter))

    # ------------------------------------------------------------------ loop
    def _loop(self) -> None:
        torch.set_num_threads(self.threads_per_worker)
        for adapter in (self.side.target, self.side.draft):
            if hasattr(adapter, "set_threads"):
                adapter.set_threads(self.threads_per_worker)
        closing = False
        while not (closing and not self._in_batch and not self.batch.active and self._side_running is None
                   and not self._side_waiting):
            idle = not self.batch.active and self._side_running is None and not self._side_waiting
            closing = self._admit(block=idle and not closing) or closing
            self._stop_waiting()
            if self.batch.active:
                self._batched_round()
            self._side_round()

    def _admit(self, block: bool) -> bool:
        """Move queued jobs into the batch while it has free slots (waiting for one when ``block``);
        True once the shutdown sentinel was seen."""
        while len(self.batch.running) + len(self.batch.waiting) < self.max_batch or block:
            try:
                job = self._queue.get(timeout=0.5) if block else self._queue.get_nowait()
            except queue.Empty:
                if block:
                    continue
                return False
            block = False
            if job is None:
                return True
            self._start(job)
        return False

    def _start(self, job: Job) -> None:
        if job.cancelled.is_set():
            return self._report(job, JobFailed("cancelled", "the client went away before the request started"))
        if self._abort.is_set():
            return self._report(job, JobFailed("shutdown", "the server shut down before this request started"))
        try:
            batched = self.batches(job.settings)
        except Exception as error:  # checked before queueing: a bug
            return self._report(job, JobFailed("internal", f"{type(error).__name__}: {error}"))
        if not batched:
            self._side_waiting.append(job)
            return None
        running = _Running(job, TextStream(job.settings.stop))
        drafts = isinstance(self.side.decoder(job.settings).drafter, ModelDrafter)  # on a draft slot
        seq = self.batch.add(lambda target, draft=None: self._decoder(target, job.settings, draft), job.prompt_ids,
                             on_round=lambda output: self._on_round(running, output), drafts=drafts)
        self._in_batch[seq] = running
        return None

    def _decoder(self, target, settings: DecodeSettings, draft=None) -> SpeculativeDecoder:
        """The request's decoder on its batch slot (and draft slot); a token-tree draft shares the
        batch's tables."""
        if draft is None and self._head is not None:
            draft = self._head
        decoder = self.side.decoder(settings, target=target, draft=draft)
        if isinstance(decoder.drafter, TokenTreeDrafter):
            decoder.drafter = self.batch.token_tree_drafter()
        return decoder

    def _on_round(self, running: _Running, output) -> str | None:
        """After each round of a request (in its sequence's turn): stream its new text, and say
        whether it must stop (client gone, server shutting down, time limit)."""
        job = running.job
        if job.rounds == 0:  # its first round: the decode time (and limit) starts when it joined
            running.started = time.perf_counter() - output.seconds
            running.deadline = running.started + job.time_limit
        job.rounds += 1
        if job.stream:
            delta = running.stream.push(output.text)
            if delta:
                job.emit(TextDelta(delta))
        if job.cancelled.is_set():
            return "cancelled"
        if self._abort.is_set():
            return "shutdown"
        if time.perf_counter() > running.deadline:
            return "time_limit"
        return None

    def _stop_waiting(self) -> None:
        """Requests admitted to the batch but not started whose client left (or on shutdown)."""
        for seq in self.batch.waiting:
            job = self._in_batch[seq].job
            if job.cancelled.is_set() or self._abort.is_set():
                self.batch.cancel(seq, "cancelled" if job.cancelled.is_set() else "shutdown")

    def _batched_round(self) -> None:
        try:
            ended = self.batch.step()
        except Exception as error:  # a bug in the shared forward: every request of the batch fails
            LOG.exception("the batched round failed")
            self.batch.close()
            failed, self._in_batch = self._in_batch, {}
            for running in failed.values():
                self._report(running.job, JobFailed("internal", f"{type(error).__name__}: {error}"))
            return
        if self.on_step is not None:
            self.on_step(len(self.batch.running) + len(ended))
        for seq in ended:
            running = self._in_batch.pop(seq)
            self._report(running.job, self._event(running, seq, BATCH_WORKER))

    def _event(self, running: _Running, seq: BatchSequence, worker: int) -> JobEvent:
        job = running.job
        if seq.exception is not None:
            return JobFailed("internal", f"{type(seq.exception).__name__}: {seq.exception}")
        if seq.error is not None:
            return JobFailed("invalid_request", seq.error)
        if seq.stopped == "cancelled":
            return JobFailed("cancelled", "the client went away")
        if seq.stopped == "shutdown" or (seq.stopped is None and seq.output is None):
            return JobFailed("shutdown", "the server shut down during this request")
        return self._finished(running, seq.output, seq.stopped or seq.output.stop_reason, worker)

    def _finished(self, running: _Running, output, stop_reason: str, worker: int) -> JobFinished:
        job = running.job
        self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.perf_counter() - running.started)
        if job.stream:
            rest = running.stream.push(output.text, final=True)
            if rest:
                job.emit(TextDelta(rest))
        queue_seconds = max(0.0, running.started - job.enqueued_at)
        return JobFinished(output, output.text, FINISH_REASONS[stop_reason], stop_reason, queue_seconds, worker)

    # ------------------------------------------------------------ side path
    def _side_round(self) -> None:
        """One round of the request on the side worker (starting the next one when it is free)."""
        if self._side_running is None:
            if not self._side_waiting:
                return
            job = self._side_waiting.pop(0)
            if job.cancelled.is_set() or self._abort.is_set():
                gone = job.cancelled.is_set()
                return self._report(job, JobFailed("cancelled" if gone else "shutdown", "the client went away before the request "
                                                   "started" if gone else "the server shut down before this request started"))
            running = _Running(job, TextStream(job.settings.stop))
            running.deadline = running.started + job.time_limit
            running.rounds = decode_rounds(self.side.decoder(job.settings), job.prompt_ids)
            self._side_running = running
        running = self._side_running
        job = running.job
        event: JobEvent | None = None
        try:
            output = next(running.rounds)
            reason = self._on_round(running, output) if output.stop_reason == "running" else None
            if output.stop_reason != "running":
                event = self._finished(running, output, output.stop_reason, SIDE_WORKER)
            elif reason == "cancelled":
                event = JobFailed("cancelled", "the client went away")
            elif reason == "shutdown":
                event = JobFailed("shutdown", "the server shut down during this request")
            elif reason == "time_limit":
                event = self._finished(running, output, "time_limit", SIDE_WORKER)
        except StopIteration:
            event = JobFailed("internal", "the decode ended without a result")
        except Exception as error:
            event = JobFailed("internal", f"{type(error).__name__}: {error}")
        if event is not None:
            running.rounds.close()
            self._side_running = None
            self._report(job, event)

    def _report(self, job: Job, event: JobEvent) -> None:
        """Hand the final event to the hook (metrics) and to the request; a failing hook must not
        stop the loop or leave the request waiting. The job leaves the admission count first, so a
        client that sends its next request on this answer finds its place free."""
        self._admission.leave()
        try:
            if self.on_finished is not None:
                self.on_finished(job, event)
        except Exception:
            LOG.exception("the on_finished hook failed")
        finally:
            job.emit(event)

"""Admission (``serve.workers.Admission``): a request is refused (``QueueFull`` -> HTTP 429) only when
the running and queued ones fill every slot and queue place, counted under one lock, so that a
request on its way from the queue into a slot never makes a concurrent one see a full server.

The schedulers are driven directly (``submit``) over a tiny random Llama, with 1 slot and 1 queue
place; their loop thread is held by events at the points that matter (no sleeps, no timing)."""

from __future__ import annotations

import threading

import pytest

from verispec.serve.launch import build_batch_scheduler, build_workers
from verispec.serve.workers import DecodeSettings, Job, JobFailed, JobFinished, QueueFull, WorkerPool

SETTINGS = DecodeSettings("ar", 1, 1, None, 0.0, 0, 1.0, 2, (), 0)  # plain greedy decoding, 2 tokens
WAIT = 60  # seconds an event may take before the test fails (never reached when it passes)


class Request:
    """A job and its events. Its final event sets ``done``, then, with ``hold``, keeps the loop
    thread that reports it waiting on ``hold``: the request has left its slot and the loop has not
    yet taken the next queued request into it."""

    def __init__(self, tokenizer, hold: threading.Event | None = None):
        self.events, self.done, self.hold = [], threading.Event(), hold
        self.job = Job(tokenizer.encode("Once upon a time"), SETTINGS, self.emit)

    def emit(self, event) -> None:
        self.events.append(event)
        if isinstance(event, (JobFinished, JobFailed)):
            self.done.set()
            if self.hold is not None:
                assert self.hold.wait(WAIT)


def one_slot_one_place(kind, tiny_pair, tokenizer, may_decode: threading.Event):
    """A scheduler with 1 slot and 1 queue place whose decoding waits for ``may_decode``; and the
    name of its method that takes a job from the queue into the slot (the hand-over)."""
    if kind == "batch":
        pool = build_batch_scheduler(tiny_pair[0], None, tokenizer, max_batch=1, max_queue=1, threads=1)
        pool.batch.step = lambda step=pool.batch.step: (may_decode.wait(WAIT), step())[1]
        return pool, "_start"
    pool = WorkerPool(build_workers(tiny_pair[0], None, tokenizer, 1), max_queue=1, threads_per_worker=1)
    worker = pool.workers[0]

    def decoder(settings, original=worker.decoder, **kwargs):
        built = original(settings, **kwargs)
        built._run = lambda prompt_ids, run=built._run: (may_decode.wait(WAIT), run(prompt_ids))[1]
        return built

    worker.decoder = decoder
    return pool, "_run"


def refused(pool, tokenizer) -> bool:
    try:
        pool.submit(Request(tokenizer).job)
    except QueueFull as full:
        assert full.retry_after >= 1
        return True
    return False


@pytest.mark.parametrize("kind", ["batch", "workers"])
def test_a_request_arriving_while_the_queued_one_moves_into_the_free_slot_is_admitted(kind, tiny_pair, tokenizer):
    may_decode, loop_may_go_on, b_may_start, a_taken, b_taken = (threading.Event() for _ in range(5))
    pool, hand_over = one_slot_one_place(kind, tiny_pair, tokenizer, may_decode)
    a, b, c = Request(tokenizer, hold=loop_may_go_on), Request(tokenizer), Request(tokenizer)

    def taking(*args, original=getattr(pool, hand_over)):  # args end with the job
        if args[-1] is a.job:
            a_taken.set()
        if args[-1] is b.job:  # B is out of the queue and not yet in the slot
            b_taken.set()
            assert b_may_start.wait(WAIT)
        return original(*args)

    setattr(pool, hand_over, taking)
    pool.start()
    try:
        pool.submit(a.job)
        assert a_taken.wait(WAIT)
        pool.submit(b.job)  # A in the slot (its decoding held), B in the queue: full
        assert refused(pool, tokenizer)  # 1 + 1 >= 1 slot + 1 place
        may_decode.set()
        assert a.done.wait(WAIT)  # A has ended and left its slot; the loop is held before it takes B
        assert not b_taken.is_set()
        pool.submit(c.job)  # B is still queued: the old bounded queue refused C here (a spurious 429)
        assert refused(pool, tokenizer)  # B + C fill slot + place: one more is still refused
        loop_may_go_on.set()
        assert b_taken.wait(WAIT)  # B between the queue and the slot: the count does not change
        assert refused(pool, tokenizer)
        b_may_start.set()
        assert b.done.wait(WAIT) and c.done.wait(WAIT)
        assert [type(r.events[-1]) for r in (a, b, c)] == [JobFinished] * 3
        pool.submit(Request(tokenizer).job)  # A, B and C have left the count: admitted
        assert not refused(pool, tokenizer)
    finally:
        for event in (may_decode, loop_may_go_on, b_may_start):
            event.set()
        pool.shutdown(grace_seconds=10)



@pytest.mark.parametrize("kind", ["batch", "workers"])
def test_shutdown_grace_waits_for_a_request_the_loop_has_taken_but_not_started(kind, tiny_pair, tokenizer):
    """A request out of the queue and not yet in a slot counts neither as queued nor as running; the
    grace must still wait for it (it did not: the request failed with "shutdown" at once)."""
    may_decode, may_start, taken = threading.Event(), threading.Event(), threading.Event()
    pool, _ = one_slot_one_place(kind, tiny_pair, tokenizer, may_decode)
    may_decode.set()
    a = Request(tokenizer)
    queue, original_get = pool._queue, pool._queue.get

    def get(*args, **kwargs):  # the loops take jobs with get(timeout=...) or get_nowait() (= get(False))
        job = original_get(*args, **kwargs)
        if job is a.job:  # taken from the queue, held before the loop hands it to a slot
            taken.set()
            assert may_start.wait(WAIT)
        return job

    queue.get = get
    pool.start()
    closing = threading.Thread(target=pool.shutdown, kwargs={"grace_seconds": WAIT})
    try:
        pool.submit(a.job)
        assert taken.wait(WAIT)
        closing.start()
        # the grace is running, not over: the abort flag stays down (the old check set it at once)
        assert not pool._abort.wait(0.5)
        may_start.set()
        assert a.done.wait(WAIT)
        closing.join(WAIT)
        assert not closing.is_alive()
        assert type(a.events[-1]) is JobFinished, a.events[-1]
    finally:
        may_start.set()
        if not closing.is_alive() and not closing.ident:
            pool.shutdown(grace_seconds=1)

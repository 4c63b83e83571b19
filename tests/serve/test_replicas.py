"""Several continuous batches side by side (``serve.replicas``, ``--batch-replicas``) on a real server
over tiny random Llamas: requests spread over the replicas, each answer is the answer the same request
gives alone (greedy and seeded), a full server refuses with 429, and shutdown stops every replica."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.serve.conftest import start_server
from tests.serve.test_batching import PROMPTS, complete
from tests.serve.test_concurrency import LONG, health, wait_for
from verispec.errors import ConfigError
from verispec.serve.launch import build_replicated_batches
from verispec.serve.replicas import ReplicatedBatches
from verispec.serve.workers import Admission, QueueFull


@pytest.fixture(scope="module")
def replicated(tiny_pair, tokenizer):
    handle, pool = start_server((tiny_pair[0], None), tokenizer, scheduler="batch", method="qfree", max_batch=4,
                                max_queue=8, replicas=2)
    yield handle, pool
    handle.stop()


@pytest.mark.parametrize("fields", [{"seed": 7, "temperature": 1.0}, {"temperature": 0}, {"seed": 3, "speculative": {"method": "ar"}}])
def test_requests_spread_over_replicas_and_give_their_text_alone(replicated, fields):
    handle, pool = replicated
    assert isinstance(pool, ReplicatedBatches) and len(pool.replicas) == 2
    alone = [complete(handle.url, prompt, **fields)["choices"][0]["text"] for prompt in PROMPTS[:4]]
    rounds_before = [replica.batch.rounds for replica in pool.replicas]
    with ThreadPoolExecutor(4) as executor:
        together = list(executor.map(lambda p: complete(handle.url, p, **fields), PROMPTS[:4]))
    assert [r["choices"][0]["text"] for r in together] == alone
    # both replicas decoded some of the four (each request went to the least loaded one)
    assert all(replica.batch.rounds > before for replica, before in zip(pool.replicas, rounds_before))
    body = health(handle.url)
    assert body["scheduler"] == "batch" and body["max_batch"] == 4 and body["workers"] == 2


def test_replicas_share_one_set_of_weights(replicated):
    _, pool = replicated
    first, second = pool.replicas
    assert first.batch_target is not second.batch_target  # own adapters, own KV caches
    assert first.batch_target.model is second.batch_target.model  # one module, one set of weights
    # the batched runners' stacked q|k|v and gate|up products: one set (built once, fp32 here)
    assert second.batch_target.runner.fused_linears() is first.batch_target.runner.fused_linears()


def test_a_full_server_refuses_with_429_and_the_others_finish(tiny_pair, tokenizer):
    handle, pool = start_server((tiny_pair[0], None), tokenizer, scheduler="batch", method="qfree", max_batch=2,
                                max_queue=2, replicas=2)
    url = handle.url
    # no round runs until the refusal is checked: on a loaded machine the first requests could
    # otherwise finish before the last one arrives, and the server would never be full
    rounds_may_run = threading.Event()
    for replica in pool.replicas:
        replica.batch.step = lambda step=replica.batch.step: (rounds_may_run.wait(60), step())[1]
    try:
        answers = {}
        runners = [threading.Thread(target=lambda i=i: answers.setdefault(i, httpx.post(url + "/v1/completions",
                                                                                         json={**LONG, "max_tokens": 60}, timeout=120)))
                   for i in range(4)]
        # two first, until each replica's loop has taken its one (one per replica), then two more,
        # one queued per replica (a request counts from submit to its end, so none of the four can
        # see a full server: tests/serve/test_admission.py)
        for runner in runners[:2]:
            runner.start()
        wait_for(lambda: pool.queue_depth == 2 and all(replica._queue.empty() for replica in pool.replicas))
        for runner in runners[2:]:
            runner.start()
        wait_for(lambda: pool.busy_workers + pool.queue_depth == 4)  # 2 running (one per replica) + 2 queued
        refused = httpx.post(url + "/v1/completions", json={**LONG, "max_tokens": 5})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        rounds_may_run.set()
        for runner in runners:
            runner.join(120)
        assert [answers[i].status_code for i in range(4)] == [200] * 4
    finally:
        rounds_may_run.set()
        handle.stop()
    assert not pool.accepting and all(replica._thread is None for replica in pool.replicas)


def test_submit_tries_every_replica_and_reports_the_shortest_retry():
    class Full:
        def __init__(self, load, retry):
            self.load, self.retry, self.max_batch, self.max_queue = load, retry, 1, 1
            self.threads_per_worker, self.workers, self.tried = 1, [], 0
            self._admission = Admission(1)

        busy_workers = property(lambda self: self.load)
        queue_depth = property(lambda self: 0)

        def submit(self, job):
            self.tried += 1
            raise QueueFull(self.retry)

    replicas = [Full(3, 6), Full(1, 9), Full(2, 4)]  # the least loaded is not the one that frees first
    with pytest.raises(QueueFull) as refused:
        ReplicatedBatches(replicas).submit(object())
    assert refused.value.retry_after == 4 and [r.tried for r in replicas] == [1, 1, 1]


def test_equally_loaded_replicas_take_turns_and_the_least_loaded_still_wins():
    class Idle:
        def __init__(self, load):
            self.load, self.max_batch, self.max_queue, self.threads_per_worker, self.workers = load, 1, 1, 1, []
            self.jobs, self._admission = [], Admission(1)

        busy_workers = property(lambda self: self.load)
        queue_depth = property(lambda self: 0)

        def submit(self, job):
            self.jobs.append(job)

    idle = [Idle(0), Idle(0), Idle(0)]
    pool = ReplicatedBatches(idle)
    for job in range(6):  # one after another, each finished before the next: all equally loaded
        pool.submit(job)
    assert [replica.jobs for replica in idle] == [[0, 3], [1, 4], [2, 5]]
    loaded = [Idle(2), Idle(0), Idle(1)]
    pool = ReplicatedBatches(loaded)
    for job in range(3):
        pool.submit(job)
    assert [replica.jobs for replica in loaded] == [[], [0, 1, 2], []]


def test_replicas_share_one_admission_lock_and_refuse_only_when_all_are_full():
    """A request is refused only when all replicas are full at one instant: ``submit`` holds the
    one lock they count under while it tries each, so no replica's count changes in between."""

    def free_to_another_thread(lock) -> bool:
        got = []
        other = threading.Thread(target=lambda: got.append(lock.acquire(blocking=False) and (lock.release() or True)))
        other.start()
        other.join()
        return got[0]

    class Replica:
        def __init__(self):
            self._admission, self.max_batch, self.max_queue, self.threads_per_worker, self.workers = Admission(2), 1, 1, 1, []
            self.jobs, self.lock_was_free = [], []

        busy_workers = property(lambda self: 0)
        queue_depth = property(lambda self: len(self.jobs))

        def submit(self, job):
            self.lock_was_free.append(free_to_another_thread(self._admission.lock))
            if not self._admission.enter():
                raise QueueFull(1)
            self.jobs.append(job)

    replicas = [Replica(), Replica()]
    pool = ReplicatedBatches(replicas)
    assert replicas[0]._admission.lock is replicas[1]._admission.lock is pool._admission_lock
    for job in range(4):
        pool.submit(job)
    with pytest.raises(QueueFull):
        pool.submit(4)
    assert [replica.lock_was_free for replica in replicas] == [[False] * 3] * 2
    replicas[1]._admission.leave()  # one place frees: the next request takes it
    pool.submit(5)
    assert [len(replica.jobs) for replica in replicas] == [2, 3]


@pytest.mark.parametrize("replicas, max_batch, message", [(0, 8, "replicas must be an integer >= 1"),
                                                           (3, 2, "raise --max-batch to at least 3")])
def test_bad_replica_counts_are_clear_errors(tiny_pair, tokenizer, replicas, max_batch, message):
    with pytest.raises(ConfigError, match=message):
        build_replicated_batches(tiny_pair[0], None, tokenizer, replicas, max_batch, 4)


def test_the_default_is_one_replica_per_core_while_each_keeps_four_slots():
    from verispec.serve.replicas import MIN_SLOTS_PER_REPLICA, default_replicas

    assert MIN_SLOTS_PER_REPLICA == 4
    assert default_replicas(8, cores=2) == 2  # the 2-core machine: 2 batches of 4
    assert default_replicas(8, cores=16) == 2  # more cores than 4-slot batches: threads, not replicas
    assert default_replicas(32, cores=16) == 8
    assert default_replicas(8, cores=1) == default_replicas(3, cores=2) == 1
    assert default_replicas(8, device="cuda", cores=8) == default_replicas(8, backend="llamacpp", cores=8) == 1


def test_the_cli_resolves_the_default_replicas(monkeypatch):
    """``verispec serve`` without --batch-replicas builds the server with ``default_replicas``'s count."""
    import verispec.cli.generate as generate_cli
    import verispec.cli.serve as serve_cli
    import verispec.serve.launch as launch
    import verispec.serve.replicas as replicas_module
    from verispec.cli.main import main

    seen = {}

    class Stop(Exception):
        pass

    def fake_build_server(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(replicas_module, "default_replicas", lambda max_batch, device, backend: 3)
    monkeypatch.setattr(launch, "build_server", fake_build_server)
    monkeypatch.setattr(generate_cli, "load_pair", lambda *a, **k: (None, None, None))
    monkeypatch.setattr(serve_cli, "model_limits", lambda *a, **k: (4096, 100))
    with pytest.raises(Stop):
        main(["serve", "--port", "0", "--max-batch", "12", "--backend", "native"])
    assert seen["replicas"] == 3

"""Putting a server together: a scheduler over one loaded model pair, and uvicorn in a thread.

``build_server`` makes the scheduler (continuous batching, or worker threads) and the app from already loaded models (the CLI loads them with
``cli.generate.load_pair``; tests pass tiny random models). ``ServerThread`` runs uvicorn on a
loopback socket in a background thread (tests, ``benchmarks/serve_load.py``).
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from verispec.core.threads import default_threads
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter
from verispec.models.native_llama import NativeLlamaRunner
from verispec.serve.app import create_app
from verispec.serve.batching import BatchScheduler
from verispec.serve.replicas import ReplicatedBatches
from verispec.serve.requests import ServerConfig
from verispec.serve.workers import Worker, WorkerPool


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port) and listening (OSError if the port is taken or the host
    is not this machine's): binding before serving lets the caller report a bad address as such
    and print the address only once it is really served. IPv6 hosts ("::1") get an IPv6 socket."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=2048)


def build_workers(target_model, draft, tokenizer, workers: int, backend: str = "auto") -> list[Worker]:
    """``workers`` decoding slots over ONE target model (and one draft model): each gets its own
    adapters, hence its own KV caches; the ``torch`` modules and their weights are shared.

    draft: a transformers model, "ngram", a .gguf path (llama.cpp) or None (plain decoding only).
    target_model: a transformers model, or with backend "llamacpp" a GGUF path / target name.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    from verispec.engine.decoder import _as_adapter, draft_backend
    from verispec.models.llamacpp import is_gguf_source

    slots = []
    for index in range(workers):
        target = _as_adapter(target_model, backend=backend)  # a GGUF target: one llama.cpp context per worker
        draft_slot = draft
        if is_gguf_source(draft) or not (draft is None or isinstance(draft, str)):
            draft_slot = _as_adapter(draft, backend=draft_backend(backend, draft))
        if slots:
            share_packed_weights(slots[0].target, target)
            share_packed_weights(slots[0].draft, draft_slot)
        slots.append(Worker(index, target, draft_slot, tokenizer))
    return slots


def share_packed_weights(first: HFModelAdapter, other: HFModelAdapter) -> bool:
    """Make ``other``'s native runner multiply with ``first``'s oneDNN-packed bf16 weights.

    On CPUs where the native runner prepacks bf16 weights (``models.native_llama``), every adapter
    holds its own packed copy of the linear weights: one model's worth of memory per worker. The
    packed tensors are read-only after construction, so workers can share one set; ``other``'s own
    copy is then freed. Returns whether anything was shared (False: no prepacking here).
    """
    from verispec.models.native_llama import NativeLlamaRunner

    if not (isinstance(first, HFModelAdapter) and isinstance(other, HFModelAdapter)):
        return False  # n-gram drafts, llama.cpp (which maps the GGUF's weights once for every context)
    mine, theirs = first.runner, other.runner
    if not (isinstance(mine, NativeLlamaRunner) and isinstance(theirs, NativeLlamaRunner)):
        return False  # the transformers runner multiplies with the module's own (shared) weights
    return theirs.share_weights_from(mine)


SCHEDULERS = ("batch", "workers")


def build_server(target_model, draft, tokenizer, config: ServerConfig, workers: int = 1, max_queue: int = 8,
                 threads_per_worker: int | None = None, backend: str = "auto", scheduler: str = "batch", max_batch: int = 8,
                 replicas: int = 1):
    """(app, pool): the FastAPI app over a fresh scheduler, which starts with the app's lifespan.

    scheduler "batch" (default): continuous batching of up to ``max_batch`` requests
    (``serve.batching``; ``workers`` is ignored), in ``replicas`` batches side by side
    (``serve.replicas``; ``max_batch`` and ``max_queue`` are shared out between them); "workers":
    ``workers`` threads decoding one request each (``serve.workers``). ConfigError when the target
    cannot run batched."""
    if scheduler == "workers":
        pool = WorkerPool(build_workers(target_model, draft, tokenizer, workers, backend), max_queue, threads_per_worker)
    elif scheduler == "batch" and replicas > 1:
        pool = build_replicated_batches(target_model, draft, tokenizer, replicas, max_batch, max_queue, threads_per_worker, backend)
    elif scheduler == "batch":
        pool = build_batch_scheduler(target_model, draft, tokenizer, max_batch, max_queue, threads_per_worker, backend)
    else:
        raise ConfigError(f"unknown scheduler {scheduler!r}; choose one of: {', '.join(SCHEDULERS)}")
    return create_app(pool, tokenizer, config), pool


def build_batch_scheduler(target_model, draft, tokenizer, max_batch: int, max_queue: int, threads: int | None = None,
                          backend: str = "auto") -> BatchScheduler:
    """A continuous-batching scheduler: the batch's target adapter and a side worker (requests
    with a draft model off the native runner; checking settings), both over the one set of weights."""
    from verispec.engine.decoder import _as_adapter
    from verispec.models.batch_runner import BatchedLlamaRunner

    if isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < 1:
        raise ConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
    target = _as_adapter(target_model, backend=backend)
    try:
        if getattr(target, "backend", None) != "llamacpp":  # llama.cpp batches in one shared context (models.llamacpp_batch)
            BatchedLlamaRunner.check_base(getattr(target, "runner", None))
    except ConfigError as error:
        raise ConfigError(f"{error}; or serve this target with --scheduler workers") from None
    (side,) = build_workers(target_model, draft, tokenizer, 1, backend)
    share_packed_weights(side.target, target)
    return BatchScheduler(target, side, max_batch=max_batch, max_queue=max_queue, threads=threads)


def build_replicated_batches(target_model, draft, tokenizer, replicas: int, max_batch: int, max_queue: int,
                             threads: int | None = None, backend: str = "auto") -> ReplicatedBatches:
    """``replicas`` continuous batches over one set of weights (``serve.replicas``): each gets
    ceil(max_batch / replicas) slots and ceil(max_queue / replicas) queue places, and ``threads``
    torch threads (default: this process's cores divided among them, at least 1)."""
    if isinstance(replicas, bool) or int(replicas) != replicas or replicas < 1:
        raise ConfigError(f"batch replicas must be an integer >= 1, got {replicas!r}")
    if isinstance(max_batch, bool) or int(max_batch) != max_batch or max_batch < replicas:
        raise ConfigError(f"max_batch {max_batch!r} gives {replicas} batch replicas no slot each; raise --max-batch "
                          f"to at least {replicas} or lower --batch-replicas")
    threads = threads or default_threads(replicas)
    built = [build_batch_scheduler(target_model, draft, tokenizer, -(-max_batch // replicas), -(-max_queue // replicas),
                                   threads, backend) for _ in range(replicas)]
    for other in built[1:]:  # one set of packed / stacked weights for every replica
        share_packed_weights(built[0].side.target, other.side.target)
        share_packed_weights(built[0].batch_target, other.batch_target)
        first_runner, other_runner = getattr(built[0].batch_target, "runner", None), getattr(other.batch_target, "runner", None)
        if isinstance(first_runner, NativeLlamaRunner) and isinstance(other_runner, NativeLlamaRunner):
            other_runner.share_fused_from(first_runner)  # the batched runner's stacked products, fp32 too
    return ReplicatedBatches(built)


class ServerThread:
    """uvicorn serving ``app`` on 127.0.0.1 (a free port) in a daemon thread.

    ``start()`` returns once the server accepts connections; ``stop()`` asks uvicorn to exit
    (graceful: in-flight requests finish, then the app's lifespan shuts the pool down).
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, graceful_seconds: float = 10.0):
        self.socket = listening_socket(host, port)
        self.host, self.port = self.socket.getsockname()[:2]
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=graceful_seconds, lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True, name="verispec-uvicorn")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout)
        self.socket.close()

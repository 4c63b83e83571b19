"""Prometheus metrics of one server (its own ``CollectorRegistry``: no process-global state).

One meaning per label: ``verispec_requests_total{endpoint,status}`` counts HTTP responses by status
code; ``verispec_errors_total{type}`` counts error responses and failed decodes by error type (the
error body's ``code``: ``invalid_value``, ``unknown_parameter``, ``request_too_large``, ``not_found``,
``internal``..., never a status number); ``verispec_cancellations_total{stream}`` counts decodes
stopped because their client disconnected, streamed or not (not an error); and
``verispec_stopped_early_total{reason}`` decodes the server itself stopped (``time_limit``,
``shutdown``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from verispec.engine.checks import MAX_DRAFT_LEN

BLOCK_EFFICIENCY_BUCKETS = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0, 32.0, 65.0)
# accepted length tau is an integer: bucket k holds tau <= k
ACCEPTED_LENGTH_BUCKETS = tuple(float(k) for k in (0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32, MAX_DRAFT_LEN))
BATCH_SIZE_BUCKETS = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 24.0, 32.0, 64.0)
SECONDS_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 60.0, 120.0, 300.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class ServerMetrics:
    """The server's counters, gauges and histograms.

    queue_depth / busy_workers read the pool when scraped (callables given here).
    """

    def __init__(self, queue_depth, busy_workers):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("verispec_requests", "HTTP requests by endpoint and status code", ["endpoint", "status"], registry=r)
        self.errors = Counter("verispec_errors", "error responses and failed decodes by error type (the error code)", ["type"], registry=r)
        self.prompt_tokens = Counter("verispec_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.completion_tokens = Counter("verispec_completion_tokens", "generated tokens of finished requests", ["method"], registry=r)
        self.target_calls = Counter("verispec_target_calls", "target forward calls during decoding", ["method"], registry=r)
        self.block_efficiency = Histogram("verispec_block_efficiency", "block efficiency (new tokens / target calls) per request",
                                          ["method"], buckets=BLOCK_EFFICIENCY_BUCKETS, registry=r)
        self.accepted_length = Histogram("verispec_accepted_length", "accepted draft tokens (tau) per round", ["method"],
                                         buckets=ACCEPTED_LENGTH_BUCKETS, registry=r)
        self.request_seconds = Histogram("verispec_request_seconds", "decode time of finished requests (queue wait excluded)",
                                         ["method"], buckets=SECONDS_BUCKETS, registry=r)
        self.queue_seconds = Histogram("verispec_queue_seconds", "time requests waited in the queue", buckets=SECONDS_BUCKETS, registry=r)
        self.cancellations = Counter("verispec_cancellations", "decodes stopped because the client disconnected",
                                     ["stream"], registry=r)
        self.stopped_early = Counter("verispec_stopped_early", "decodes the server stopped: time_limit or shutdown", ["reason"], registry=r)
        depth = Gauge("verispec_queue_depth", "requests waiting for a worker", registry=r)
        depth.set_function(queue_depth)
        busy = Gauge("verispec_busy_workers", "requests being decoded (workers busy, or requests in the batch)", registry=r)
        busy.set_function(busy_workers)
        self.batch_rounds = Counter("verispec_batch_rounds", "rounds of the continuous batch (one target forward each)", registry=r)
        self.batch_size = Histogram("verispec_batch_size", "requests decoded together per round of the continuous batch",
                                    buckets=BATCH_SIZE_BUCKETS, registry=r)
        self.last_batch_size = Gauge("verispec_batch_last_size", "requests in the continuous batch's latest round", registry=r)

    def record_round(self, size: int) -> None:
        """One round of the continuous batch with ``size`` requests in it."""
        self.batch_rounds.inc()
        self.batch_size.observe(size)
        self.last_batch_size.set(size)

    def record_finished(self, event) -> None:
        """A ``workers.JobFinished``."""
        output = event.output
        method = output.method
        self.prompt_tokens.inc(len(output.prompt_ids))
        self.completion_tokens.labels(method).inc(output.new_tokens)
        self.target_calls.labels(method).inc(output.target_calls)
        if output.target_calls:
            self.block_efficiency.labels(method).observe(output.block_efficiency)
        histogram = self.accepted_length.labels(method)
        for step in output.steps:
            histogram.observe(step.accepted_len)
        self.request_seconds.labels(method).observe(output.seconds)
        self.queue_seconds.observe(event.queue_seconds)
        if event.stop_reason == "time_limit":
            self.stopped_early.labels("time_limit").inc()

    def record_failed(self, event, stream: bool) -> None:
        """A ``workers.JobFailed`` of a streamed or plain request: cancelled (client gone),
        shutdown or internal. The HTTP answer of a shutdown or internal failure is counted in
        ``errors`` by the app when it is sent; a cancelled one never reaches anybody."""
        if event.kind == "cancelled":
            self.cancellations.labels("true" if stream else "false").inc()
            return
        if event.kind == "shutdown":
            self.stopped_early.labels("shutdown").inc()
        if stream:  # a stream's failure goes out as a data line, past the app's error handlers
            self.errors.labels("shutting_down" if event.kind == "shutdown" else event.kind).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

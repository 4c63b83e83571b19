"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions,
/health, /metrics.

Every request is validated before it is queued (types, ranges, the ``speculative`` extension against
the server's limits, the prompt against the context: ``serve.requests``), in a thread pool so the event
loop keeps answering, and bad input is always a 400 (413 for a body over the limit, 404 for an unknown
model); a 500 means a bug. Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``. Streams are server-sent events in OpenAI's
chunk format ending with ``data: [DONE]``; when the client disconnects the decode is cancelled.
Responses carry OpenAI's fields plus a top-level ``speculative`` object (``speculative_block``).
"""

from __future__ import annotations

import asyncio
import copy
import queue
import threading
import time
import uuid
from contextlib import asynccontextmanager, contextmanager
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.errors import ConfigError
from verispec.serve.metrics import CONTENT_TYPE, ServerMetrics
from verispec.serve.schemas import ChatRequest, CompletionRequest
from verispec.serve.workers import DecodeSettings, Job, JobFailed, JobFinished, QueueFull, ShuttingDown, TextDelta, WorkerPool

from verispec.serve.requests import (
    ENDPOINTS,
    APIError,
    ServerConfig,
    bad_request,
    chat_prompt_ids,
    check_context,
    check_text,
    completion_prompt_ids,
    field_path,
    resolve_settings,
    speculative_block,
    sse,
    usage_block,
)

PREPARE_SLOTS = 4  # requests tokenized at once (each slot holds one tokenizer copy, a few MB)


class TokenizerPool:
    """Up to ``size`` tokenizers (the given one, then deep copies made when requests overlap), lent
    one per request being prepared. Rust tokenizers refuse concurrent use from threads while one
    changes its settings ("Already borrowed"), so no tokenizer is used by two threads at once."""

    def __init__(self, tokenizer, size: int):
        self.original, self.size, self.made = tokenizer, size, 1
        self.free: queue.Queue = queue.Queue()
        self.free.put(tokenizer)
        self.lock = threading.Lock()

    @contextmanager
    def borrow(self):
        try:
            tokenizer = self.free.get_nowait()
        except queue.Empty:
            with self.lock:
                grow = self.made < self.size
                self.made += grow
            # all lent: a new copy (0.3 s once), or wait, in this pool thread, not on the event loop
            tokenizer = copy.deepcopy(self.original) if grow else self.free.get()
        try:
            yield tokenizer
        finally:
            self.free.put(tokenizer)


class BodyLimit:
    """Pure ASGI middleware refusing request bodies over ``limit`` bytes with a 413, while reading:
    a Content-Length over the limit is refused before any byte is read, and a chunked (or lying)
    body as soon as the bytes received pass the limit, so a 20 MB upload is never held in memory.
    Within the limit the body is handed on unchanged (later ``receive`` calls, such as the
    disconnect watch of a running request, go to the client as before)."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def too_large(self) -> APIError:
        return APIError(413, f"the request body is larger than this server's limit of {self.limit} bytes; send a shorter "
                             f"request, or start the server with a larger --max-request-bytes", code="request_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.limit:
            return await self.refuse(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away while sending
                return
            size += len(message.get("body", b""))
            if size > self.limit:
                return await self.refuse(scope, receive, send)
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def refuse(self, scope, receive, send):
        response = self.too_large().response()
        response.headers["Connection"] = "close"  # the rest of the body is never read
        await response(scope, receive, send)


class RequestCounter:
    """Pure ASGI middleware counting responses by path and status (Starlette's BaseHTTPMiddleware
    would wrap streaming responses and get in the way of disconnect detection), and error
    responses made before the app runs (a body over the limit) by error type."""

    def __init__(self, app, metrics: ServerMetrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def counting_send(message):
            if message["type"] == "http.response.start":
                path = scope["path"] if scope["path"] in ENDPOINTS else "other"  # bounded label values
                self.metrics.requests.labels(path, str(message["status"])).inc()
                if message["status"] == 413:  # answered by BodyLimit, outside the app's error handlers
                    self.metrics.errors.labels("request_too_large").inc()
            await send(message)

        await self.app(scope, receive, counting_send)


# ------------------------------------------------------------------------------------------ app
def create_app(pool: WorkerPool, tokenizer, config: ServerConfig, metrics: ServerMetrics | None = None) -> FastAPI:
    """The FastAPI app over a (not yet started) pool; the pool starts and stops with the app.

    tokenizer: encodes prompts and renders chat templates in the event loop's thread pool, so the
    loop stays free for /health while a long prompt is tokenized; ``PREPARE_SLOTS`` requests are
    prepared at once, each with its own copy (``TokenizerPool``), so one huge prompt does not hold
    up the next small request either. The decode workers use their own copies.
    """
    metrics = metrics or ServerMetrics(lambda: pool.queue_depth, lambda: pool.busy_workers)
    previous_hook = pool.on_finished
    if hasattr(pool, "on_step"):  # the continuous batch reports its rounds
        pool.on_step = metrics.record_round

    def on_finished(job, event):
        if isinstance(event, JobFinished):
            metrics.record_finished(event)
        else:
            metrics.record_failed(event, job.stream)
        if previous_hook is not None:
            previous_hook(job, event)

    pool.on_finished = on_finished

    @asynccontextmanager
    async def lifespan(app):
        pool.start()
        yield
        await asyncio.get_running_loop().run_in_executor(None, pool.shutdown, config.shutdown_grace)

    app = FastAPI(title="verispec", lifespan=lifespan)
    app.state.pool, app.state.metrics, app.state.config = pool, metrics, config

    tokenizers = TokenizerPool(tokenizer, PREPARE_SLOTS)

    def error_response(error: APIError, endpoint: str) -> Response:
        if error.code != "cancelled":  # a client that went away is a cancellation, counted by the pool hook
            metrics.errors.labels(error.error_type).inc()
        return error.response()

    @app.exception_handler(APIError)
    async def api_error(request: Request, error: APIError):
        return error_response(error, request.url.path)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, error: RequestValidationError):
        problems = error.errors()
        first = problems[0] if problems else {}
        location = field_path(first.get("loc", ()))
        # the unknown key itself ends the location, whatever it looks like ("Str", "a[0]")
        unknown = [".".join([*field_path(e["loc"][:-1]), str(e["loc"][-1])]) for e in problems if e.get("type") == "extra_forbidden"]
        if first.get("type") == "json_invalid":
            message, param, code = f"the request body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None, "invalid_json"
        elif unknown:  # OpenAI's own wording, so clients and users recognise it
            message = f"Unrecognized request argument supplied: {', '.join(unknown)}"
            param, code = unknown[0], "unknown_parameter"
        else:
            message = "; ".join(f"{'.'.join(field_path(e.get('loc', ()))) or 'body'}: {e.get('msg')}" for e in problems[:5])
            param, code = ".".join(location) or None, "invalid_type" if "type" in str(first.get("type", "")) else "invalid_value"
        return error_response(bad_request(message, param, code), request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, error: StarletteHTTPException):
        try:
            code = HTTPStatus(error.status_code).phrase.lower().replace(" ", "_")  # 405 -> "method_not_allowed"
        except ValueError:
            code = "http_error"
        message = str(error.detail)
        if error.status_code == 400 and message == "There was an error parsing the body":  # FastAPI's, on RecursionError / ValueError
            message, code = ("the request body could not be parsed: its JSON is nested too deeply or holds a number with "
                             "too many digits; send an OpenAI request body"), "invalid_json"
        return error_response(APIError(error.status_code, message, code=code, headers=dict(error.headers or {})), request.url.path)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, error: Exception):
        return error_response(APIError(500, f"internal error: {type(error).__name__}: {error}", kind="server_error",
                                       code="internal_error"), request.url.path)

    app.add_middleware(BodyLimit, limit=config.max_request_bytes)
    app.add_middleware(RequestCounter, metrics=metrics)  # added last = outermost: it also counts BodyLimit's 413s

    @app.get("/health")
    async def health():
        ready = pool.accepting
        body = {"status": "ok" if ready else "shutting_down", "model": config.model_name, "scheduler": pool.scheduler,
                "workers": len(pool.workers), "max_batch": getattr(pool, "max_batch", None),
                "busy_workers": pool.busy_workers, "queue_depth": pool.queue_depth, "max_queue": pool.max_queue}
        return JSONResponse(body, status_code=200 if ready else 503)

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.exposition(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": config.model_name, "object": "model", "created": 0, "owned_by": "verispec"}]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        check_model(name)
        return {"id": config.model_name, "object": "model", "created": 0, "owned_by": "verispec"}

    def check_model(name: str) -> None:
        if name != config.model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {config.model_name!r}",
                           "model", "model_not_found")

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        settings, prompt_ids = await run_in_threadpool(  # 16: OpenAI's default for completions
            prepare, body, 16, lambda own: completion_prompt_ids(body, own, config.vocab_size))
        return await run(request, body, settings, prompt_ids, chat=False, param="prompt")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatRequest, request: Request):
        settings, prompt_ids = await run_in_threadpool(prepare, body, config.default_max_tokens, lambda own: chat_prompt_ids(body, own))
        return await run(request, body, settings, prompt_ids, chat=True, param="messages")

    def prepare(body, default_max_tokens: int, encode) -> tuple[DecodeSettings, list[int]]:
        """(validated settings, prompt ids) of a request. Runs in the thread pool, off the event
        loop: scanning a long prompt for surrogates, rendering a chat template and tokenizing
        (``encode(tokenizer)``, with a tokenizer of the pool) take seconds for a prompt of megabytes."""
        check_text(body)
        check_model(body.model)
        settings = resolve_settings(body, config, default_max_tokens)
        try:
            pool.check(settings)
        except ConfigError as error:
            raise bad_request(str(error), "speculative", "invalid_speculative") from error
        with tokenizers.borrow() as own:
            return settings, encode(own)

    async def run(request: Request, body, settings: DecodeSettings, prompt_ids: list[int], chat: bool, param: str):
        check_context(prompt_ids, settings, config, param)
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def emit(event):
            try:
                loop.call_soon_threadsafe(events.put_nowait, event)
            except RuntimeError:  # the event loop is closed: nobody is listening any more
                pass

        stream = bool(body.stream)
        job = Job(prompt_ids, settings, emit, stream=stream, time_limit=config.request_timeout)
        try:
            pool.submit(job)
        except QueueFull as full:
            raise APIError(429, str(full), code="rate_limit_exceeded", kind="rate_limit_error",
                           headers={"Retry-After": str(full.retry_after)}) from None
        except ShuttingDown as down:
            raise APIError(503, str(down), code="shutting_down", kind="server_error") from None
        watcher = asyncio.ensure_future(cancel_on_disconnect(request, job))
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        created = int(time.time())
        if stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return StreamingResponse(stream_events(job, events, watcher, settings, request_id, created, chat, include_usage),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        try:
            event = await events.get()
        finally:
            watcher.cancel()
            job.cancelled.set()  # no-op once finished; frees the worker if this handler is cancelled
        if isinstance(event, JobFailed):
            raise failed_error(event)
        choice = {"index": 0, "logprobs": None, "finish_reason": event.finish_reason}
        if chat:
            choice["message"] = {"role": "assistant", "content": event.text}
        else:
            choice["text"] = event.text
        return {"id": request_id, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": config.model_name, "system_fingerprint": None, "choices": [choice],
                "usage": usage_block(event), "speculative": speculative_block(event, settings)}

    async def cancel_on_disconnect(request: Request, job: Job) -> None:
        """Set the job's cancel flag as soon as the client disconnects (the worker stops after
        its current round). The body has been read, so the next ASGI message is the disconnect."""
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                job.cancelled.set()
                return

    def failed_error(event: JobFailed) -> APIError:
        if event.kind == "cancelled":  # nginx's "client closed request": nobody reads it
            return APIError(499, event.message, code="cancelled", kind="server_error")
        if event.kind == "shutdown":
            return APIError(503, event.message, code="shutting_down", kind="server_error")
        if event.kind == "invalid_request":  # input only the decode itself could refuse
            return APIError(400, event.message, code="invalid_request")
        return APIError(500, event.message, code=event.kind, kind="server_error")

    async def stream_events(job: Job, events: asyncio.Queue, watcher, settings, request_id, created, chat, include_usage):
        def chunk(delta_or_text, finish_reason=None, **extra):
            choice = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
            if chat:
                choice["delta"] = delta_or_text
            else:
                choice["text"] = delta_or_text
            return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created, "model": config.model_name, "system_fingerprint": None,
                    "choices": [choice], **extra}

        try:
            if chat:
                yield sse(chunk({"role": "assistant", "content": ""}))
            while True:
                event = await events.get()
                if isinstance(event, TextDelta):
                    yield sse(chunk({"content": event.text} if chat else event.text))
                elif isinstance(event, JobFinished):
                    yield sse(chunk({} if chat else "", event.finish_reason, speculative=speculative_block(event, settings)))
                    if include_usage:
                        final = chunk({} if chat else "")
                        final["choices"], final["usage"] = [], usage_block(event)
                        yield sse(final)
                    yield sse("[DONE]")
                    return
                else:  # failed: OpenAI streams errors as a data line with an error object
                    yield sse(failed_error(event).body())
                    yield sse("[DONE]")
                    return
        finally:
            watcher.cancel()
            job.cancelled.set()  # the client went away (or the stream ended): stop after this round

    return app

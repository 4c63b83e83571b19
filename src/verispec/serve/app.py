"""The OpenAI-compatible HTTP API (FastAPI): /v1/models, /v1/completions, /v1/chat/completions,
/health, /metrics.

Every request is validated in the event loop (types, ranges, the ``speculative`` extension against
the server's limits, the prompt against the context) before it is queued, so bad input is always a
400 (or 404 for an unknown model) and a 500 means a bug. Errors use OpenAI's body
``{"error": {"message", "type", "param", "code"}}``. Streams are server-sent events in OpenAI's
chunk format ending with ``data: [DONE]``; when the client disconnects the decode is cancelled.
Responses carry OpenAI's fields plus a top-level ``speculative`` object (``speculative_block``).
"""

from __future__ import annotations

import asyncio
import copy
import json
import queue
import secrets
import threading
import time
import uuid
from collections import Counter as Tally
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from verispec.core.seeds import check_seed
from verispec.errors import ConfigError
from verispec.serve.metrics import CONTENT_TYPE, ServerMetrics
from verispec.serve.schemas import ChatRequest, CompletionRequest
from verispec.serve.workers import DecodeSettings, Job, JobFailed, JobFinished, QueueFull, ShuttingDown, TextDelta, WorkerPool
from verispec.verify.registry import METHODS

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
MAX_STOP_STRINGS = 4
MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]
# 4 MiB: about 1M prompt tokens of text, far beyond any context this engine serves, yet small enough
# that JSON-parsing and validating a body stays well under a second on the event loop
DEFAULT_MAX_REQUEST_BYTES = 4 * 2**20


@dataclass(frozen=True)
class ServerConfig:
    """What the server was started with.

    method / num_drafts / draft_len / tree: the default rule and shape; a request may choose any
    registered rule with K <= num_drafts and L <= draft_len (tree widths <= K, depth <= L).
    max_context / vocab_size: the target's. default_max_tokens: chat requests without max_tokens.
    request_timeout: seconds of decoding per request, after which the answer so far is returned
    with finish_reason "length" (speculative.stop_reason "time_limit").
    """

    model_name: str
    method: str
    num_drafts: int
    draft_len: int
    tree: tuple[int, ...] | None
    max_context: int
    vocab_size: int
    default_max_tokens: int = 256
    request_timeout: float = 300.0
    shutdown_grace: float = 10.0
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES


class APIError(Exception):
    """An error answered in OpenAI's format."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def response(self) -> Response:
        """The JSON answer; ASCII-escaped, so text echoed from a request (a field name holding a
        lone surrogate) can never make the error itself unencodable."""
        return Response(json.dumps(self.body(), ensure_ascii=True), status_code=self.status, headers=self.headers,
                        media_type="application/json")

    @property
    def error_type(self) -> str:
        """The ``verispec_errors_total`` label: the code, else the OpenAI type (never a status number)."""
        return self.code or self.kind


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


# --------------------------------------------------------------------------------- validation
# OpenAI fields that would change the answer and are not implemented: their no-op values (which are
# accepted, as clients send some of them explicitly) and what to do instead. Anything else -> 400.
UNSUPPORTED_FIELDS = {
    "n": ((None, 1), "this server returns one choice per request (n = 1); send n requests"),
    "presence_penalty": ((None, 0), "verispec's verification rules do not apply penalties; leave it at 0"),
    "frequency_penalty": ((None, 0), "verispec's verification rules do not apply penalties; leave it at 0"),
    "logit_bias": ((None, {}), "leave it out"),
    "echo": ((None, False), "leave it out; the prompt is yours already"),
    "suffix": ((None, ""), "insertion is not implemented; leave it out"),
    "best_of": ((None, 1), "leave it out (1)"),
    "logprobs": ((None, 0), "logprobs are not returned; leave it out"),
    "top_logprobs": ((None, 0), "logprobs are not returned; leave it out"),
    "tools": ((None, []), "function calling is not implemented; leave it out"),
    "functions": ((None, []), "function calling is not implemented; leave it out"),
    "tool_choice": ((None, "none", "auto"), "function calling is not implemented; leave it out"),
    "function_call": ((None, "none", "auto"), "function calling is not implemented; leave it out"),
    "response_format": ((None, {"type": "text"}), "structured output (JSON mode / schema) is not implemented; leave it out"),
    "modalities": ((None, ["text"]), "only text is produced; leave it out"),
    "audio": ((None,), "only text is produced; leave it out"),
    "prediction": ((None,), "predicted outputs are not implemented; leave it out"),
    "reasoning_effort": ((None,), "the model is not a reasoning model; leave it out"),
    "verbosity": ((None,), "leave it out"),
    "web_search_options": ((None,), "web search is not implemented; leave it out"),
}


def check_unsupported(request) -> None:
    """Refuse fields that would change the answer but are not implemented (400, naming the field)."""
    for name in sorted(request.model_fields_set & UNSUPPORTED_FIELDS.keys()):
        no_ops, advice = UNSUPPORTED_FIELDS[name]
        value = getattr(request, name)
        if value not in no_ops:  # == comparison: 0.0 and false count as 0
            raise bad_request(f"{name}={json.dumps(value, ensure_ascii=True)[:80]} is not supported by this server; {advice}",
                              name, "unsupported_parameter")


def lone_surrogate(value, path: str = "") -> tuple[str, int] | None:
    """(field path, character index) of the first lone UTF-16 surrogate in a parsed JSON value.

    JSON's "\\ud800" escape parses into a Python str no tokenizer (nor UTF-8) can encode; such text
    is refused up front instead of failing deep inside the tokenizer."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as error:  # UTF-8 refuses exactly the lone surrogates
            return path, error.start
    elif isinstance(value, dict):
        for key, item in value.items():
            found = lone_surrogate(key, path) or lone_surrogate(item, f"{path}.{key}" if path else str(key))
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = lone_surrogate(item, f"{path}.{index}" if path else str(index))
            if found:
                return found
    return None


def check_text(request) -> None:
    """400 naming the field when any string of the request holds a lone surrogate."""
    found = lone_surrogate(request.model_dump(exclude_unset=True))
    if found:
        path, index = found
        raise bad_request(f"{path or 'body'} holds a lone UTF-16 surrogate at character {index} (an unpaired \\ud800-\\udfff "
                          "escape), which is not valid Unicode text; send UTF-8 text or a complete surrogate pair",
                          path or None, "invalid_text")


def resolve_speculative(request, config: ServerConfig) -> tuple[str, int, int, tuple[int, ...] | None]:
    """(method, K, L, tree) of a request: its ``speculative`` object within the server's limits.

    Omitted fields: the server's method; K = 1 for chain rules, 2 for spechub, the server's K for
    the other multi-draft rules; L = the server's L; the server's tree for its own method.
    """
    options = request.speculative
    method = options.method if options and options.method is not None else config.method
    if method != "ar":
        if method not in METHODS:
            raise bad_request(f"unknown speculative.method {method!r}; choose one of: ar, {', '.join(METHODS)}",
                              "speculative.method", "invalid_method")
        if method == "sprinter":
            raise bad_request("speculative.method 'sprinter' needs a trained verifier, which this server was not started with",
                              "speculative.method", "invalid_method")
    spec = METHODS.get(method)
    num_drafts = options.num_drafts if options and options.num_drafts is not None else None
    draft_len = options.draft_len if options and options.draft_len is not None else config.draft_len
    tree = tuple(options.tree) if options and options.tree is not None else None
    if num_drafts is None:
        if spec is None or spec.draft == "chain":
            num_drafts = 1
        elif spec.draft == "tree":
            num_drafts = 2
        else:
            num_drafts = config.num_drafts
    if tree is None and method == config.method and config.tree is not None and not (options and (options.num_drafts or options.draft_len)):
        tree = config.tree
    if method == "ar":
        return "ar", 1, 1, None
    if not 1 <= num_drafts <= config.num_drafts:
        raise bad_request(f"speculative.num_drafts must lie in [1, {config.num_drafts}] (the server's -K), got {num_drafts}",
                          "speculative.num_drafts", "out_of_range")
    if not 1 <= draft_len <= config.draft_len:
        raise bad_request(f"speculative.draft_len must lie in [1, {config.draft_len}] (the server's -L), got {draft_len}",
                          "speculative.draft_len", "out_of_range")
    if tree is not None:
        if not tree or len(tree) > config.draft_len or min(tree) < 1 or max(tree) > config.num_drafts:
            raise bad_request(f"speculative.tree needs 1..{config.draft_len} depths of 1..{config.num_drafts} "
                              f"children each (the server's -L and -K), got {list(tree)}", "speculative.tree", "out_of_range")
    return method, num_drafts, draft_len, tree


def resolve_settings(request, config: ServerConfig, default_max_tokens: int) -> DecodeSettings:
    """Validated ``DecodeSettings`` of a request (400 naming the field otherwise)."""
    check_unsupported(request)
    temperature = 1.0 if request.temperature is None else request.temperature
    if not 0.0 <= temperature <= MAX_TEMPERATURE:
        raise bad_request(f"temperature must lie in [0, {MAX_TEMPERATURE}] (0 = greedy), got {temperature}", "temperature")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"top_p must lie in (0, 1], got {top_p}", "top_p")
    top_k = 0 if request.top_k is None else request.top_k
    if top_k < 0:
        raise bad_request(f"top_k must be >= 0 (0 disables it), got {top_k}", "top_k")
    max_tokens, param = request.max_tokens, "max_tokens"
    if getattr(request, "max_completion_tokens", None) is not None:  # chat's newer name wins
        max_tokens, param = request.max_completion_tokens, "max_completion_tokens"
    if max_tokens is None:
        max_tokens = default_max_tokens
    if max_tokens < 1:
        raise bad_request(f"max_tokens must be >= 1, got {max_tokens}", param)
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    if len(stop) > MAX_STOP_STRINGS or any(not s for s in stop):
        raise bad_request(f"stop takes up to {MAX_STOP_STRINGS} non-empty strings, got {stop!r}", "stop")
    try:
        seed = secrets.randbits(63) if request.seed is None else check_seed(request.seed)
    except ConfigError as error:
        raise bad_request(str(error), "seed") from None
    method, num_drafts, draft_len, tree = resolve_speculative(request, config)
    return DecodeSettings(method, num_drafts, draft_len, tree, float(temperature), int(top_k), float(top_p),
                          int(max_tokens), tuple(stop), int(seed))


def completion_prompt_ids(request: CompletionRequest, tokenizer, vocab_size: int) -> list[int]:
    prompt = request.prompt
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            raise bad_request(f"a batch of {len(prompt)} prompts is not supported; send one prompt per request", "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = list(tokenizer.encode(prompt))
    else:
        ids = [int(t) for t in prompt]
        bad = [t for t in ids if not 0 <= t < vocab_size]
        if bad:
            raise bad_request(f"prompt token ids must lie in [0, {vocab_size}), got {bad[:5]}", "prompt")
    if not ids:
        if tokenizer.bos_token_id is None:
            raise bad_request("the prompt is empty and the tokenizer has no BOS token to start from", "prompt")
        ids = [int(tokenizer.bos_token_id)]
    return ids


def chat_prompt_ids(request: ChatRequest, tokenizer) -> list[int]:
    if not getattr(tokenizer, "chat_template", None):
        raise bad_request("this model has no chat template; use /v1/completions", "messages")
    messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text()} for m in request.messages]
    try:
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as error:  # jinja raises its own errors for messages a template refuses
        raise bad_request(f"the model's chat template refused these messages: {error}", "messages") from error
    # the rendered template holds every special token already (as verispec.models.default.encode_prompt)
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def check_context(prompt_ids: list[int], settings: DecodeSettings, config: ServerConfig, param: str) -> None:
    room = config.max_context - settings.draft_len - 1
    if len(prompt_ids) >= room:
        raise bad_request(
            f"the prompt has {len(prompt_ids)} tokens; this model's context of {config.max_context} tokens leaves room "
            f"for prompts of at most {room - 1} tokens with draft_len {settings.draft_len}; shorten the prompt",
            param, "context_length_exceeded",
        )


# ------------------------------------------------------------------------------------ responses
def speculative_block(event: JobFinished, settings: DecodeSettings) -> dict:
    """The top-level ``speculative`` object: rule, shape, block efficiency, accepted lengths, times."""
    output = event.output
    taus = [step.accepted_len for step in output.steps]
    histogram = Tally(taus)
    times = output.time_breakdown()
    return {
        "method": output.method,
        "num_drafts": output.num_drafts,
        "draft_len": output.draft_len,
        "tree": None if settings.tree is None else list(settings.tree),
        "block_efficiency": output.block_efficiency,
        "target_calls": output.target_calls,
        "draft_calls": output.draft_calls,
        "mean_accepted_length": output.mean_accepted_len,
        "acceptance_rate": output.acceptance_rate,
        "accepted_lengths": taus,
        "accepted_length_histogram": [histogram.get(tau, 0) for tau in range(output.draft_len + 1)],
        "draft_seconds": times["draft"],
        "target_seconds": times["target"],
        "verify_seconds": times["verify"],
        "other_seconds": times["other"],
        "prefill_seconds": output.prefill_seconds,
        "decode_seconds": output.seconds,
        "queue_seconds": event.queue_seconds,
        "stop_reason": event.stop_reason,
        "seed": settings.seed,
        "worker": event.worker,
    }


def usage_block(event: JobFinished) -> dict:
    prompt, completion = len(event.output.prompt_ids), event.output.new_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"


PYDANTIC_TYPE_TAGS = {"str", "int", "float", "bool", "dict", "list", "none"}


def field_path(location) -> list[str]:
    """The request field of a pydantic error location: ("body", "stop", "list[str]", 0) -> ["stop"].
    Stops at the first union-member tag (a type name), which is no part of the request's shape."""
    path = []
    for part in location:
        if part == "body" and not path:
            continue
        text = str(part)
        if text in PYDANTIC_TYPE_TAGS or "[" in text or text[:1].isupper() or text.startswith(("function-", "constrained-")):
            break
        path.append(text)
    return path


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
        body = {"status": "ok" if ready else "shutting_down", "model": config.model_name, "workers": len(pool.workers),
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

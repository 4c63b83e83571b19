"""Request checking for the OpenAI-compatible API: the server's configuration, OpenAI's error body
(``APIError``), the closed request schema's extra checks (fields OpenAI has but verispec does not
implement, lone surrogates in text), the ``speculative`` extension against the server's limits, the
prompt's token ids and context, and the response's ``speculative`` / ``usage`` blocks.

Everything here is a plain function of the request, so ``serve.app`` runs it off the event loop.
"""

from __future__ import annotations

import json
import secrets
from collections import Counter as Tally
from dataclasses import dataclass

from fastapi.responses import Response

from verispec.core.seeds import check_seed
from verispec.errors import ConfigError
from verispec.serve.schemas import ChatRequest, CompletionRequest
from verispec.serve.workers import DecodeSettings, JobFinished
from verispec.core.tree import DraftScheme
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

    Omitted fields: the server's method; K = 1 for chain rules and q-free rules (token trees), 2 for spechub, the server's K for
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
        if spec is None or spec.draft == "chain" or spec.tree_scheme is DraftScheme.DETERMINISTIC:
            num_drafts = 1  # q-free rules draft the token trees, which size themselves (K unused)
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

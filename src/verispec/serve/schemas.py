"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types, closed).

Strict: a string where a number belongs ("temperature": "hot", "max_tokens": "5") is a 400, not
silently converted. Closed, as OpenAI's own API is: a field this server does not know (a typo such
as ``max_token``, at the top level or inside ``speculative``) is a 400 "Unrecognized request argument
supplied: max_token". Fields of OpenAI's spec are either implemented, accepted and ignored because
they cannot change the answer (``IGNORED_FIELDS``), or declared here and refused by
``app.check_unsupported`` with a 400 naming them unless they hold their no-op value
(``n: 1``, ``logprobs: false``, ``response_format: {"type": "text"}``...).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

CLOSED = ConfigDict(extra="forbid", strict=True)

# OpenAI fields that only label, store or route a request: accepted and ignored.
IGNORED_FIELDS = ("user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier", "parallel_tool_calls")


class SpeculativeOptions(BaseModel):
    """The per-request rule and draft shape, within what the server was started with."""

    model_config = CLOSED

    method: str | None = None
    num_drafts: int | None = None
    draft_len: int | None = None
    tree: list[int] | None = None


class StreamOptions(BaseModel):
    model_config = CLOSED

    include_usage: bool | None = None
    include_obfuscation: bool | None = None  # OpenAI's padding of stream chunks; nothing to pad here


class _Common(BaseModel):
    model_config = CLOSED

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # extension (vLLM / SGLang spell it the same way)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    speculative: SpeculativeOptions | None = None
    # accepted and ignored (IGNORED_FIELDS)
    user: str | None = None
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


class TextPart(BaseModel):
    model_config = CLOSED

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = CLOSED

    role: Literal["system", "developer", "user", "assistant"]
    # required and non-null: without tools (refused) no message can be empty
    content: str | list[TextPart]
    name: str | None = None  # a participant's name: chat templates do not render it

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    parallel_tool_calls: bool | None = None  # ignored: only matters with tools
    # OpenAI fields that would change the answer; refused unless they hold their no-op value
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: Any = None
    modalities: Any = None
    audio: Any = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None

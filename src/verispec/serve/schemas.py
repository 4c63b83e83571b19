"""Request bodies of the OpenAI-compatible endpoints (pydantic, strict types).

Strict: a string where a number belongs ("temperature": "hot", "max_tokens": "5") is a 400, not
silently converted. Unknown top-level fields are accepted and ignored, as OpenAI clients send
fields this server does not use (``user``, ``metadata``...); fields that would change the answer
and are not implemented (logprobs, penalties, n > 1, ...) are refused by ``app.check_unsupported``.
The ``speculative`` extension object is closed (a misspelt key is a 400).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class SpeculativeOptions(BaseModel):
    """The per-request rule and draft shape, within what the server was started with."""

    model_config = ConfigDict(extra="forbid", strict=True)

    method: str | None = None
    num_drafts: int | None = None
    draft_len: int | None = None
    tree: list[int] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    include_usage: bool | None = None


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

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


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    logprobs: int | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict] | None = None

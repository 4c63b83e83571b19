"""Incremental text for streaming decoders.

A decoding loop produces the whole decoded text after every accepted block; ``TextStream`` turns
those snapshots into pieces whose concatenation is exactly the final text. It holds back only
what a later block could still change:

* a run of U+FFFD at the end: a block that stops inside a multi-byte UTF-8 sequence decodes to
  replacement characters that become the real character once the rest of the bytes arrive;
* trailing whitespace: tokenizers that clean up spaces (" ." -> ".") may drop it;
* a suffix that is a proper prefix of a stop string: the next block may complete the stop string,
  and the final text is cut before it.

Used by ``SpeculativeDecoder.stream``, ``SprinterDecoder.stream`` and the OpenAI-compatible server.

Example::

    stream = TextStream(stop=["\\n\\n"])
    for snapshot_text, finished in snapshots:
        piece = stream.push(snapshot_text, final=finished)
        if piece:
            send(piece)
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.errors import ConfigError

REPLACEMENT_CHARACTER = "\ufffd"


def stop_cut(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """(text cut before the earliest occurrence of any stop string, whether one occurred)."""
    hits = [text.index(s) for s in stop if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


class TextStream:
    """Turns successive full-text snapshots of one generation into safe increments.

    stop: the decoder's stop strings (non-empty). Snapshots passed to ``push`` must already be cut
    at the first stop string (``stop_cut``), as ``GenerationOutput.text`` is.
    """

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = tuple(stop)
        if any(not s for s in self.stop):
            raise ConfigError("stop strings must be non-empty; drop the empty string from stop=")
        self.printed = ""

    def stable_length(self, text: str) -> int:
        """Length of the prefix of ``text`` that no later block can change."""
        end = len(text)
        while end and (text[end - 1] == REPLACEMENT_CHARACTER or text[end - 1].isspace()):
            end -= 1
        for start in range(max(0, end - max((len(s) for s in self.stop), default=0)), end):
            tail = text[start:end]
            if any(s.startswith(tail) for s in self.stop):
                return start  # the earliest start that could grow into a stop string
        return end

    def push(self, text: str, final: bool = False) -> str:
        """The new safe part of snapshot ``text`` (the whole text so far); with ``final`` the rest.

        Raises RuntimeError if ``text`` no longer starts with what was already handed out: a
        tokenizer whose decoding rewrites text further back than the held-back tail.
        """
        end = len(text) if final else self.stable_length(text)
        if end <= len(self.printed) and not final:
            return ""
        if not text.startswith(self.printed):  # checked on the final text always: nothing may be lost
            raise RuntimeError(
                f"the decoded text changed before its last {len(text) - len(self.printed)} characters "
                f"({self.printed[-20:]!r} became {text[: len(self.printed)][-20:]!r}); this tokenizer "
                "cannot be streamed by TextStream: use generate()"
            )
        piece = text[len(self.printed) : end]
        self.printed = text[:end]
        return piece

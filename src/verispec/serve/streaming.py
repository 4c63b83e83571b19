"""Incremental text for streamed answers: deltas that never split or drop a character.

The engine yields one ``GenerationOutput`` snapshot per round, each holding the decoded text of
every token so far (already cut at a stop string). Two things make a naive "new suffix" delta
wrong:

* a multi-byte character split across tokens decodes to U+FFFD until its last byte arrives, so a
  trailing U+FFFD may still turn into a different character;
* a stop string may be completed by the next round, and the engine then cuts the text at its
  start, so a suffix that is a prefix of a stop string may still disappear.

``TextDeltas`` holds both back until a later snapshot settles them and flushes the rest with the
final snapshot. The concatenated deltas then equal the final text whenever the decoded text of a
token prefix is a prefix of the decoded text of the longer sequence (true for byte-level BPE
tokenizers such as SmolLM2's once trailing U+FFFD and stop-string candidates are held back).

This is the server's ONE place for incremental text (``verispec.engine`` may later offer the same
helper; the server then only swaps ``TextDeltas``).
"""

from __future__ import annotations

from collections.abc import Sequence

REPLACEMENT_CHARACTER = "\ufffd"


def settled_length(text: str, stop: Sequence[str] = ()) -> int:
    """How many leading characters of ``text`` no later round can change.

    Holds back a trailing run of U+FFFD (an incomplete multi-byte character) and the longest
    suffix that is a proper prefix of a stop string (the next tokens may complete the stop string,
    which the engine then cuts off).
    """
    end = len(text.rstrip(REPLACEMENT_CHARACTER))
    held = 0
    for stop_string in stop:
        for size in range(min(len(stop_string) - 1, end), held, -1):
            if text.endswith(stop_string[:size], 0, end):
                held = size
                break
    return end - held


class TextDeltas:
    """Turns successive full texts into deltas: ``push(text)`` -> the newly settled characters,
    ``finish(text)`` -> everything not yet sent. ``sent`` is the text sent so far."""

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = tuple(stop)
        self.sent = ""

    def push(self, text: str) -> str:
        if not text.startswith(self.sent):
            return ""  # a tokenizer that rewrote earlier text: wait for the final text
        end = settled_length(text, self.stop)
        if end <= len(self.sent):
            return ""
        delta = text[len(self.sent) : end]
        self.sent = text[:end]
        return delta

    def finish(self, text: str) -> str:
        """The rest of the final text. Raises if an earlier delta is not a prefix of it (the
        concatenation could not equal the final text; never seen with byte-level BPE)."""
        if not text.startswith(self.sent):
            raise RuntimeError(
                f"streamed text {self.sent[-40:]!r} is not a prefix of the final text; the tokenizer's "
                "decoding is not prefix-stable"
            )
        delta = text[len(self.sent) :]
        self.sent = text
        return delta

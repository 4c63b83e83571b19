"""Incremental text of the server (engine.streaming.TextStream, shared with SpeculativeDecoder.stream): deltas never split or drop a character, and never send
text that a stop string will cut off."""

import pytest

from verispec.engine.streaming import REPLACEMENT_CHARACTER, TextStream

TEXT = "naïve café — 日本語 🙂🎉 über straße 👩‍💻 done"


def stream_token_prefixes(tokenizer, text, stop=()):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas, streamer = [], TextStream(stop)
    snapshots = [tokenizer.decode(ids[:n]) for n in range(1, len(ids) + 1)]
    for snapshot in snapshots:
        piece = streamer.push(snapshot)
        if piece:
            deltas.append(piece)
    deltas.append(streamer.push(snapshots[-1], final=True))
    return deltas, snapshots


def test_multibyte_characters_split_across_tokens_are_held_back(tokenizer):
    deltas, snapshots = stream_token_prefixes(tokenizer, TEXT)
    # the case is real: some token prefix ends inside a multi-byte character
    assert any(snapshot.endswith(REPLACEMENT_CHARACTER) for snapshot in snapshots)
    assert "".join(deltas) == TEXT
    assert not any(REPLACEMENT_CHARACTER in piece for piece in deltas)


def test_naive_suffix_streaming_would_corrupt_this_text(tokenizer):
    """Control: sending each snapshot's new suffix (no hold-back) does not reproduce the text."""
    _, snapshots = stream_token_prefixes(tokenizer, TEXT)
    naive, printed = [], ""
    for snapshot in snapshots:
        if snapshot.startswith(printed) and len(snapshot) > len(printed):
            naive.append(snapshot[len(printed):])
            printed = snapshot
    assert "".join(naive) != TEXT


def test_stop_string_prefix_is_held_until_settled():
    streamer = TextStream(stop=["STOP"])
    assert streamer.push("answer: 4 S") == "answer: 4 "  # "S" may begin STOP
    assert streamer.push("answer: 4 ST") == ""
    # the engine found STOP and cut the text at its start: nothing of it was ever sent
    assert streamer.push("answer: 4 ", final=True) == ""
    assert streamer.printed == "answer: 4 "


def test_stop_string_prefix_is_released_when_it_does_not_complete():
    streamer = TextStream(stop=["STOP"])
    assert streamer.push("a ST") == "a "
    assert streamer.push("a STAR") == "STAR"


def test_final_push_refuses_text_that_rewrote_what_was_sent():
    streamer = TextStream()
    streamer.push("abc d")
    with pytest.raises(RuntimeError, match="changed before"):
        streamer.push("abX d", final=True)

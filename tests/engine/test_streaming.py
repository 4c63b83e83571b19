"""stream() equals generate().text exactly (issue 10 item 7), on the real default tokenizer
(SmolLM2, byte-level BPE) with CJK and emoji output, for block sizes 1 to 5 and stop strings that
straddle blocks. The decoding loop is the real SpeculativeDecoder; a scripted target (a point mass
on a fixed token script) and a scripted draft (right for the first b - 1 positions of a round,
then wrong) make every round emit exactly the chosen number b of tokens."""

import numpy as np
import pytest
import torch

from verispec.engine.decoder import SpeculativeDecoder
from verispec.engine.streaming import REPLACEMENT_CHARACTER, TextStream
from verispec.errors import ConfigError
from verispec.models.hf import HFModelAdapter

TEXT = "翻译：你好，世界！🌍🚀 我喜欢吃🍜和寿司🍣。Ünïcödé ✨ 終わり🎉"


@pytest.fixture(scope="module")
def tokenizer():
    from verispec.models.default import load_default_tokenizer

    return load_default_tokenizer()  # converts the default target when the cache is new (clean CI)


class ScriptedTarget(HFModelAdapter):
    """Target adapter whose next token after g generated tokens is script[g] with probability 1
    (an HFModelAdapter in type only: it overrides every method the decoder calls)."""

    def __init__(self, script, vocab_size):  # no model behind it: skip the adapter's set-up
        self.script, self.vocab_size, self.max_context = list(script), vocab_size, 10**6

    def reset(self, prompt_ids):
        self.generated = 0

    def _row(self, position):
        row = torch.full((self.vocab_size,), -1e4)
        row[self.script[min(position, len(self.script) - 1)]] = 0.0
        return row

    def score(self, tokens, parents):
        depths = [0] * len(tokens)
        for node in range(1, len(tokens)):
            depths[node] = depths[parents[node]] + 1
        return torch.stack([self._row(self.generated + depth) for depth in depths])

    def commit(self, path, next_token):
        self.generated += len(path) + 1


class ScriptedDrafter:
    """Proposes the script's tokens for the first ``block - 1`` positions of each round, then a wrong
    token, so SD accepts block - 1 tokens and emits exactly ``block`` tokens (or L + 1)."""

    def __init__(self, script, vocab_size, blocks):
        self.script, self.vocab_size, self.blocks, self.calls = list(script), vocab_size, list(blocks), 0

    def reset(self, prompt_ids):
        self.generated, self.round = 0, 0

    def begin_round(self):
        block = self.blocks[self.round % len(self.blocks)]
        start = self.generated

        def probs(prefix):
            position = start + len(prefix)
            token = self.script[min(position, len(self.script) - 1)]
            if len(prefix) >= block - 1:
                token = (token + 1) % self.vocab_size
            row = np.zeros(self.vocab_size)
            row[token] = 1.0
            return row

        probs.batch_probs = lambda prefixes: [probs(tuple(p)) for p in prefixes]
        return probs

    def commit(self, accepted, next_token):
        self.generated += len(accepted) + 1
        self.round += 1


def scripted_decoder(tokenizer, script, blocks, stop=()):
    vocab = len(tokenizer)
    return SpeculativeDecoder(
        ScriptedTarget(script, vocab), ScriptedDrafter(script, vocab, blocks), tokenizer=tokenizer,
        method="sd", draft_len=max(max(blocks) - 1, 1), max_new_tokens=len(script), stop=stop, eos_token_id=[],
    )


def pieces_and_text(decoder, prompt):
    pieces = list(decoder.stream(prompt))
    return pieces, decoder.generate(prompt).text


@pytest.mark.parametrize("block", [1, 2, 3, 4, 5])
def test_stream_equals_generate_for_every_block_size(tokenizer, block):
    script = tokenizer.encode(TEXT, add_special_tokens=False)
    decoder = scripted_decoder(tokenizer, script, [block])
    pieces, text = pieces_and_text(decoder, [1, 2])
    assert text == tokenizer.decode(script) == TEXT
    assert "".join(pieces) == text
    assert all(REPLACEMENT_CHARACTER not in piece for piece in pieces)
    assert decoder.last_output.steps[0].new_tokens == block
    assert len(pieces) > 3  # it really streams: no piece is held back to the end


def test_the_script_really_splits_characters(tokenizer):
    """The fixture is strong enough: some blocks end inside a multi-byte character."""
    script = tokenizer.encode(TEXT, add_special_tokens=False)
    partial = [tokenizer.decode(script[:n]) for n in range(1, len(script))]
    assert sum(text.endswith(REPLACEMENT_CHARACTER) for text in partial) >= 5


@pytest.mark.parametrize("seed", range(8))
def test_stream_with_mixed_blocks_and_straddling_stop_strings(tokenizer, seed):
    script = tokenizer.encode(TEXT, add_special_tokens=False)
    rng = np.random.default_rng(seed)
    blocks = [int(b) for b in rng.integers(1, 6, size=7)]
    start = int(rng.integers(3, len(TEXT) - 6))
    stop = TEXT[start : start + int(rng.integers(2, 5))]
    decoder = scripted_decoder(tokenizer, script, blocks, stop=[stop, "never appears"])
    pieces, text = pieces_and_text(decoder, [1, 2])
    assert text == TEXT[: TEXT.index(stop)]
    assert "".join(pieces) == text
    assert decoder.last_output.stop_reason == "stop_string"


def test_text_stream_holds_back_only_what_can_change():
    stream = TextStream(stop=["STOP"])
    assert stream.push("你好" + REPLACEMENT_CHARACTER) == "你好"
    assert stream.push("你好世界 ST") == "世界 "  # "ST" could grow into "STOP"
    assert stream.push("你好世界 STAR ") == "STAR"  # a trailing space may still be cleaned up
    assert stream.push("你好世界 STAR🌍", final=True) == "🌍"


def test_text_stream_final_flushes_everything():
    stream = TextStream(stop=["\n\n"])
    assert stream.push("a\n") == "a"
    assert stream.push("a\n" + REPLACEMENT_CHARACTER, final=True) == "\n" + REPLACEMENT_CHARACTER


def test_empty_stop_string_is_refused():
    with pytest.raises(ConfigError, match="non-empty"):
        TextStream(stop=[""])


@pytest.mark.slow
def test_stream_equals_generate_with_the_real_model(tokenizer):
    """End to end: SmolLM2 translating into Chinese, n-gram draft, stop string."""
    from verispec.models.default import load_default_target

    model, tokenizer = load_default_target(torch.float32)
    prompt = "Translate into Chinese: Good morning, my friends! I love noodles 🍜."
    for seed, stop in ((0, ()), (1, ("。",))):
        decoder = SpeculativeDecoder(model, "ngram", tokenizer=tokenizer, method="sd", draft_len=3,
                                     max_new_tokens=24, seed=seed, stop=stop)
        pieces = list(decoder.stream(prompt))
        assert "".join(pieces) == decoder.generate(prompt).text
        assert len(pieces) >= 2

"""Clear errors from the engine (issue 3): mismatched vocabularies, context overflow,
max_new_tokens < 1, unknown methods, K/L out of range, a method given a shape it cannot verify."""

import pytest

from tests.engine.tiny import tiny_llama
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0), tiny_llama(1, layers=1), tiny_llama(2, vocab_size=7, layers=1)


def test_vocabulary_mismatch_names_both_sizes(models):
    target, _, other = models
    with pytest.raises(ConfigError, match="draft vocabulary has 7 tokens but the target has 6"):
        SpeculativeDecoder(target, other, method="sd")


def test_prompt_longer_than_context(models):
    target, draft, _ = models
    decoder = SpeculativeDecoder(target, draft, method="sd")
    with pytest.raises(ConfigError, match="does not fit the model's context"):
        decoder.generate([1] * 200)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(max_new_tokens=0), "max_new_tokens must be an integer >= 1"),
        (dict(method="nope"), "unknown method 'nope'"),
        (dict(method="spectr", num_drafts=0), r"num_drafts \(K\) must be an integer in \[1, 64\]"),
        (dict(method="sd", draft_len=0), r"draft_len \(L\) must be an integer in \[1, 64\]"),
        (dict(method="sd", draft_len=1000), r"draft_len \(L\)"),
        (dict(method="sd", num_drafts=2), "verifies a single draft path"),
        (dict(method="spectr", tree=[2, 2]), "not token trees"),
        (dict(method="spechub", tree=[3, 1]), "1 or 2 children per node"),
        (dict(method="spechub", num_drafts=3), "spechub drafts hub pairs"),
        (dict(method="sd", temperature=-1.0), "temperature must be >= 0"),
        (dict(method="sd", top_p=0.0), "top_p must lie in"),
    ],
)
def test_bad_configuration_is_refused(models, kwargs, message):
    target, draft, _ = models
    with pytest.raises(ConfigError, match=message):
        SpeculativeDecoder(target, draft, **kwargs)


def test_otm_refuses_real_vocabularies():
    big = tiny_llama(3, vocab_size=300, layers=1)
    with pytest.raises(ConfigError, match="exponential reference"):
        SpeculativeDecoder(big, big, method="otm", num_drafts=2)


def test_streaming_yields_the_generated_text(models):
    target, draft, _ = models

    class Chars:
        eos_token_id = None

        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return "".join(chr(97 + i) for i in ids)

    decoder = SpeculativeDecoder(target, draft, tokenizer=Chars(), method="bv", draft_len=3, max_new_tokens=12, seed=5, eos_token_id=[])
    pieces = list(decoder.stream([1, 2, 3]))
    assert len(pieces) >= 2 and "".join(pieces) == decoder.generate([1, 2, 3]).text
    assert len(decoder.last_output.token_ids) == 12

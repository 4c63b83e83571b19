"""Issue 10 item 8: each gap gets a clear ConfigError or a fix — prompt ids outside [0, V), tree
shapes past the K / L / node limits, empty stop strings, negative EOS ids, fractional
max_new_tokens, the model's generation_config EOS list, L shrunk near the end of the target's or
the draft's context (the partial output is kept)."""

import pytest

from tests.engine.tiny import tiny_llama
from verispec.engine.checks import MAX_TREE_NODES
from verispec.engine.decoder import SpeculativeDecoder
from verispec.errors import ConfigError


@pytest.fixture(scope="module")
def models():
    return tiny_llama(0, max_positions=64), tiny_llama(1, layers=1, max_positions=64)


@pytest.mark.parametrize("prompt", [[1, 6, 2], [1, -1]])
def test_prompt_ids_outside_the_vocabulary(models, prompt):
    target, draft = models
    with pytest.raises(ConfigError, match=r"prompt token ids must lie in \[0, 6\)"):
        SpeculativeDecoder(target, draft, method="sd").generate(prompt)


@pytest.mark.parametrize(
    "tree,message",
    [([100] * 10, r"at most 64 depths \(L\) of at most 64 children"), ([1] * 65, "at most 64 depths"),
     ([64, 64], f"more than {MAX_TREE_NODES} nodes")],
)
def test_tree_limits(models, tree, message):
    target, draft = models
    with pytest.raises(ConfigError, match=message):
        SpeculativeDecoder(target, draft, method="rrsw", tree=tree)


@pytest.mark.parametrize(
    "kwargs,message",
    [(dict(stop=[""]), "stop strings must be non-empty"), (dict(stop="ab"), "stop must be a list"),
     (dict(eos_token_id=-1), "eos_token_id must be token ids >= 0"),
     (dict(eos_token_id=[2, -3]), r"got \[-3\]"),
     (dict(max_new_tokens=2.5), "max_new_tokens must be an integer >= 1, got 2.5")],
)
def test_bad_settings(models, kwargs, message):
    target, draft = models
    with pytest.raises(ConfigError, match=message):
        SpeculativeDecoder(target, draft, method="sd", **kwargs)


class EosOnlyTokenizer:
    eos_token_id = 1

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def test_eos_includes_the_generation_config_list(models):
    target, draft = models
    target.generation_config.eos_token_id = [3, 5]
    try:
        decoder = SpeculativeDecoder(target, draft, tokenizer=EosOnlyTokenizer(), method="sd")
        assert decoder.eos_ids == {1, 3, 5}
        assert SpeculativeDecoder(target, draft, method="sd").eos_ids == set()  # token ids only: no implicit EOS
        assert SpeculativeDecoder(target, draft, tokenizer=EosOnlyTokenizer(), method="sd", eos_token_id=4).eos_ids == {4}
        output = decoder.generate([1, 2], rng=None)
        assert output.stop_reason in ("eos", "max_new_tokens")
        if output.stop_reason == "eos":
            assert output.token_ids[-1] in (1, 3, 5)
    finally:
        target.generation_config.eos_token_id = None


@pytest.mark.parametrize("method,shape", [("sd", dict(draft_len=20)), ("rrsw", dict(tree=[2] * 3 + [1] * 17))])
def test_draft_len_shrinks_to_the_free_context(models, method, shape):
    """57 free positions with L = 20: rounds still run, L shrinks at the end, every position is used."""
    target, draft = models
    decoder = SpeculativeDecoder(target, draft, method=method, max_new_tokens=500, eos_token_id=[], **shape)
    output = decoder.generate([1, 2, 3, 4, 5, 0, 1])
    assert output.stop_reason == "context"
    # every position 0..63 was scored; the last token is drawn from position 63 and needs none
    assert len(output.prompt_ids) + output.new_tokens == 65


def test_draft_with_a_shorter_context_keeps_the_output(models):
    target, _ = models
    short_draft = tiny_llama(1, layers=1, max_positions=24)
    output = SpeculativeDecoder(target, short_draft, method="sd", draft_len=6, max_new_tokens=500, eos_token_id=[]).generate([1, 2, 3])
    assert output.stop_reason == "context"
    assert len(output.prompt_ids) + output.new_tokens >= 24  # decoded up to the draft's context
    assert output.new_tokens == len(output.token_ids) > 0

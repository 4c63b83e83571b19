"""The gemma3-270m loader without the optional extra: a clear error naming the fix (runs always)."""

import importlib.util

import pytest

from verispec.errors import ConfigError
from verispec.models import gemma
from verispec.models.default import load_model


@pytest.fixture
def without_extra(monkeypatch, tmp_path):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, *args, **kwargs: None if name == gemma.GGUF_PACKAGE else real_find_spec(name, *args, **kwargs),
    )
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))  # no converted copy to fall back on


def test_missing_extra_names_the_install_command(without_extra, tmp_path):
    assert "verispec[gemma]" in gemma.gemma_available()
    with pytest.raises(ConfigError, match=r"verispec\[gemma\]"):
        load_model("gemma3-270m")
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_chat_format_refuses_a_non_gemma_tokenizer():
    class NotGemma:
        def get_vocab(self):
            return {"<|im_start|>": 1}

    with pytest.raises(ConfigError, match="not a Gemma 3 tokenizer"):
        gemma.set_chat_format(NotGemma())

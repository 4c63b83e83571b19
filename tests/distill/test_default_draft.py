"""load_default_draft: None without the asset, a sub-vocabulary draft with the target's vocabulary with it."""

import torch

import verispec.models.default_draft as default_draft
from tests.distill.helpers import tiny_llama, word_tokenizer
from verispec.distill.student import build_student
from verispec.distill.train import export_draft
from verispec.models.hf import HFModelAdapter

MAX_ASSET_BYTES = 40 * 2**20


def test_absent_asset_gives_none(tmp_path, monkeypatch):
    monkeypatch.setattr(default_draft, "DEFAULT_DRAFT_DIR", tmp_path / "missing")
    assert not default_draft.default_draft_available()
    assert default_draft.load_default_draft() is None


def test_an_exported_draft_loads_as_the_default(tmp_path, monkeypatch):
    target = tiny_llama(0, vocab_size=20)
    student = build_student(target, hidden=16, layers=1, sub_vocab_ids=torch.arange(2, 14))
    export_draft(student, tmp_path / "draft", word_tokenizer(20))
    monkeypatch.setattr(default_draft, "DEFAULT_DRAFT_DIR", tmp_path / "draft")
    model = default_draft.load_default_draft(torch.float32)
    assert isinstance(model, default_draft.SubVocabLlamaForCausalLM)
    assert HFModelAdapter(model).vocab_size == 20
    assert model.lm_head.token_ids.tolist() == list(range(2, 14))


def test_the_shipped_asset_if_any_is_small_and_matches_the_default_target():
    directory = default_draft.DEFAULT_DRAFT_DIR
    if not default_draft.default_draft_available():
        return  # the n-gram draft is the default: nothing shipped
    size = sum(path.stat().st_size for path in directory.iterdir() if path.is_file())
    assert size <= MAX_ASSET_BYTES
    model = default_draft.load_default_draft(torch.bfloat16)
    assert model.config.vocab_size == 49152
    assert HFModelAdapter(model).vocab_size == 49152

"""What ``--backend auto`` resolves to (``models.backend_choice``): llama.cpp only on a CPU without
native bf16, with the extra installed, a target llama.cpp runs as a GGUF, and a draft / rule that
run there; torch otherwise. No model is loaded: the rule reads flags and /proc/cpuinfo text."""

from __future__ import annotations

import pytest

from verispec.cli import main as cli_main
from verispec.models import backend_choice
from verispec.models.backend_choice import LLAMACPP, TORCH, choose_backend

NO_BF16 = "flags : fpu sse2 avx2 avx512f avx512bw"
NATIVE_BF16 = NO_BF16 + " avx512_bf16 amx_bf16"


@pytest.fixture
def extra_installed(monkeypatch):
    """The llamacpp extra counts as installed (the rule only asks whether it is)."""
    monkeypatch.setattr(backend_choice, "llamacpp_available", lambda: None)


def test_a_cpu_without_native_bf16_runs_the_default_target_on_llamacpp(extra_installed):
    for draft in (None, "tree", "ngram", "small.gguf"):
        choice = choose_backend(None, draft, None, cpuinfo=NO_BF16)
        assert choice.backend == LLAMACPP, draft
        assert "native bf16" in choice.reason
    assert choose_backend("default", None, "sd", cpuinfo=NO_BF16).backend == LLAMACPP


def test_a_native_bf16_cpu_keeps_torch(extra_installed):
    choice = choose_backend(None, None, None, cpuinfo=NATIVE_BF16)
    assert choice.backend == TORCH and "native bf16" in choice.reason


@pytest.mark.parametrize(
    "flags, why",
    [
        (dict(dtype="fp32"), "--dtype fp32"),
        (dict(device="cuda"), "--device cuda"),
        (dict(draft="head"), "draft 'head' runs on torch"),
        (dict(draft="/models/draft-dir"), "runs on torch"),
        (dict(draft="default"), "runs on torch"),  # the shipped trained draft, when there is one, is a torch model
        (dict(method="sprinter"), "SPRINTER"),
        (dict(target="/models/hf-dir"), "not a GGUF"),
    ],
)
def test_what_llamacpp_cannot_run_or_was_not_asked_for_stays_on_torch(extra_installed, flags, why):
    settings = dict(target=None, draft=None, method=None, dtype="auto", device="cpu") | flags
    choice = choose_backend(cpuinfo=NO_BF16, **settings)
    assert choice.backend == TORCH
    assert why in choice.reason


def test_without_the_extra_auto_stays_on_torch_and_says_why(monkeypatch):
    monkeypatch.setattr(backend_choice, "llamacpp_available", lambda: "the llamacpp backend needs llama-cpp-python")
    choice = choose_backend(None, None, None, cpuinfo=NO_BF16)
    assert choice.backend == TORCH and "needs llama-cpp-python" in choice.reason


def test_gemma_runs_on_llamacpp_only_with_its_extra(extra_installed, monkeypatch):
    import verispec.models.gemma as gemma

    monkeypatch.setattr(gemma, "gemma_available", lambda: None)
    assert choose_backend("gemma3-270m", None, None, cpuinfo=NO_BF16).backend == LLAMACPP
    monkeypatch.setattr(gemma, "gemma_available", lambda: "needs the gemma extra")
    assert choose_backend("gemma3-270m", None, None, cpuinfo=NO_BF16).backend == TORCH


def test_a_gguf_target_runs_on_llamacpp_whatever_the_cpu(extra_installed):
    assert choose_backend("model.gguf", None, None, cpuinfo=NATIVE_BF16).backend == LLAMACPP


@pytest.mark.parametrize("command", [["generate", "hi"], ["demo"]])
def test_the_cli_resolves_auto_before_loading_a_model(monkeypatch, command):
    seen = {}

    def fake_run(args):
        seen["backend"] = args.backend
        return 0

    import verispec.cli.generate as generate

    monkeypatch.setattr(backend_choice, "choose_backend", lambda *a, **k: backend_choice.BackendChoice(LLAMACPP, "test"))
    monkeypatch.setattr(generate, "run_generate", fake_run)
    monkeypatch.setattr(generate, "run_demo", fake_run)
    assert cli_main.main(command) == 0
    assert seen["backend"] == LLAMACPP
    assert cli_main.main(command + ["--backend", "native"]) == 0  # an explicit backend is kept
    assert seen["backend"] == "native"

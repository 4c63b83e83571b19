"""What ``--backend auto`` resolves to (``models.backend_choice``): llama.cpp on a CPU without native
bf16, and on one with bf16 but no AMX for long answers (not serve), with the extra installed, a
target llama.cpp runs as a GGUF, and a draft / rule that run there; torch otherwise. No model is
loaded: the rule reads flags and /proc/cpuinfo text."""

from __future__ import annotations

import pytest

from verispec.cli import main as cli_main
from verispec.models import backend_choice
from verispec.models.backend_choice import LLAMACPP, TORCH, choose_backend

NO_BF16 = "flags : fpu sse2 avx2 avx512f avx512bw"
AMX = NO_BF16 + " avx512_bf16 amx_bf16 amx_tile"
BF16_NO_AMX = NO_BF16 + " avx512_bf16"  # AMD Zen 4 / Zen 5


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


def test_amx_is_read_from_the_amx_bf16_flag(extra_installed):
    assert choose_backend(None, None, None, cpuinfo=BF16_NO_AMX + " amx_bf16").backend == TORCH
    assert choose_backend(None, None, None, cpuinfo=BF16_NO_AMX + " amx_tile amx_int8").backend == LLAMACPP  # no bf16 tiles


def test_an_amx_cpu_keeps_torch_for_every_command_and_length(extra_installed):
    for command in ("generate", "demo", "serve"):
        for length in (None, 8, 128, 4096):
            choice = choose_backend(None, None, None, cpuinfo=AMX, command=command, max_new_tokens=length)
            assert choice.backend == TORCH and "AMX" in choice.reason


@pytest.mark.parametrize("command", ["generate", "demo"])
def test_bf16_without_amx_weighs_the_answer_against_the_prompt(extra_installed, command):
    """llama.cpp unless the answer is short for its prompt: new tokens < share x prompt tokens."""
    share = backend_choice.NEW_PER_PROMPT_TOKEN

    def choice(new, prompt):
        return choose_backend(None, None, None, cpuinfo=BF16_NO_AMX, command=command, max_new_tokens=new, prompt_tokens=prompt)

    assert choice(32, 32 / share).backend == LLAMACPP  # at the crossover: llama.cpp
    assert choice(31, 32 / share).backend == TORCH
    assert "prefills faster" in choice(31, 32 / share).reason and f"{32 / share:.0f}-token prompt" in choice(31, 32 / share).reason
    assert choice(128, 40).backend == LLAMACPP  # a short chat prompt: decoding dominates
    assert choice(8, 2000).backend == TORCH  # a long document, a short answer: the prefill dominates
    assert choice(8, None).backend == choice(None, 2000).backend == LLAMACPP  # unknown: taken as long


def test_the_prompt_is_tokenized_only_when_its_length_decides(extra_installed):
    calls = []

    def prompt_tokens():
        calls.append(1)
        return 400.0

    choose_backend(None, None, None, cpuinfo=AMX, max_new_tokens=8, prompt_tokens=prompt_tokens)
    for cpuinfo in (BF16_NO_AMX, NO_BF16):
        choose_backend(None, None, None, cpuinfo=cpuinfo, command="serve", max_new_tokens=8, prompt_tokens=prompt_tokens)
        choose_backend(None, None, None, cpuinfo=cpuinfo, max_new_tokens=None, prompt_tokens=prompt_tokens)
    assert calls == []
    assert choose_backend(None, None, None, cpuinfo=BF16_NO_AMX, max_new_tokens=8, prompt_tokens=prompt_tokens).backend == TORCH
    assert choose_backend(None, None, None, cpuinfo=NO_BF16, max_new_tokens=64, prompt_tokens=prompt_tokens).backend == LLAMACPP
    assert calls == [1, 1]  # once per choice, also when it keeps llama.cpp


def test_bf16_without_amx_serves_on_torch(extra_installed):
    choice = choose_backend(None, None, None, cpuinfo=BF16_NO_AMX, command="serve", max_new_tokens=None)
    assert choice.backend == TORCH and "serve" in choice.reason


@pytest.mark.parametrize("command", ["generate", "demo"])
def test_a_cpu_without_bf16_weighs_only_a_very_short_answer_against_the_prompt(extra_installed, command):
    """llama.cpp (it decodes ~4x faster than torch fp32) unless new tokens < share x prompt tokens
    (torch fp32 prefills ~2.7x faster); the share is far below the bf16 CPUs' one."""
    share = backend_choice.NEW_PER_PROMPT_TOKEN_FP32
    assert share < backend_choice.NEW_PER_PROMPT_TOKEN

    def choice(new, prompt):
        return choose_backend(None, None, None, cpuinfo=NO_BF16, command=command, max_new_tokens=new, prompt_tokens=prompt)

    assert choice(32, 32 / share).backend == LLAMACPP  # at the crossover: llama.cpp
    assert choice(31, 32 / share).backend == TORCH
    assert "no native bf16" in choice(31, 32 / share).reason and "fp32 prefills faster" in choice(31, 32 / share).reason
    assert choice(128, 1000).backend == LLAMACPP  # the CLI's default answer after a long prompt: decoding dominates
    assert choice(48, 1000).backend == TORCH  # a long document, a short answer: the prefill dominates
    assert choice(8, None).backend == choice(None, 4000).backend == LLAMACPP  # unknown: taken as long


def test_a_cpu_without_bf16_serves_on_llamacpp_whatever_the_length(extra_installed):
    for length in (None, 1, 32, 128):
        choice = choose_backend(None, None, None, cpuinfo=NO_BF16, command="serve", max_new_tokens=length, prompt_tokens=4000)
        assert choice.backend == LLAMACPP


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
        (dict(batch_invariant=True), "--batch-invariant"),  # a mode of the native runner
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
    for cpuinfo in (AMX, BF16_NO_AMX, NO_BF16):
        assert choose_backend("model.gguf", None, None, cpuinfo=cpuinfo, command="serve", max_new_tokens=1).backend == LLAMACPP


@pytest.mark.parametrize("command", [["generate", "hi"], ["demo"]])
def test_the_cli_resolves_auto_before_loading_a_model(monkeypatch, command):
    seen = {}

    def fake_run(args):
        seen["backend"] = args.backend
        return 0

    def fake_choice(*args, **kwargs):
        seen["asked"] = kwargs
        seen["prompt_tokens"] = kwargs.pop("prompt_tokens")()
        return backend_choice.BackendChoice(LLAMACPP, "test")

    import verispec.cli.generate as generate

    monkeypatch.setattr(backend_choice, "choose_backend", fake_choice)
    monkeypatch.setattr(generate, "run_generate", fake_run)
    monkeypatch.setattr(generate, "run_demo", fake_run)
    assert cli_main.main(command + ["--max-new-tokens", "77"]) == 0
    assert seen["backend"] == LLAMACPP
    assert seen["asked"] == {"command": command[0], "max_new_tokens": 77, "batch_invariant": False}  # the command, lengths, mode
    assert 10 < seen["prompt_tokens"] < 1000  # the chat-wrapped "hi", or demo's HumanEval prompts, in tokens
    assert cli_main.main(command + ["--backend", "native"]) == 0  # an explicit backend is kept
    assert seen["backend"] == "native"


def test_the_cli_passes_batch_invariant_to_the_rule(extra_installed, monkeypatch):
    """`verispec generate --batch-invariant` resolves auto to torch on a CPU whose rule would pick
    llama.cpp (before, the run stopped with "this target runs on 'llamacpp'")."""
    seen = {}

    def spy(*args, **kwargs):
        seen.update(kwargs)
        raise SystemExit(0)  # stop before any model loads

    monkeypatch.setattr(backend_choice, "choose_backend", spy)
    with pytest.raises(SystemExit):
        cli_main.main(["generate", "Hi", "--batch-invariant", "--max-new-tokens", "4"])
    assert seen["batch_invariant"] is True

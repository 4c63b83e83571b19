"""What backend ``auto`` means for a command: llama.cpp or torch, decided from what is known about
the machine and the configuration, never from a start-up timing (one noisy reading decided
everything when the project tried that).

The rule (docs/llamacpp.md, "Which backend auto picks", gives the measurements behind it):
torch when any of these holds (llama.cpp cannot run the configuration, or was not asked for):

* --dtype is not auto or --device is not cpu;
* the llamacpp extra is not installed;
* the target is not one llama.cpp runs as a GGUF (the default target's shipped GGUF, Gemma 3 270M
  with the gemma extra, a .gguf path);
* the rule or draft needs torch: SPRINTER or a draft head (they read hidden states), or a Hugging
  Face draft model; or ``--batch-invariant`` (a mode of the native runner).

Otherwise by the CPU's kind (a .gguf target runs on llama.cpp in any case):

* no native bf16 dot products (``models.default.fast_dtype_name`` is "fp32"): llama.cpp, whose
  quantized kernels decode ~4x faster than torch fp32 there, unless ``generate`` / ``demo``'s answer is
  very short for its prompt: fewer than ``NEW_PER_PROMPT_TOKEN_FP32`` new tokens per prompt token,
  where torch fp32's ~2.7x faster prefill wins (an AVX2-only AMD EPYC, docs/llamacpp.md). ``serve``
  keeps llama.cpp;
* AMX (``amx_bf16``, Intel Xeon since Sapphire Rapids): torch bf16. Its tiles score a tree of 16
  tokens for about the price of one and prefill faster; its default configuration beat llama.cpp's
  end to end (Xeon runs of 2026-11-26);
* native bf16 without AMX (``avx512_bf16``: AMD Zen 4 / Zen 5): llama.cpp decodes faster than torch
  bf16's default there and torch prefills faster, so ``generate`` and ``demo`` take llama.cpp unless
  the answer is short for its prompt: fewer than ``NEW_PER_PROMPT_TOKEN`` new tokens per prompt token
  (the crossover of the two backends' fitted prefill and decode costs, docs/llamacpp.md). ``serve``
  keeps torch: its continuous batch was measured there (4 sequences 1.84x one), while llama.cpp's
  shared batch cache only empties when no request runs, so a server that never idles fills it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from verispec.models.llamacpp import is_gguf_source, llamacpp_available

TORCH = "auto"  # the torch runners' own meaning of "auto": the native forward when the model qualifies
LLAMACPP = "llamacpp"
# drafts that need no model, or name none: the decoder picks token trees / n-gram
MODEL_FREE_DRAFTS = (None, "tree", "ngram")
# new tokens per prompt token from which llama.cpp's faster decoding outweighs torch bf16's faster
# prefill on a native-bf16 CPU without AMX: (llama.cpp's - torch's prefill ms per prompt token) /
# (torch's - llama.cpp's decode ms per new token): 0.60 fitted on a Zen 5, 0.55 the best split of its
# 32 tuning prompts (docs/llamacpp.md, "Which backend auto picks")
NEW_PER_PROMPT_TOKEN = 0.55
# the same crossover on a CPU without native bf16, against torch fp32: (12.0 - 4.4 ms prefill per prompt
# token) / (97.6 - 22.0 ms per new token) = 0.10, fitted on the 32 tuning prompts on an AVX2-only AMD
# EPYC (splits at 0.08-0.2 were equally the best of them; docs/llamacpp.md, "Which backend auto picks")
NEW_PER_PROMPT_TOKEN_FP32 = 0.10


def _long_prompt(max_new_tokens: int | None, prompt_tokens: float | Callable[[], float] | None, share: float) -> float | None:
    """The prompt's length in tokens when the answer is short for it (max_new_tokens < share x that
    length), else None. An unknown length (None) counts as a long answer; ``prompt_tokens`` is called
    (it tokenizes) only when max_new_tokens is known."""
    if max_new_tokens is None:
        return None
    prompt = prompt_tokens() if callable(prompt_tokens) else prompt_tokens
    return prompt if prompt is not None and max_new_tokens < share * prompt else None


@dataclass(frozen=True)
class BackendChoice:
    """The backend ``auto`` resolved to, and why (one clause)."""

    backend: str
    reason: str


def _gguf_target(target: str | os.PathLike | None) -> str | None:
    """None when llama.cpp can run ``target`` as a GGUF here, else why not."""
    if target is None or str(target) == "default":
        return None
    if str(target) == "gemma3-270m":
        from verispec.models.gemma import gemma_available

        return gemma_available()
    if is_gguf_source(target):
        return None
    return "the target is a Hugging Face model directory, not a GGUF"


def choose_backend(
    target: str | os.PathLike | None,
    draft: str | os.PathLike | None,
    method: str | None,
    dtype: str = "auto",
    device: str = "cpu",
    cpuinfo: str | None = None,
    command: str = "generate",
    max_new_tokens: int | None = None,
    prompt_tokens: float | Callable[[], float] | None = None,
    batch_invariant: bool = False,
) -> BackendChoice:
    """What ``--backend auto`` runs for these flags (see the module docstring); ``cpuinfo``: the
    text of /proc/cpuinfo (read when None); ``command``: generate, demo or serve;
    ``max_new_tokens``: the answer's length bound (None: unknown, taken as long); ``prompt_tokens``:
    the prompts' mean length in tokens, or a function giving it (called only when the rule needs it:
    it tokenizes); None: unknown, the answer is taken as long for it. ``batch_invariant``: the
    batch-invariant mode was asked for, which only the native torch runner has."""
    from verispec.models.default import fast_dtype_name, read_cpuinfo

    if is_gguf_source(target):  # a GGUF path only runs on llama.cpp
        return BackendChoice(LLAMACPP, "the target is a GGUF file")
    if dtype != "auto" or str(device) != "cpu":
        return BackendChoice(TORCH, f"--dtype {dtype} --device {device} ask for torch")
    reason = llamacpp_available() or _gguf_target(target)
    if reason is not None:
        return BackendChoice(TORCH, reason)
    if batch_invariant:
        return BackendChoice(TORCH, "--batch-invariant shapes the forwards of the native torch runner")
    if method == "sprinter":
        return BackendChoice(TORCH, "SPRINTER reads hidden states, which llama.cpp does not return")
    if not (draft in MODEL_FREE_DRAFTS or is_gguf_source(draft)):
        return BackendChoice(TORCH, f"the draft {str(draft)!r} runs on torch")
    cpuinfo = read_cpuinfo() if cpuinfo is None else cpuinfo
    if fast_dtype_name(cpuinfo) != "bf16":
        prompt = None if command == "serve" else _long_prompt(max_new_tokens, prompt_tokens, NEW_PER_PROMPT_TOKEN_FP32)
        if prompt is not None:
            return BackendChoice(TORCH, f"no native bf16, {max_new_tokens} new tokens for a {prompt:.0f}-token "
                                        "prompt: torch fp32 prefills faster")
        return BackendChoice(LLAMACPP, "this CPU lacks native bf16: llama.cpp's quantized kernels are faster than torch fp32")
    if "amx_bf16" in cpuinfo.split():
        return BackendChoice(TORCH, "this CPU has AMX: torch bf16 with token trees is faster")
    if command == "serve":
        return BackendChoice(TORCH, "native bf16 without AMX, serve: the continuous batch runs on torch")
    prompt = _long_prompt(max_new_tokens, prompt_tokens, NEW_PER_PROMPT_TOKEN)
    if prompt is not None:
        return BackendChoice(TORCH, f"native bf16 without AMX, {max_new_tokens} new tokens for a {prompt:.0f}-token "
                                    "prompt: torch bf16 prefills faster")
    return BackendChoice(LLAMACPP, "native bf16 without AMX and a long enough answer: llama.cpp decodes faster than torch bf16")

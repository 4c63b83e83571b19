"""What backend ``auto`` means for a command: llama.cpp or torch, decided from what is known about
the machine and the configuration, never from a start-up timing (one noisy reading decided
everything when the project tried that).

The rule (docs/llamacpp.md, "Which backend auto picks", gives the measurements behind it):
llama.cpp when ALL of these hold, torch otherwise:

* the CPU lacks native bf16 dot products (``models.default.fast_dtype_name`` is "fp32"): torch
  then runs fp32, one token ~3x slower than llama.cpp's quantized kernels (DESIGN.md §7), and
  llama.cpp's plain decoding alone beats torch's speculative decoding; on a native-bf16 CPU torch
  bf16 scores a tree of 8-16 tokens for about the price of one, and its default configuration
  measured faster than llama.cpp's end to end;
* --dtype is auto and --device is cpu (an explicit dtype or a GPU asks for torch);
* the llamacpp extra is installed;
* the target is one llama.cpp runs as a GGUF: the default target (its shipped GGUF), Gemma 3
  270M with the gemma extra installed, or a .gguf path;
* the draft and the rule run there: no draft head (it reads hidden states), no SPRINTER, and the
  draft is the token-tree or n-gram draft or a .gguf file (a Hugging Face draft model stays with
  a torch target).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from verispec.models.llamacpp import is_gguf_source, llamacpp_available

TORCH = "auto"  # the torch runners' own meaning of "auto": the native forward when the model qualifies
LLAMACPP = "llamacpp"
# drafts that need no model, or name none: the decoder picks token trees / n-gram
MODEL_FREE_DRAFTS = (None, "tree", "ngram")


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
) -> BackendChoice:
    """What ``--backend auto`` runs for these flags (see the module docstring); ``cpuinfo``: the
    text of /proc/cpuinfo (read when None)."""
    from verispec.models.default import fast_dtype_name

    if is_gguf_source(target):  # a GGUF path only runs on llama.cpp
        return BackendChoice(LLAMACPP, "the target is a GGUF file")
    if fast_dtype_name(cpuinfo) == "bf16":
        return BackendChoice(TORCH, "this CPU has native bf16: torch bf16 with token trees is faster")
    if dtype != "auto" or str(device) != "cpu":
        return BackendChoice(TORCH, f"--dtype {dtype} --device {device} ask for torch")
    reason = llamacpp_available() or _gguf_target(target)
    if reason is not None:
        return BackendChoice(TORCH, reason)
    if method == "sprinter":
        return BackendChoice(TORCH, "SPRINTER reads hidden states, which llama.cpp does not return")
    if not (draft in MODEL_FREE_DRAFTS or is_gguf_source(draft)):
        return BackendChoice(TORCH, f"the draft {str(draft)!r} runs on torch")
    return BackendChoice(LLAMACPP, "this CPU lacks native bf16: llama.cpp's quantized kernels are faster than torch fp32")

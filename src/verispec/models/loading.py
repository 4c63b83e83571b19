"""Loading any model directory, and the steps every named target shares when it converts a GGUF.

Models are loaded with ``attn_implementation="sdpa"`` (falling back to "eager"): the tree
attention of ``HFModelAdapter`` passes a custom 4D mask, which flash-attention implementations ignore.

The named targets (``default.py``: SmolLM2-135M-Instruct, ``gemma.py``: Gemma 3 270M) each
de-quantize a GGUF once, stage the safetensors in a sibling directory, and cache them under
``cache_root()``; ``default.load_model`` dispatches between them and a local directory.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def cache_root() -> Path:
    """Where converted targets are saved: $VERISPEC_CACHE or ~/.cache/verispec."""
    root = os.environ.get("VERISPEC_CACHE") or Path.home() / ".cache" / "verispec"
    return Path(root).expanduser()


def load_dequantized_gguf(directory: Path, filename: str):
    """A GGUF checkpoint de-quantized by transformers into a float32 model that can be saved."""
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32, local_files_only=True)
    # The weights are already dense float32; the GGUF quantizer record only blocks saving.
    model.config.__dict__.pop("quantization_config", None)
    model.hf_quantizer = None
    return model


@contextmanager
def staged_directory(target: Path):
    """A temporary sibling of ``target`` to write a converted model into; renamed to ``target`` when
    the block succeeds, so a crash or a concurrent first load never leaves a half-written cache."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        yield staging
        staging.chmod(0o755)  # mkdtemp makes it private
        os.rename(staging, target)
    except OSError:
        # the target appears only by this rename, whole: if it exists, another process won the race
        # (the assembled GGUF directory has no config.json, so only the directory itself can tell)
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def load_pretrained_dir(path: Path, dtype: torch.dtype, device: str | torch.device):
    """(model, tokenizer) from a local directory, eval mode, with a tree-mask-capable attention."""
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, attn_implementation="sdpa"
        )
    except ValueError:  # an architecture without SDPA support
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, local_files_only=True, attn_implementation="eager"
        )
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return model.to(device).eval(), tokenizer

"""Models: the Hugging Face adapter and its runners, the default target, the n-gram draft, toy models."""

from verispec.errors import ConfigError

# How a model forward runs: ``models.hf.HFModelAdapter``'s runners (auto, native, transformers) or a
# GGUF file through llama.cpp (``models.llamacpp``). Kept here, free of
# torch imports, so configuration parsing can check a backend before any model is loaded.
BACKENDS = ("auto", "native", "transformers", "llamacpp")


def check_backend(backend: str) -> str:
    """``backend`` if it is one of BACKENDS, else a ConfigError naming the choices."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend

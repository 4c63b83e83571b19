"""Models: the Hugging Face adapter and its runners, the default target, the n-gram draft, toy models."""

from verispec.errors import ConfigError

# How ``models.hf.HFModelAdapter`` runs a model forward (see that module). Kept here, free of
# torch imports, so configuration parsing can check a backend before any model is loaded.
BACKENDS = ("auto", "native", "transformers")


def check_backend(backend: str) -> str:
    """``backend`` if it is one of BACKENDS, else a ConfigError naming the choices."""
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend

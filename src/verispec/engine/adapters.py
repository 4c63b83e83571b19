"""Which adapter runs a model given to the engine: torch (``models.hf``) or llama.cpp (``models.llamacpp``)."""

from __future__ import annotations


def _as_adapter(model, device=None, backend: str = "auto"):
    """The KV-cached adapter of ``model``: an adapter as is; a GGUF file (a ``.gguf`` path, or the
    default / a named target on backend "llamacpp") on llama.cpp (``models.llamacpp``); a
    transformers model on torch (``models.hf``)."""
    from verispec.models.hf import HFModelAdapter
    from verispec.models.llamacpp import LlamaCppAdapter, is_gguf_source, load_llamacpp_adapter

    if isinstance(model, (HFModelAdapter, LlamaCppAdapter)):
        return model
    if backend == "llamacpp" or is_gguf_source(model):
        return load_llamacpp_adapter(model, backend)
    return HFModelAdapter(model, device=device, backend=backend)


def draft_backend(backend: str, draft) -> str:
    """The backend a draft model runs on: the decoder's, except that a transformers draft next to a
    llama.cpp target runs on torch ("auto"): only GGUF drafts run on llama.cpp."""
    from verispec.models.llamacpp import LlamaCppAdapter, is_gguf_source

    if backend == "llamacpp" and not (is_gguf_source(draft) or isinstance(draft, LlamaCppAdapter)):
        return "auto"
    return backend

"""verispec: speculative decoding with every verification rule, each proven exact.

``from verispec import SpeculativeDecoder`` is the entry point for decoding; the verification
rules live in ``verispec.verify`` (pure numpy) and their registry in ``verispec.verify.registry``.
"""

__version__ = "0.1.0"
__all__ = ["SpeculativeDecoder", "GenerationOutput", "METHODS", "get_method"]


def __getattr__(name):
    # Lazy so that ``import verispec.verify`` does not pull in torch / transformers.
    if name in ("SpeculativeDecoder", "GenerationOutput"):
        from verispec.engine import decoder

        return getattr(decoder, name)
    if name in ("METHODS", "get_method"):
        from verispec.verify import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'verispec' has no attribute {name!r}")

"""Exceptions raised by verispec. Every message names the bad value and how to fix it."""


class VerispecError(ValueError):
    """Base class of all verispec input errors (a ValueError, so generic handlers still work)."""


class InvalidDistributionError(VerispecError):
    """A probability vector is negative, NaN, of the wrong length, or does not sum to 1."""


class InvalidDraftError(VerispecError):
    """A draft tree is malformed: bad parent links, a token outside the vocabulary, ..."""


class UnsupportedDraftSchemeError(VerispecError):
    """A verifier was given a draft drawn with a sampling scheme under which it is not exact."""


class ConfigError(VerispecError):
    """A configuration value (K, L, temperature, method name, ...) is out of range or unknown."""

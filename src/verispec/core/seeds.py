"""The one seed validator shared by the CLI, the Python API and the server.

A seed is a non-negative integer below 2**63: numpy's generators refuse negative seeds, and 2**63
is the largest range every caller can pass losslessly (OpenAI's ``seed`` is a signed 64-bit
integer; a JSON number above it would be silently rounded or wrapped by other servers). Anything
else is refused with a message naming the value and the fix, never reduced modulo something.
"""

from __future__ import annotations

import numbers

from verispec.errors import ConfigError

SEED_LIMIT = 2**63


def check_seed(value, name: str = "seed") -> int:
    """``value`` as an ``int`` if it is an integer in [0, 2**63); else ``ConfigError`` naming it.

    bool, float (even 3.0), str and numpy floats are refused: a seed is an exact integer, and
    accepting "7" or 7.0 here but not elsewhere would make the three entry points disagree.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer in [0, 2**63), got {value!r} ({type(value).__name__}); "
                          f"pass a whole number such as 0 or 1234")
    seed = int(value)
    if not 0 <= seed < SEED_LIMIT:
        raise ConfigError(f"{name} must be an integer in [0, 2**63) = [0, {SEED_LIMIT - 1}], got {seed}; "
                          f"pass a non-negative seed below 2**63")
    return seed

"""Argparse types and the parser class of the command line: any bad flag value ends the command
with exit status 2 and ONE line, ``verispec generate: error: argument --seed: ...``, before a model
is loaded (never a traceback, never a usage block hiding the message).

Each type checks what a flag means (a port, a seed, a temperature...) and says what to pass
instead; checks that need the loaded model (L against the context, K against a rule) stay in the
engine, whose ``ConfigError`` the command also prints as one line with status 2.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

from verispec.core.seeds import check_seed
from verispec.errors import ConfigError


class OneLineParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line on stderr and exit status 2 (argparse's
    status); ``--help`` still prints the full usage."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _integer(text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    return value


def int_at_least(low: int, meaning: str = "") -> Callable[[str], int]:
    """A whole number >= ``low``; ``meaning`` explains the bound in the message."""

    def parse(text: str) -> int:
        value = _integer(text)
        if value < low:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {low}{meaning}, got {value}")
        return value

    parse.__name__ = f"int_at_least_{low}"
    return parse


def draft_len(text: str) -> int | None:
    """-L: a whole number >= 1 (the same every round) or "auto" (None: chosen per round for chain rules)."""
    if text.strip().lower() == "auto":
        return None
    try:
        return int_at_least(1)(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(f"{error} (or 'auto')") from None


def number_at_least(low: float, meaning: str = "", strict: bool = False) -> Callable[[str], float]:
    """A finite number >= ``low`` (> ``low`` if ``strict``)."""

    def parse(text: str) -> float:
        value = _number(text)
        if not math.isfinite(value) or value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be a finite number {'>' if strict else '>='} {low:g}{meaning}, got {text}")
        return value

    parse.__name__ = f"number_at_least_{low:g}"
    return parse


def temperature(text: str) -> float:
    return number_at_least(0.0, " (0 = greedy)")(text)


def top_p(text: str) -> float:
    value = _number(text)
    if not 0.0 < value <= 1.0:  # false for nan
        raise argparse.ArgumentTypeError(f"must lie in (0, 1] (1 disables it), got {text}")
    return value


def probability(text: str) -> float:
    value = _number(text)
    if not 0.0 <= value <= 1.0:  # false for nan
        raise argparse.ArgumentTypeError(f"must lie in [0, 1], got {text}")
    return value


def seed(text: str) -> int:
    try:
        return check_seed(_integer(text), "the seed")
    except ConfigError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def port(text: str) -> int:
    value = _integer(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be a TCP port in [0, 65535] (0 = any free port), got {value}")
    return value


def positive_int_list(text: str) -> list[int]:
    """A comma list of whole numbers >= 1, e.g. a tree's children per depth "2,2,1"."""
    values = [_integer(part) for part in text.split(",") if part.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"must be a comma list of whole numbers >= 1, e.g. 2,2,1; got {text!r}")
    return values


def device(text: str) -> str:
    """A torch device this build of torch can use: cpu, or cuda[:N] with a CUDA build and device."""
    if text == "cpu":
        return text  # the default: no torch import at parse time
    import torch

    try:
        parsed = torch.device(text)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; use cpu or cuda (cuda:0, cuda:1, ...)") from None
    if parsed.type == "cuda":
        if not torch.backends.cuda.is_built():
            raise argparse.ArgumentTypeError("this torch build has no CUDA; install a CUDA build of torch or use --device cpu")
        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("torch finds no CUDA device (torch.cuda.is_available() is False); use --device cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"there is no {text}: torch sees {torch.cuda.device_count()} CUDA device(s)")
    elif parsed.type != "cpu":
        raise argparse.ArgumentTypeError(f"device {text!r} is not supported; use cpu or cuda")
    return text


def fail(command: str, message: str) -> int:
    """Print a one-line error of ``verispec COMMAND`` and return exit status 2."""
    print(f"verispec {command}: error: {message}", file=sys.stderr)
    return 2

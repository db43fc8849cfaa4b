"""argparse types for numeric flags: out-of-range values are usage errors
(exit 2, with the flag named) instead of being accepted and misbehaving later."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable


def _number(
    parse: Callable[[str], float], kind: str, least: float, strict: bool
) -> Callable[[str], float]:
    bound = f"{'greater than' if strict else 'at least'} {least:g}"

    def check(text: str) -> float:
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {kind}, got {text[:40]!r}") from None
        if not math.isfinite(value) or value < least or (strict and value == least):
            raise argparse.ArgumentTypeError(f"must be {bound}, got {text[:40]!r}")
        return value

    check.__name__ = kind
    return check


def positive_int(text: str) -> int:
    """An integer of at least 1."""
    return int(_POSITIVE_INT(text))


def non_negative_int(text: str) -> int:
    """An integer of at least 0."""
    return int(_NON_NEGATIVE_INT(text))


def positive_float(text: str) -> float:
    """A finite number greater than 0."""
    return _POSITIVE_FLOAT(text)


def non_negative_float(text: str) -> float:
    """A finite number of at least 0."""
    return _NON_NEGATIVE_FLOAT(text)


_POSITIVE_INT = _number(int, "an integer", 1, strict=False)
_NON_NEGATIVE_INT = _number(int, "an integer", 0, strict=False)
_POSITIVE_FLOAT = _number(float, "a number", 0, strict=True)
_NON_NEGATIVE_FLOAT = _number(float, "a number", 0, strict=False)

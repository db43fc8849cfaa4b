"""Reading a broker backend's keyword settings (pure).

Every broker backend takes named settings plus client options for its library,
as a mapping under the backend's name or as ``<backend>.<option>`` keywords;
these helpers check them the same way and name the bad one.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from headrace import errors


def refuse_unknown(raw: Mapping[str, Any], known: Collection[str], backend: str) -> None:
    """InvalidArgument naming the settings that are neither ``known`` nor client options."""
    unknown = sorted(k for k in raw if k not in known and not k.startswith(f"{backend}."))
    if unknown:
        raise errors.InvalidArgument(
            f"unknown {backend} backend settings {unknown} (known: {sorted(known)} and {backend}.*)"
        )


def integer(raw: Mapping[str, Any], key: str, default: int, minimum: int, backend: str) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise errors.InvalidArgument(f"{backend} setting {key} must be an integer >= {minimum}")
    return value


def positive_number(raw: Mapping[str, Any], key: str, default: float, backend: str) -> float:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise errors.InvalidArgument(f"{backend} setting {key} must be a positive number")
    return float(value)


def client_options(raw: Mapping[str, Any], backend: str, owned: Collection[str]) -> dict[str, Any]:
    """The client options: the mapping under ``backend``, then ``<backend>.*`` keywords.

    Options the backend sets itself (``owned``) are refused.
    """
    nested = raw.get(backend, {})
    if not isinstance(nested, Mapping):
        raise errors.InvalidArgument(
            f"{backend} setting {backend!r} must be a mapping of client options"
        )
    options = {str(key): value for key, value in nested.items()}
    prefix = f"{backend}."
    options.update({k.removeprefix(prefix): v for k, v in raw.items() if k.startswith(prefix)})
    refused = sorted(k for k in options if k in owned)
    if refused:
        raise errors.InvalidArgument(
            f"{backend} client options {refused} are set by the backend itself and cannot be "
            "overridden"
        )
    return options

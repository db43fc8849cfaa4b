"""Backends plug in here by name; the framework only sees the contract."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from headrace import errors
from headrace.wal.contract import Backend

BackendFactory = Callable[..., Backend]

_BUILTIN_MODULES = {
    "local": "headrace.wal.local",
    "memory": "headrace.wal.memory",
    "kafka": "headrace.wal.kafka",
    "pulsar": "headrace.wal.pulsar",
}
_FACTORIES: dict[str, BackendFactory] = {}


def register(name: str, factory: BackendFactory) -> None:
    """Register a backend factory; a backend module calls this on import."""
    _FACTORIES[name] = factory


def create(name: str, **settings: Any) -> Backend:
    """Create the backend ``name`` with backend-specific ``settings``."""
    if name not in _FACTORIES and name in _BUILTIN_MODULES:
        try:
            importlib.import_module(_BUILTIN_MODULES[name])
        except ImportError as exc:
            raise errors.InvalidArgument(
                f"WAL backend {name!r} needs an optional dependency: {exc}"
            ) from None
    try:
        factory = _FACTORIES[name]
    except KeyError:
        known = ", ".join(sorted(set(_FACTORIES) | set(_BUILTIN_MODULES)))
        raise errors.InvalidArgument(f"unknown WAL backend {name!r} (known: {known})") from None
    return factory(**settings)


def load_id_classes() -> None:
    """Import the built-in backends' message id modules so ids parse."""
    for name, module in _BUILTIN_MODULES.items():
        try:
            importlib.import_module(f"{module}.message_id")
        except ImportError:
            continue
        del name

"""Registering a broker backend whose client library is optional.

Importing a backend package needs no client library (so its message ids parse
everywhere); the backend module, which imports the library, is imported when a
backend is created, and a missing library is a clear InvalidArgument.
"""

from __future__ import annotations

import importlib
from typing import Any

from headrace import errors
from headrace.wal import registry
from headrace.wal.contract import Backend


def register_lazily(name: str, module: str, needs: str) -> registry.BackendFactory:
    """Register ``name`` as ``module.create_backend``, imported on first use.

    ``needs`` says what to install, e.g. ``"confluent-kafka (pip install
    'headrace[kafka]')"``. Returns the registered factory.
    """

    def create_backend(**settings: Any) -> Backend:
        try:
            factory = importlib.import_module(module).create_backend
        except ImportError as exc:
            raise errors.InvalidArgument(f"the {name} WAL backend needs {needs}: {exc}") from None
        backend: Backend = factory(**settings)
        return backend

    create_backend.__doc__ = f'Registry factory: ``registry.create("{name}", ...)``.'
    registry.register(name, create_backend)
    return create_backend

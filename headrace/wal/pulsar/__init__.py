"""Pulsar WAL backend; registers itself as ``pulsar``.

Importing this package needs no client library, so Pulsar message ids parse
everywhere; the client (pulsar-client, the ``pulsar`` extra) is imported when a
backend is created.
"""

from __future__ import annotations

from typing import Any

from headrace import errors
from headrace.wal import registry
from headrace.wal.contract import Backend
from headrace.wal.pulsar.message_id import PulsarMessageID


def create_backend(**settings: Any) -> Backend:
    """Registry factory: ``registry.create("pulsar", ...)``."""
    try:
        from headrace.wal.pulsar.backend import create_backend as create  # noqa: PLC0415
    except ImportError as exc:
        raise errors.InvalidArgument(
            f"the pulsar WAL backend needs pulsar-client (pip install 'headrace[pulsar]'): {exc}"
        ) from None
    return create(**settings)


registry.register("pulsar", create_backend)

__all__ = ["PulsarMessageID", "create_backend"]

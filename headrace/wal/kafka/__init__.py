"""Kafka WAL backend; registers itself as ``kafka``.

Importing this package needs no client library, so Kafka message ids parse
everywhere; the client (confluent-kafka, the ``kafka`` extra) is imported when a
backend is created.
"""

from __future__ import annotations

from typing import Any

from headrace import errors
from headrace.wal import registry
from headrace.wal.contract import Backend
from headrace.wal.kafka.message_id import KafkaMessageID


def create_backend(**settings: Any) -> Backend:
    """Registry factory: ``registry.create("kafka", ...)``."""
    try:
        from headrace.wal.kafka.backend import create_backend as create  # noqa: PLC0415
    except ImportError as exc:
        raise errors.InvalidArgument(
            f"the kafka WAL backend needs confluent-kafka (pip install 'headrace[kafka]'): {exc}"
        ) from None
    return create(**settings)


registry.register("kafka", create_backend)

__all__ = ["KafkaMessageID", "create_backend"]

"""Pulsar WAL backend; registers itself as ``pulsar``.

Importing this package needs no client library, so Pulsar message ids parse
everywhere; the client (pulsar-client, the ``pulsar`` extra) is imported when a
backend is created.
"""

from __future__ import annotations

from headrace.wal.brokers.registration import register_lazily
from headrace.wal.pulsar.message_id import PulsarMessageID

create_backend = register_lazily(
    "pulsar", "headrace.wal.pulsar.backend", "pulsar-client (pip install 'headrace[pulsar]')"
)

__all__ = ["PulsarMessageID", "create_backend"]

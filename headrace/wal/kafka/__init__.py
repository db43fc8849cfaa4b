"""Kafka WAL backend; registers itself as ``kafka``.

Importing this package needs no client library, so Kafka message ids parse
everywhere; the client (confluent-kafka, the ``kafka`` extra) is imported when a
backend is created.
"""

from __future__ import annotations

from headrace.wal.brokers.registration import register_lazily
from headrace.wal.kafka.message_id import KafkaMessageID

create_backend = register_lazily(
    "kafka", "headrace.wal.kafka.backend", "confluent-kafka (pip install 'headrace[kafka]')"
)

__all__ = ["KafkaMessageID", "create_backend"]

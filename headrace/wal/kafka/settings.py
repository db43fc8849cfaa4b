"""Settings of the Kafka backend and the client configurations they imply (pure).

Keyword settings (``registry.create("kafka", ...)``):

* ``bootstrap_servers`` (required): ``host:port[,host:port...]``.
* ``cluster`` (``"default"``) and ``topic_prefix`` (``"headrace.<cluster>."``):
  the topic of pchannel ``p`` is ``<topic_prefix><p>``.
* ``replication_factor`` (1), ``min_insync_replicas`` (None: broker default),
  ``timestamp_type`` (``"CreateTime"`` or ``"LogAppendTime"``), ``retention_ms``
  (-1: unlimited) and ``retention_bytes`` (-1): used when the backend creates a
  missing topic; an existing topic is used as it is.
* ``max_message_bytes`` (8 MiB + 64 KiB): the largest record the producer sends
  and the ``max.message.bytes`` of topics the backend creates.
* ``transaction_timeout_ms`` (30000): how long the broker waits for a writer
  that died inside a transaction before aborting it (readers stall behind it).
* ``operation_timeout_s`` (30.0): bound of every blocking broker call.
* ``kafka`` (a dict) and any ``kafka.<name>`` keyword: librdkafka client
  configuration passed to every client, e.g. ``security.protocol``,
  ``sasl.mechanism``, ``sasl.username``, ``ssl.ca.location``. Keys the backend
  must own (transactions, isolation, acknowledgements) are refused.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Mapping
from typing import Any

from headrace import errors
from headrace.message.types import DEFAULT_MAX_MESSAGE_BYTES
from headrace.wal.brokers.settings import client_options, integer, positive_number, refuse_unknown

_TOPIC_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_MAX_TOPIC = 249
_OWNED_KEYS = frozenset(
    {
        "bootstrap.servers",
        "transactional.id",
        "enable.idempotence",
        "acks",
        "request.required.acks",
        "isolation.level",
        "enable.auto.commit",
        "group.id",
        "auto.offset.reset",
        "enable.partition.eof",
        "transaction.timeout.ms",
        "enable.gapless.guarantee",
    }
)
_SECRET_MARKERS = ("password", "secret", "key", "token", "jaas")
_TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
SCAN_FETCH_WAIT_MS = 5
READER_FETCH_WAIT_MS = 100
DEFAULT_MAX_BYTES = DEFAULT_MAX_MESSAGE_BYTES + 64 * 1024
"""Room for the framework's largest message plus record headers and batch overhead."""


@dataclasses.dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str
    topic_prefix: str = "headrace.default."
    replication_factor: int = 1
    min_insync_replicas: int | None = None
    timestamp_type: str = "CreateTime"
    retention_ms: int = -1
    retention_bytes: int = -1
    max_message_bytes: int = DEFAULT_MAX_BYTES
    transaction_timeout_ms: int = 30_000
    operation_timeout_s: float = 30.0
    client: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def topic(self, pchannel: str) -> str:
        """Topic of ``pchannel``; InvalidArgument if Kafka cannot name it."""
        if not isinstance(pchannel, str) or not pchannel:
            raise errors.InvalidArgument(f"invalid pchannel name {pchannel!r}")
        name = f"{self.topic_prefix}{pchannel}"
        if not _TOPIC_CHARS.match(name) or len(name) > _MAX_TOPIC or name in (".", ".."):
            raise errors.InvalidArgument(
                f"pchannel {pchannel!r} gives the Kafka topic name {name!r}, which Kafka "
                f"refuses: use only letters, digits, '.', '_' and '-', at most {_MAX_TOPIC} "
                "characters in all"
            )
        return name

    def base_config(self) -> dict[str, Any]:
        return {**self.client, "bootstrap.servers": self.bootstrap_servers}

    def producer_config(self, topic: str) -> dict[str, Any]:
        return {
            "linger.ms": 1,
            **self.base_config(),
            "transactional.id": f"headrace-wal-{topic}",
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": self.transaction_timeout_ms,
            "message.max.bytes": self.max_message_bytes,
        }

    def idempotent_producer_config(self) -> dict[str, Any]:
        """The chained writer's producer: the transactional one's settings, no transactions.

        Its records must be stored without gaps: a record after one that was not
        stored would land one offset early, where the record it names may be a
        newer writer's fence record (:mod:`headrace.wal.kafka.chain`). So a
        record the broker refuses stops the producer (``enable.gapless.guarantee``;
        by default librdkafka resets the sequence and sends the next ones), and
        librdkafka never gives up on a record by itself (``message.timeout.ms``
        0, which the gap-less guarantee does not cover): the writer bounds its
        wait and drops the producer with what it holds.

        It waits for a send with ``flush``, which sends at once whatever
        ``linger.ms`` says. ``linger.ms`` 0 with a wait by ``poll`` would save a
        one-record send one wake-up of librdkafka's broker thread (about 20 us,
        measured), but would send a group of appends (several records, produced
        one after the other) as two produce requests, the first record alone,
        which the broker serves in turn: 30 % longer per group of 2 to 8."""
        return {
            "linger.ms": 1,
            **self.base_config(),
            "enable.idempotence": True,
            "enable.gapless.guarantee": True,
            "message.timeout.ms": 0,
            "acks": "all",
            "message.max.bytes": self.max_message_bytes,
        }

    def consumer_config(self, *, eof: bool) -> dict[str, Any]:
        """A read_committed consumer's configuration; ``eof`` for a scan to the end.

        The end of the partition is reported after an empty fetch, which the
        broker holds for ``fetch.wait.max.ms``: a scan asks for a short hold,
        a reader (the broker answers it as soon as a record comes) a long one.
        """
        return {
            "fetch.wait.max.ms": SCAN_FETCH_WAIT_MS if eof else READER_FETCH_WAIT_MS,
            **self.base_config(),
            "group.id": f"headrace-reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "error",
            "enable.partition.eof": eof,
        }

    def topic_config(self) -> dict[str, str]:
        config = {
            "cleanup.policy": "delete",
            "retention.ms": str(self.retention_ms),
            "retention.bytes": str(self.retention_bytes),
            "message.timestamp.type": self.timestamp_type,
            "max.message.bytes": str(self.max_message_bytes),
        }
        if self.min_insync_replicas is not None:
            config["min.insync.replicas"] = str(self.min_insync_replicas)
        return config

    def describe(self) -> dict[str, Any]:
        shown = {
            key: ("***" if any(m in key for m in _SECRET_MARKERS) else value)
            for key, value in self.client.items()
        }
        return {
            "backend": "kafka",
            "bootstrap_servers": self.bootstrap_servers,
            "topic_prefix": self.topic_prefix,
            "replication_factor": self.replication_factor,
            "min_insync_replicas": self.min_insync_replicas,
            "timestamp_type": self.timestamp_type,
            "retention_ms": self.retention_ms,
            "operation_timeout_s": self.operation_timeout_s,
            "client": shown,
        }


_KNOWN = frozenset(
    {
        "bootstrap_servers",
        "cluster",
        "topic_prefix",
        "replication_factor",
        "min_insync_replicas",
        "timestamp_type",
        "retention_ms",
        "retention_bytes",
        "transaction_timeout_ms",
        "max_message_bytes",
        "operation_timeout_s",
        "kafka",
    }
)


def _int(raw: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    return integer(raw, key, default, minimum, "kafka")


def parse_settings(raw: Mapping[str, Any]) -> KafkaSettings:
    """Validate keyword settings; InvalidArgument names the bad one."""
    refuse_unknown(raw, _KNOWN, "kafka")
    bootstrap = raw.get("bootstrap_servers")
    if not isinstance(bootstrap, str) or not bootstrap.strip():
        raise errors.InvalidArgument("kafka backend needs bootstrap_servers, e.g. '127.0.0.1:9092'")
    cluster = raw.get("cluster", "default")
    prefix = raw.get("topic_prefix", f"headrace.{cluster}.")
    if not isinstance(prefix, str):
        raise errors.InvalidArgument("kafka setting topic_prefix must be a string")
    timestamp_type = raw.get("timestamp_type", "CreateTime")
    if timestamp_type not in _TIMESTAMP_TYPES:
        raise errors.InvalidArgument(
            f"kafka setting timestamp_type must be one of {_TIMESTAMP_TYPES}"
        )
    min_isr = raw.get("min_insync_replicas")
    if min_isr is not None:
        min_isr = _int(raw, "min_insync_replicas", 1, 1)
    return KafkaSettings(
        bootstrap_servers=bootstrap.strip(),
        topic_prefix=prefix,
        replication_factor=_int(raw, "replication_factor", 1, 1),
        min_insync_replicas=min_isr,
        timestamp_type=timestamp_type,
        retention_ms=_int(raw, "retention_ms", -1, -1),
        retention_bytes=_int(raw, "retention_bytes", -1, -1),
        max_message_bytes=_int(raw, "max_message_bytes", DEFAULT_MAX_BYTES, 1024),
        transaction_timeout_ms=_int(raw, "transaction_timeout_ms", 30_000, 1000),
        operation_timeout_s=positive_number(raw, "operation_timeout_s", 30.0, "kafka"),
        client={k: str(v) for k, v in client_options(raw, "kafka", _OWNED_KEYS).items()},
    )

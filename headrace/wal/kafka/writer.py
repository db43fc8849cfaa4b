"""The Kafka writer's link: a transactional producer, one transaction per send.

Fencing is the broker's: the transactional id is derived from the topic, so
``init_transactions()`` by a new owner bumps the producer epoch and the old
producer's next transaction fails with ``_FENCED``; nothing of it becomes
visible to read_committed readers. The term rule, the reacquire loop and group
commit on top are the toolkit's (:class:`headrace.wal.brokers.writer.BrokerWriter`).

``init_transactions`` also settles the previous epoch's open transaction
(committed before it returns, or aborted), so a look at the end after taking
the topic sees every record that can precede the fence record: the link needs
no read-back of that range (:meth:`KafkaLink.stored` is None).

librdkafka allows one open transaction per producer, so transactions never
overlap: what arrives during a commit waits for it and then goes in one
larger transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from headrace import errors
from headrace.wal.brokers.contract import EMPTY, End, Lost
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import KafkaStamp, header
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings


def producer_config(settings: KafkaSettings, topic: str) -> dict[str, Any]:
    """The transactional producer's librdkafka configuration for ``topic``."""
    return client.client_config_with_logger(settings.producer_config(topic))


def topic_end(settings: KafkaSettings, topic: str) -> End[KafkaMessageID]:
    """The end of ``topic``: its last record that counts and its last data record."""
    tail = client.read_tail(settings, topic)
    return EMPTY if tail is None else End(tail.last.stamp, tail.last_data)


class _Txn:
    """Delivery reports of one transaction, in produce order (one partition)."""

    def __init__(self) -> None:
        self.offsets: list[int] = []
        self.error: KafkaError | None = None

    def delivered(self, err: KafkaError | None, msg: Message) -> None:
        offset = msg.offset()
        if err is not None or offset is None:
            self.error = self.error or err
        else:
            self.offsets.append(offset)


class KafkaLink:
    """A writer's hold on partition 0 of a pchannel's topic (a toolkit ``Link``)."""

    def __init__(self, settings: KafkaSettings, pchannel: str, topic: str) -> None:
        self.pchannel = pchannel
        self.topic = topic
        self._settings = settings
        self._producer: Producer | None = None

    def look(self) -> End[KafkaMessageID]:
        return topic_end(self._settings, self.topic)

    def take(self) -> None:
        producer = Producer(producer_config(self._settings, self.topic))
        try:
            producer.init_transactions(self._settings.operation_timeout_s)
        except KafkaException as exc:
            raise client.translate_exception(exc, f"taking {self.topic}", self._settings) from None
        self._producer = producer

    def held(self) -> bool:
        return self._producer is not None

    def send(self, records: Sequence[bytes], stamp: KafkaStamp) -> list[KafkaMessageID]:
        """One transaction with ``records``: all of them are stored, or none."""
        producer = self._producer
        assert producer is not None
        txn = _Txn()
        delivered = txn.delivered
        topic = self.topic
        headers = header(stamp)
        try:
            producer.begin_transaction()
            for data in records:
                client.produce(producer, topic, data, headers, delivered)
            producer.commit_transaction(self._settings.operation_timeout_s)
        except KafkaException as exc:
            raise self._failed(exc) from None
        if txn.error is not None or len(txn.offsets) != len(records):
            detail = txn.error.str() if txn.error is not None else "missing delivery reports"
            self._producer = None
            raise errors.Unavailable(
                f"kafka: a transaction on {self.topic} committed without all delivery "
                f"reports ({detail}); the writer will start a new producer"
            )
        return [KafkaMessageID(offset) for offset in txn.offsets]

    def _failed(self, exc: KafkaException) -> Exception:
        """Map a failed transaction; abort it when the producer can go on."""
        err = client.kafka_error(exc)
        if client.is_fenced(err):
            self._producer = None
            return Lost()
        if err is not None and not err.fatal():
            try:
                assert self._producer is not None
                self._producer.abort_transaction(self._settings.operation_timeout_s)
            except KafkaException:
                self._producer = None
        else:
            self._producer = None
        return client.translate_exception(
            exc, f"appending to {self.topic} (nothing was acknowledged)", self._settings
        )

    def recovered(self, records: Sequence[bytes]) -> list[KafkaMessageID]:
        """Nothing: a transaction lost with its producer is aborted, none of it is read."""
        return []

    def stored(
        self, after: KafkaMessageID | None, until: KafkaMessageID
    ) -> Sequence[tuple[KafkaMessageID, KafkaStamp]] | None:
        return None

    def drop(self) -> None:
        self._producer = None

    def release(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            producer.flush(self._settings.operation_timeout_s)

"""The Kafka reader's source: a read_committed consumer assigned to partition 0.

No consumer group semantics: the source assigns the partition at an offset and
never commits. Fence records and transaction markers are skipped, so ids have
gaps, and so are the records of fenced writers that do not count
(:class:`~headrace.wal.kafka.fencing.Admission`, kept across fetches).
Reading below the log start offset raises ``Truncated``
(``auto.offset.reset=error``). The reader's lifecycle is the toolkit's
(:class:`headrace.wal.brokers.reader.BrokerReader`).
"""

from __future__ import annotations

from confluent_kafka import Consumer, KafkaError, KafkaException

from headrace import errors
from headrace.wal.brokers.stamps import Kind
from headrace.wal.contract import Record
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import Admission, placed_of
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings


class KafkaSource:
    """A :class:`~headrace.wal.brokers.contract.Source` from ``offset``, or from
    the end when the source opens (LATEST) when it is None."""

    def __init__(self, settings: KafkaSettings, topic: str, offset: int | None) -> None:
        self._settings = settings
        self.topic = topic
        self._start = offset
        self._consumer: Consumer | None = None
        self._next = 0
        self._admission = Admission()

    def open(self) -> None:
        consumer = Consumer(
            client.client_config_with_logger(self._settings.consumer_config(eof=False))
        )
        self._consumer = consumer
        offset = self._start
        try:
            if offset is None:
                _, offset = client.watermarks(consumer, self._settings, self.topic)
            self._next = int(offset)
            client.assign(consumer, self._settings, self.topic, self._next)
        except KafkaException as exc:
            raise client.translate_exception(
                exc, f"opening a reader of {self.topic}", self._settings
            ) from None

    def fetch(self, max_records: int, wait_s: float) -> list[Record]:
        consumer = self._consumer
        assert consumer is not None
        try:
            messages = client.consume_ready(consumer, max_records, wait_s)
        except KafkaException as exc:
            raise client.translate_exception(exc, f"reading {self.topic}", self._settings) from None
        records: list[Record] = []
        admission = self._admission
        for msg in messages:
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                self._admission = admission
                raise self._error(err)
            offset = msg.offset()
            assert offset is not None
            self._next = offset + 1
            placed = placed_of(msg.headers())
            admission, counts = admission.after(offset, placed)
            if counts and placed.stamp.kind is Kind.DATA:
                records.append(Record(KafkaMessageID(offset), msg.value() or b""))
        self._admission = admission
        return records

    def _error(self, err: KafkaError) -> errors.HeadraceError:
        translated = client.translate(err, f"reading {self.topic}", self._settings)
        if not isinstance(translated, errors.Truncated):
            return translated
        earliest = ""
        scan = client.Scan(self._settings, self.topic)
        try:
            earliest = str(KafkaMessageID(scan.watermarks()[0]))
        except errors.HeadraceError:
            earliest = ""
        finally:
            scan.close()
        return errors.Truncated(
            f"kafka: {self.topic} offset {self._next} was truncated away"
            + (f"; the earliest readable id is {earliest}" if earliest else ""),
            earliest=earliest,
        )

    def release(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

"""The Kafka reader: a read_committed consumer assigned to partition 0.

No consumer group semantics: the reader assigns the partition at an offset and
never commits. Fence records and transaction markers are skipped, so ids have
gaps. Reading below the log start offset raises ``Truncated``
(``auto.offset.reset=error``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from headrace import errors
from headrace.wal.contract import BackendReader, Record
from headrace.wal.kafka import client
from headrace.wal.kafka.fencing import Kind, stamp_of
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.settings import KafkaSettings

_POLL_S = 0.2


class KafkaReader(BackendReader):
    def __init__(self, settings: KafkaSettings, pchannel: str, topic: str) -> None:
        self.pchannel = pchannel
        self._settings = settings
        self._topic = topic
        self._executor = concurrent.futures.ThreadPoolExecutor(1, f"kafka-reader-{pchannel}")
        self._consumer: Consumer | None = None
        self._next = 0
        self._closed = False

    async def open(self, offset: int | None) -> None:
        """Start at ``offset``, or at the current end (LATEST) when None."""
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._open, offset)
        except BaseException:
            await self.close()
            raise

    def _open(self, offset: int | None) -> None:
        consumer = Consumer(
            client.client_config_with_logger(self._settings.consumer_config(eof=False))
        )
        self._consumer = consumer
        try:
            if offset is None:
                _, offset = client.watermarks(consumer, self._settings, self._topic)
            self._next = int(offset)
            consumer.assign([TopicPartition(self._topic, 0, self._next)])
        except KafkaException as exc:
            raise client.translate_exception(
                exc, f"opening a reader of {self._topic}", self._settings
            ) from None

    async def next_batch(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> list[Record]:
        if self._closed:
            raise errors.Closed(f"kafka reader of {self.pchannel} is closed")
        if max_records < 1:
            raise errors.InvalidArgument(f"max_records must be >= 1, got {max_records}")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._poll, max_records, timeout)

    def _poll(self, max_records: int, timeout: float | None) -> list[Record]:
        consumer = self._consumer
        assert consumer is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            try:
                messages = consumer.consume(max_records, max(left, 0.0))
            except KafkaException as exc:
                raise client.translate_exception(
                    exc, f"reading {self._topic}", self._settings
                ) from None
            records: list[Record] = []
            for msg in messages:
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise self._error(err)
                offset = msg.offset()
                assert offset is not None
                self._next = offset + 1
                if stamp_of(msg.headers()).kind is Kind.DATA:
                    records.append(Record(KafkaMessageID(offset), msg.value() or b""))
            if records:
                return records
            if deadline is not None and time.monotonic() >= deadline:
                return []
        raise errors.Closed(f"kafka reader of {self.pchannel} was closed while reading")

    def _error(self, err: KafkaError) -> errors.HeadraceError:
        translated = client.translate(err, f"reading {self._topic}", self._settings)
        if not isinstance(translated, errors.Truncated):
            return translated
        earliest = ""
        scan = client.Scan(self._settings, self._topic)
        try:
            earliest = str(KafkaMessageID(scan.watermarks()[0]))
        except errors.HeadraceError:
            earliest = ""
        finally:
            scan.close()
        return errors.Truncated(
            f"kafka: {self._topic} offset {self._next} was truncated away"
            + (f"; the earliest readable id is {earliest}" if earliest else ""),
            earliest=earliest,
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._release)
        self._executor.shutdown(wait=False)

    def _release(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            consumer.close()

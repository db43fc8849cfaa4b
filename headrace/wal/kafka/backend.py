"""Kafka WAL backend: pchannel ``p`` is partition 0 of topic ``<topic_prefix><p>``.

Writers of message format 1 logs are transactional producers fenced by the
broker (see :mod:`headrace.wal.kafka.writer`); writers of message format 2
logs are idempotent producers that check where each record landed (see
:mod:`headrace.wal.kafka.chain`); readers are read_committed consumers that
skip what fenced writers left (see :mod:`headrace.wal.kafka.reader`).
Truncation is ``DeleteRecords`` before an offset. Blocking client calls run
in executor threads, never on the loop.
"""

from __future__ import annotations

from typing import Any

from headrace.message.ids import MessageID
from headrace.wal.brokers.plumbing import Plumbing, expect_id
from headrace.wal.contract import (
    Backend,
    BackendReader,
    BackendWriter,
    Record,
    StartKind,
    StartPosition,
)
from headrace.wal.kafka import client
from headrace.wal.kafka.chain import ChainLink
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.reader import KafkaSource
from headrace.wal.kafka.settings import KafkaSettings, parse_settings
from headrace.wal.kafka.writer import KafkaLink

OFFSET_BEGINNING = -2
"""librdkafka's logical offset for the log start offset."""


def chained_for(message_format: int) -> bool:
    """Whether a writer of ``message_format`` is chained rather than transactional (pure).

    Readers of the releases before message format 2 deliver every committed
    record; only once the cluster writes format 2 (every node's release skips
    a fenced writer's records) may a writer leave such records behind."""
    return message_format >= 2


def start_offset(start: StartPosition) -> int | None:
    """First offset a reader asks for; None means "the end when it opens" (pure)."""
    if start.kind is StartKind.EARLIEST:
        return OFFSET_BEGINNING
    if start.kind is StartKind.LATEST:
        return None
    offset = expect_id(start.id, KafkaMessageID).offset
    return offset + 1 if start.kind is StartKind.AFTER else offset


class KafkaBackend(Backend):
    name = "kafka"

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        boundary = client.boundary(settings)
        self._admin = boundary.call("creating a client", client.new_admin, settings)
        self._plumbing = Plumbing(boundary, self._ensure_topic)

    async def _prepared(self, pchannel: str) -> str:
        """The topic of ``pchannel``, prepared."""
        topic = self.settings.topic(pchannel)
        await self._plumbing.prepare(pchannel)
        return topic

    def _ensure_topic(self, pchannel: str) -> None:
        client.ensure_topic(self._admin, self.settings, self.settings.topic(pchannel))

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return await self._plumbing.open_writer(
            pchannel,
            term,
            lambda: KafkaLink(self.settings, pchannel, self.settings.topic(pchannel)),
        )

    async def open_writer_for(self, pchannel: str, term: int, message_format: int) -> BackendWriter:
        """A chained writer once the cluster writes record batches (message format 2),
        whose every reader skips a fenced writer's records; a transactional one before."""
        if not chained_for(message_format):
            return await self.open_writer(pchannel, term)
        return await self._plumbing.open_writer(
            pchannel,
            term,
            lambda: ChainLink(self.settings, pchannel, self.settings.topic(pchannel)),
        )

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        offset = start_offset(start)
        return await self._plumbing.open_reader(
            pchannel, lambda: KafkaSource(self.settings, self.settings.topic(pchannel), offset)
        )

    async def last_record(self, pchannel: str) -> Record | None:
        topic = await self._prepared(pchannel)
        tail = await self._plumbing.run(
            f"reading the end of {topic}", client.read_tail, self.settings, topic
        )
        if tail is None or tail.last_data is None:
            return None
        last = tail.last
        if last.offset != tail.last_data.offset:
            found = await self._plumbing.run(
                f"reading {topic}", client.read_one, self.settings, topic, tail.last_data.offset
            )
            if found is None:
                return None
            last = found
        return Record(KafkaMessageID(last.offset), last.value)

    async def earliest(self, pchannel: str) -> MessageID | None:
        topic = await self._prepared(pchannel)
        found = await self._plumbing.run(
            f"reading {topic}", client.first_data, self.settings, topic
        )
        return None if found is None else KafkaMessageID(found.offset)

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        offset = expect_id(before, KafkaMessageID).offset
        topic = await self._prepared(pchannel)
        await self._plumbing.run(f"truncating {topic}", self._truncate, topic, offset)

    def _truncate(self, topic: str, offset: int) -> None:
        scan = client.Scan(self.settings, topic)
        try:
            low, high = scan.watermarks()
        finally:
            scan.close()
        target = min(offset, high)
        if target > low:
            client.delete_before(self._admin, self.settings, topic, target)

    async def close(self) -> None:
        await self._plumbing.close()

    def describe(self) -> dict[str, Any]:
        return self.settings.describe()


def create_backend(**settings: Any) -> KafkaBackend:
    """Registry factory: ``registry.create("kafka", bootstrap_servers=..., ...)``."""
    return KafkaBackend(parse_settings(settings))

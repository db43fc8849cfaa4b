"""Kafka WAL backend: pchannel ``p`` is partition 0 of topic ``<topic_prefix><p>``.

Writers are transactional producers fenced by the broker (see
:mod:`headrace.wal.kafka.writer`); readers are read_committed consumers (see
:mod:`headrace.wal.kafka.reader`). Truncation is ``DeleteRecords`` before an
offset. Blocking client calls run in executor threads, never on the loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from headrace import errors
from headrace.guarded import settle
from headrace.message.ids import MessageID
from headrace.wal.contract import (
    Backend,
    BackendReader,
    BackendWriter,
    Record,
    StartKind,
    StartPosition,
)
from headrace.wal.kafka import client
from headrace.wal.kafka.message_id import KafkaMessageID
from headrace.wal.kafka.reader import KafkaReader
from headrace.wal.kafka.settings import KafkaSettings, parse_settings
from headrace.wal.kafka.writer import KafkaWriter

_T = TypeVar("_T")
OFFSET_BEGINNING = -2
"""librdkafka's logical offset for the log start offset."""


def _offset_of(mid: MessageID | None) -> int:
    if not isinstance(mid, KafkaMessageID):
        raise errors.InvalidArgument(f"expected a kafka message id, got {mid!r}")
    return mid.offset


def start_offset(start: StartPosition) -> int | None:
    """First offset a reader asks for; None means "the end when it opens" (pure)."""
    if start.kind is StartKind.EARLIEST:
        return OFFSET_BEGINNING
    if start.kind is StartKind.LATEST:
        return None
    offset = _offset_of(start.id)
    return offset + 1 if start.kind is StartKind.AFTER else offset


class KafkaBackend(Backend):
    name = "kafka"

    def __init__(self, settings: KafkaSettings) -> None:
        self.settings = settings
        self._executor = concurrent.futures.ThreadPoolExecutor(2, "kafka-backend")
        self._admin = client.new_admin(settings)
        self._topics: set[str] = set()
        self._clients: weakref.WeakSet[BackendReader | BackendWriter] = weakref.WeakSet()
        self._closed = False

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise errors.Closed("the kafka WAL backend was closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _topic(self, pchannel: str) -> str:
        topic = self.settings.topic(pchannel)
        if topic not in self._topics:
            await self._run(client.ensure_topic, self._admin, self.settings, topic)
            self._topics.add(topic)
        return topic

    def _check_term(self, term: int) -> None:
        if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term < 1 << 63:
            raise errors.InvalidArgument(f"term must be a non-negative integer, got {term!r}")

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        self._check_term(term)
        topic = await self._topic(pchannel)
        writer = KafkaWriter(self.settings, pchannel, topic, term)
        await writer.open()
        self._clients.add(writer)
        return writer

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        offset = start_offset(start)
        topic = await self._topic(pchannel)
        reader = KafkaReader(self.settings, pchannel, topic)
        await reader.open(offset)
        self._clients.add(reader)
        return reader

    async def last_record(self, pchannel: str) -> Record | None:
        topic = await self._topic(pchannel)
        tail = await self._run(client.read_tail, self.settings, topic)
        if tail is None or tail.last_data < 0:
            return None
        last = tail.last
        if last.offset != tail.last_data:
            found = await self._run(client.read_one, self.settings, topic, tail.last_data)
            if found is None:
                return None
            last = found
        return Record(KafkaMessageID(last.offset), last.value)

    async def earliest(self, pchannel: str) -> MessageID | None:
        topic = await self._topic(pchannel)
        found = await self._run(client.first_data, self.settings, topic)
        return None if found is None else KafkaMessageID(found.offset)

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        offset = _offset_of(before)
        topic = await self._topic(pchannel)
        await self._run(self._truncate, topic, offset)

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
        if self._closed:
            return
        self._closed = True
        await settle(
            (c.close() for c in list(self._clients)),
            what="closing the clients of the Kafka backend",
        )
        self._executor.shutdown(wait=False)

    def describe(self) -> dict[str, Any]:
        return self.settings.describe()


def create_backend(**settings: Any) -> KafkaBackend:
    """Registry factory: ``registry.create("kafka", bootstrap_servers=..., ...)``."""
    return KafkaBackend(parse_settings(settings))

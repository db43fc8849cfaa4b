"""Pulsar WAL backend: pchannel ``p`` is ``persistent://<tenant>/<namespace>/<prefix><p>``.

Writers are ``ExclusiveWithFencing`` producers (see
:mod:`headrace.wal.pulsar.writer`); readers use the Reader API (see
:mod:`headrace.wal.pulsar.reader`). Pulsar cannot delete before a message id:
truncation records the point in a small marks topic and moves the durable
``headrace-truncation`` subscription there, so retention drops the ledgers
that lie wholly before it. Blocking client calls run in executor threads.
"""

from __future__ import annotations

from typing import Any

from headrace.message.ids import MessageID
from headrace.wal.brokers.plumbing import Plumbing, expect_id
from headrace.wal.brokers.stamps import Kind
from headrace.wal.contract import Backend, BackendReader, BackendWriter, Record, StartPosition
from headrace.wal.pulsar import client
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.reader import PulsarSource, first_wanted
from headrace.wal.pulsar.settings import PulsarSettings, parse_settings
from headrace.wal.pulsar.writer import PulsarLink


class PulsarBackend(Backend):
    name = "pulsar"

    def __init__(self, settings: PulsarSettings) -> None:
        self.settings = settings
        self._client = client.new_client(settings)
        self._plumbing = Plumbing(client.boundary(settings), self._ensure_topics)

    async def _prepared(self, pchannel: str) -> str:
        """The topic of ``pchannel``, prepared."""
        topic = self.settings.topic(pchannel)
        await self._plumbing.prepare(pchannel)
        return topic

    def _ensure_topics(self, pchannel: str) -> None:
        client.ensure_topics(self._client, self.settings, pchannel)

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return await self._plumbing.open_writer(
            pchannel, term, lambda: PulsarLink(self.settings, pchannel, term)
        )

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        first_wanted(start)
        return await self._plumbing.open_reader(
            pchannel, lambda: PulsarSource(self.settings, self._client, pchannel, start)
        )

    async def last_record(self, pchannel: str) -> Record | None:
        topic = await self._prepared(pchannel)
        return await self._plumbing.run(
            f"reading the end of {topic}", self._last_record, pchannel, topic
        )

    def _last_record(self, pchannel: str, topic: str) -> Record | None:
        last = client.read_last(self._client, self.settings, topic)
        if last is None:
            return None
        stamp = client.stamp(last)
        if stamp.kind is Kind.DATA:
            mid, data = client.from_pulsar(last.message_id()), last.data()
        else:
            if stamp.prev is None:
                return None
            found = client.read_exact(self._client, self.settings, topic, stamp.prev)
            if found is None:
                return None
            mid, data = stamp.prev, found.data()
        mark = client.read_mark(self._client, self.settings, pchannel)
        if mark is not None and mid < mark:
            return None
        return Record(mid, data)

    async def earliest(self, pchannel: str) -> MessageID | None:
        topic = await self._prepared(pchannel)
        return await self._plumbing.run(f"reading {topic}", self._earliest, pchannel, topic)

    def _earliest(self, pchannel: str, topic: str) -> MessageID | None:
        mark = client.read_mark(self._client, self.settings, pchannel)
        found = client.read_first_data(self._client, self.settings, topic, mark)
        return None if found is None else client.from_pulsar(found.message_id())

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        point = expect_id(before, PulsarMessageID)
        topic = await self._prepared(pchannel)
        await self._plumbing.run(
            f"truncating {topic}", client.truncate, self._client, self.settings, pchannel, point
        )

    async def close(self) -> None:
        await self._plumbing.close(self._client.close)

    def describe(self) -> dict[str, Any]:
        return self.settings.describe()


def create_backend(**settings: Any) -> PulsarBackend:
    """Registry factory: ``registry.create("pulsar", service_url=..., ...)``."""
    return PulsarBackend(parse_settings(settings))

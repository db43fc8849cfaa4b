"""Pulsar WAL backend: pchannel ``p`` is ``persistent://<tenant>/<namespace>/<prefix><p>``.

Writers are ``ExclusiveWithFencing`` producers (see
:mod:`headrace.wal.pulsar.writer`); readers use the Reader API (see
:mod:`headrace.wal.pulsar.reader`). Pulsar cannot delete before a message id:
truncation records the point in a small marks topic and moves the durable
``headrace-truncation`` subscription there, so retention drops the ledgers
that lie wholly before it. Blocking client calls run in executor threads.
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
from headrace.wal.contract import Backend, BackendReader, BackendWriter, Record, StartPosition
from headrace.wal.pulsar import client
from headrace.wal.pulsar.fencing import Kind
from headrace.wal.pulsar.message_id import PulsarMessageID
from headrace.wal.pulsar.reader import PulsarReader, first_wanted
from headrace.wal.pulsar.settings import PulsarSettings, parse_settings
from headrace.wal.pulsar.writer import PulsarWriter

_T = TypeVar("_T")


class PulsarBackend(Backend):
    name = "pulsar"

    def __init__(self, settings: PulsarSettings) -> None:
        self.settings = settings
        self._client = client.new_client(settings)
        self._executor = concurrent.futures.ThreadPoolExecutor(2, "pulsar-backend")
        self._ready: set[str] = set()
        self._clients: weakref.WeakSet[BackendReader | BackendWriter] = weakref.WeakSet()
        self._closed = False

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        if self._closed:
            raise errors.Closed("the pulsar WAL backend was closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _prepare(self, pchannel: str) -> str:
        topic = self.settings.topic(pchannel)
        if pchannel not in self._ready:
            await self._run(client.ensure_topics, self._client, self.settings, pchannel)
            self._ready.add(pchannel)
        return topic

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term < 1 << 63:
            raise errors.InvalidArgument(f"term must be a non-negative integer, got {term!r}")
        await self._prepare(pchannel)
        writer = PulsarWriter(self.settings, pchannel, term)
        await writer.open()
        self._clients.add(writer)
        return writer

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        first_wanted(start)
        await self._prepare(pchannel)
        reader = PulsarReader(self.settings, self._client, pchannel)
        await reader.open(start)
        self._clients.add(reader)
        return reader

    async def last_record(self, pchannel: str) -> Record | None:
        topic = await self._prepare(pchannel)
        return await self._run(self._last_record, pchannel, topic)

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
        topic = await self._prepare(pchannel)
        return await self._run(self._earliest, pchannel, topic)

    def _earliest(self, pchannel: str, topic: str) -> MessageID | None:
        mark = client.read_mark(self._client, self.settings, pchannel)
        found = client.read_first_data(self._client, self.settings, topic, mark)
        return None if found is None else client.from_pulsar(found.message_id())

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        if not isinstance(before, PulsarMessageID):
            raise errors.InvalidArgument(f"expected a pulsar message id, got {before!r}")
        await self._prepare(pchannel)
        await self._run(client.truncate, self._client, self.settings, pchannel, before)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await settle(
            (c.close() for c in list(self._clients)),
            what="closing the clients of the Pulsar backend",
        )
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._client.close)
        self._executor.shutdown(wait=False)

    def describe(self) -> dict[str, Any]:
        return self.settings.describe()


def create_backend(**settings: Any) -> PulsarBackend:
    """Registry factory: ``registry.create("pulsar", service_url=..., ...)``."""
    return PulsarBackend(parse_settings(settings))

"""A backend that hands every call to another one; tests override what they watch."""

from __future__ import annotations

from headrace.message.ids import MessageID
from headrace.wal import registry
from headrace.wal.contract import Backend, BackendReader, BackendWriter, Record, StartPosition


class DelegatingBackend(Backend):
    """``inner`` (a new memory backend unless given) does the work."""

    name = "memory"

    def __init__(self, inner: Backend | None = None) -> None:
        self.inner = inner if inner is not None else registry.create("memory")

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return await self.inner.open_writer(pchannel, term)

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        return await self.inner.open_reader(pchannel, start)

    async def last_record(self, pchannel: str) -> Record | None:
        return await self.inner.last_record(pchannel)

    async def truncate(self, pchannel: str, before: MessageID) -> None:
        await self.inner.truncate(pchannel, before)

    async def earliest(self, pchannel: str) -> MessageID | None:
        return await self.inner.earliest(pchannel)

    async def close(self) -> None:
        await self.inner.close()

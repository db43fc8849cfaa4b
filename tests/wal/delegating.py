"""A backend that hands every call to another one; tests override what they watch."""

from __future__ import annotations

from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.wal import registry
from headrace.wal.contract import Backend, BackendReader, BackendWriter, Record, StartPosition


async def payload_copies(backend: Backend, payload: bytes) -> int:
    """How many records of pchannel ``p`` in ``backend`` carry ``payload``."""
    reader = await backend.open_reader("p", StartPosition.earliest())
    found = 0
    while records := await reader.next_batch(1024, timeout=0):
        found += sum(codec.decode(r.data).payload == payload for r in records)
    await reader.close()
    return found


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


class CountingBackend(DelegatingBackend):
    """Counts the records its readers fetch; ``stall_after``: once a reader
    fetched that many, its reads time out (return nothing), as a stalled broker's do."""

    def __init__(self, inner: Backend | None = None, stall_after: int | None = None) -> None:
        super().__init__(inner)
        self.fetched = 0
        self.stall_after = stall_after

    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader:
        return _CountingReader(self, await self.inner.open_reader(pchannel, start))


class _CountingReader(BackendReader):
    def __init__(self, owner: CountingBackend, inner: BackendReader) -> None:
        self._owner = owner
        self._inner = inner
        self._fetched = 0

    async def next_batch(
        self, max_records: int = 1024, timeout: float | None = None
    ) -> list[Record]:
        stall = self._owner.stall_after
        if stall is not None:
            if self._fetched >= stall:
                return []
            max_records = min(max_records, stall - self._fetched)
        records = await self._inner.next_batch(max_records, timeout)
        self._fetched += len(records)
        self._owner.fetched += len(records)
        return records

    async def close(self) -> None:
        await self._inner.close()


class FormatBackend(DelegatingBackend):
    """``inner`` whose writers are opened as for a WAL of ``message_format``
    (``open_writer`` is ``open_writer_for``), so the suites written against
    ``open_writer`` run on the writer a backend picks for that format."""

    def __init__(self, inner: Backend, message_format: int) -> None:
        super().__init__(inner)
        self.name = inner.name
        self.message_format = message_format

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        return await self.inner.open_writer_for(pchannel, term, self.message_format)

    def describe(self) -> dict[str, object]:
        return self.inner.describe()

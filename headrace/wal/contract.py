"""The minimal WAL backend contract ("walimpls").

A backend stores opaque, already-encoded records per pchannel and knows
nothing of message types, timeticks or interceptors: those live in the
framework WAL (:mod:`headrace.wal.framework`). Every backend (local files,
Kafka, Pulsar) implements exactly this and passes the one conformance suite in
``tests/wal/conformance``.

Rules every backend keeps:

* ``open_writer(pchannel, term)`` fences every writer of a lower term: once it
  returns, no append of an older term can become readable after the records of
  the new writer, and an older writer's later ``append`` raises
  :class:`headrace.errors.Fenced`. Opening with a term lower than the highest
  one the backend has seen raises ``Fenced`` at once. Terms only move forward.
* ``append`` is atomic per call as far as order goes: the records of one call
  get consecutive, increasing ids, and are acknowledged only once durable
  according to the backend's durability setting.
* Readers see records in id order, never a record that was not acknowledged
  and later lost to fencing, and wait at the tail for new records.
* Errors are :mod:`headrace.errors` types; ``retryable`` tells the caller
  whether the same call may succeed later.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import enum
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from headrace.message.batch import Stamped
from headrace.message.ids import MessageID


class StartKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    """Only records appended after the reader was created."""
    AT = "at"
    """The record with the given id, or the first one after it."""
    AFTER = "after"
    """The first record strictly after the given id."""


@dataclasses.dataclass(frozen=True, slots=True)
class StartPosition:
    kind: StartKind
    id: MessageID | None = None

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls(StartKind.EARLIEST)

    @classmethod
    def latest(cls) -> StartPosition:
        return cls(StartKind.LATEST)

    @classmethod
    def at(cls, mid: MessageID) -> StartPosition:
        return cls(StartKind.AT, mid)

    @classmethod
    def after(cls, mid: MessageID) -> StartPosition:
        return cls(StartKind.AFTER, mid)


@dataclasses.dataclass(frozen=True, slots=True)
class Record:
    """A stored record: the backend's id and the opaque bytes appended."""

    id: MessageID
    data: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class RecordBlock:
    """Records in bulk: record ``i`` has id ``ids[i]`` and bytes
    ``data[bounds[2 * i]:bounds[2 * i + 1]]``.

    ``verified``: each record's bytes were checked against a checksum stored
    with them (so a reader may skip checking the same bytes again).
    """

    ids: Sequence[MessageID]
    data: bytes
    bounds: Sequence[int]
    verified: bool = False

    def __len__(self) -> int:
        return len(self.ids)

    def records(self) -> list[Record]:
        data, bounds = self.data, self.bounds
        return [
            Record(mid, data[bounds[2 * i] : bounds[2 * i + 1]]) for i, mid in enumerate(self.ids)
        ]

    @classmethod
    def of(cls, records: Sequence[Record]) -> RecordBlock:
        """One block holding ``records`` (their bytes copied into one buffer)."""
        bounds: list[int] = []
        pos = 0
        for record in records:
            bounds.append(pos)
            pos += len(record.data)
            bounds.append(pos)
        return cls([r.id for r in records], b"".join([r.data for r in records]), bounds)


class BackendReader(abc.ABC):
    """Reads records of one pchannel in id order, waiting at the tail."""

    @abc.abstractmethod
    async def next_batch(
        self, max_records: int = 1024, timeout: float | None = None
    ) -> list[Record]:
        """Return the next records, at least one unless ``timeout`` passes first.

        Returns an empty list on timeout. Raises :class:`headrace.errors.Truncated`
        when the next record to read was truncated away.
        """

    async def next_block(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> RecordBlock:
        """:meth:`next_batch` in bulk form (optional; the same records, the same rules).

        Backends that parse many records out of one buffer override it to hand
        the buffer over as is; this default wraps :meth:`next_batch`.
        """
        return RecordBlock.of(await self.next_batch(max_records, timeout))

    @abc.abstractmethod
    async def close(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[Record]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Record]:
        while True:
            for record in await self.next_batch():
                yield record


class BackendWriter(abc.ABC):
    """The one writer of a pchannel under a term."""

    pchannel: str
    term: int

    @abc.abstractmethod
    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        """Durably append ``records`` in order; their ids, increasing."""

    def next_ids(self, count: int) -> list[MessageID] | None:
        """The ids the very next append of ``count`` records gets if it succeeds,
        when the backend knows them before writing (optional; None by default).

        A caller that starts that append right away (no other append in
        between) may prepare its bookkeeping for that outcome ahead; the
        append's result is then this very list object.
        """
        return None

    def start_append(
        self,
        records: Sequence[bytes],
        on_done: Callable[[asyncio.Future[list[MessageID]]], None] | None = None,
    ) -> asyncio.Future[list[MessageID]]:
        """:meth:`append`, started now; its outcome as a future (optional fast path).

        Same rules as :meth:`append`. ``on_done(future)`` runs once the future
        is done. This default runs :meth:`append` as a task (which starts at
        the event loop's next turn) and ``on_done`` as a done callback;
        backends whose appends start without waiting override it, so the
        write begins at once and ``on_done`` runs as the outcome is set.
        Cancelling the future abandons only the wait, as cancelling
        :meth:`append` does.
        """
        future = asyncio.ensure_future(self.append(records))
        if on_done is not None:
            future.add_done_callback(on_done)
        return future

    def start_append_stamped(
        self,
        records: Sequence[bytes | Stamped],
        on_done: Callable[[asyncio.Future[list[MessageID]]], None] | None = None,
    ) -> asyncio.Future[list[MessageID]]:
        """:meth:`start_append` of records some of which are record batches
        stamped but not joined yet (:class:`~headrace.message.batch.Stamped`).

        This default joins each of them (one copy, which the WAL's buffer then
        shares); a backend that stores a record's parts as they are overrides it.
        """
        joined = [r if isinstance(r, bytes) else r.joined() for r in records]
        return self.start_append(joined, on_done)

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush and release; idempotent."""


class Backend(abc.ABC):
    """A WAL storage backend: one per process and configuration."""

    name: str

    @abc.abstractmethod
    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        """Fence lower terms and return the writer for ``term``."""

    async def open_writer_for(self, pchannel: str, term: int, message_format: int) -> BackendWriter:
        """:meth:`open_writer` for a WAL that writes ``message_format``.

        A backend whose own storage format changes with a release overrides
        this to write its newer storage format only once the cluster writes a
        message format that every release reading it can read too: until the
        cluster's format switch, a rollback to the previous release reads
        everything written."""
        del message_format
        return await self.open_writer(pchannel, term)

    @abc.abstractmethod
    async def open_reader(self, pchannel: str, start: StartPosition) -> BackendReader: ...

    @abc.abstractmethod
    async def last_record(self, pchannel: str) -> Record | None:
        """The last readable record of the pchannel, or None if it is empty."""

    @abc.abstractmethod
    async def truncate(self, pchannel: str, before: MessageID) -> None:
        """Allow the backend to drop records with ids lower than ``before``.

        Reads from a dropped position afterwards raise ``Truncated``. A backend
        may keep more than asked (whole segments, retention), never less.
        """

    @abc.abstractmethod
    async def earliest(self, pchannel: str) -> MessageID | None:
        """Id of the first readable record, or None if the pchannel is empty."""

    @abc.abstractmethod
    async def close(self) -> None: ...

    def describe(self) -> dict[str, Any]:
        """Settings worth showing in status output (no secrets)."""
        return {"backend": self.name}


def where(backend: Backend) -> str:
    """The backend and its address, for error messages."""
    description = backend.describe()
    address = description.get("bootstrap_servers") or description.get("service_url")
    return f"{backend.name} backend at {address}" if address else f"{backend.name} backend"

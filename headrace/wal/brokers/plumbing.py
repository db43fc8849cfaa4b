"""A broker backend's plumbing: blocking calls, lazily prepared topics, its clients.

A backend composes one :class:`Plumbing`: its blocking client calls run in the
plumbing's threads behind the backend's error :class:`~.contract.Boundary`;
a pchannel's topics are prepared (created, subscribed) on first use, once;
writers and readers are opened over the backend's links and sources and
closed with it.
"""

from __future__ import annotations

import concurrent.futures
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from headrace import errors
from headrace.guarded import settle
from headrace.message.ids import MessageID
from headrace.wal.brokers.contract import Boundary, Link, Source
from headrace.wal.brokers.reader import BrokerReader
from headrace.wal.brokers.stamps import I
from headrace.wal.brokers.writer import BrokerWriter
from headrace.wal.contract import BackendReader, BackendWriter

_T = TypeVar("_T")
_ID = TypeVar("_ID", bound=MessageID)


def check_term(term: object) -> int:
    """``term`` if it is a valid term, else InvalidArgument (pure)."""
    if isinstance(term, bool) or not isinstance(term, int) or not 0 <= term < 1 << 63:
        raise errors.InvalidArgument(f"term must be a non-negative integer, got {term!r}")
    return term


def expect_id(mid: object, kind: type[_ID]) -> _ID:
    """``mid`` if it is an id of the backend's kind, else InvalidArgument (pure)."""
    if not isinstance(mid, kind):
        raise errors.InvalidArgument(f"expected a {kind.backend} message id, got {mid!r}")
    return mid


class Plumbing:
    """``prepare(pchannel)`` makes a pchannel's topics ready (blocking, idempotent)."""

    def __init__(self, boundary: Boundary, prepare: Callable[[str], None]) -> None:
        self.boundary = boundary
        self._prepare = prepare
        self._executor = concurrent.futures.ThreadPoolExecutor(2, f"{boundary.backend}-backend")
        self._prepared: set[str] = set()
        self._clients: weakref.WeakSet[BackendReader | BackendWriter] = weakref.WeakSet()
        self._closed = False

    async def run(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a backend thread, its library errors translated as ``what``."""
        if self._closed:
            raise errors.Closed(f"the {self.boundary.backend} WAL backend was closed")
        return await self.boundary.run(self._executor, what, fn, *args)

    async def prepare(self, pchannel: str) -> None:
        """Prepare ``pchannel``'s topics unless that already succeeded."""
        if pchannel not in self._prepared:
            await self.run(f"preparing the topics of {pchannel}", self._prepare, pchannel)
            self._prepared.add(pchannel)

    async def open_writer(
        self, pchannel: str, term: int, link: Callable[[], Link[I]]
    ) -> BrokerWriter[I]:
        """The writer of ``pchannel`` under ``term`` over a new ``link()``, fenced in."""
        check_term(term)
        await self.prepare(pchannel)
        writer = BrokerWriter(link(), term, self.boundary)
        await writer.open()
        self._clients.add(writer)
        return writer

    async def open_reader(self, pchannel: str, source: Callable[[], Source]) -> BrokerReader:
        """A reader of ``pchannel`` over a new ``source()``, opened."""
        await self.prepare(pchannel)
        reader = BrokerReader(source(), pchannel, self.boundary)
        await reader.open()
        self._clients.add(reader)
        return reader

    async def close(self, release: Callable[[], None] | None = None) -> None:
        """Close the open writers and readers, then ``release()`` in a thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        await settle(
            (c.close() for c in list(self._clients)),
            what=f"closing the clients of the {self.boundary.backend} backend",
        )
        if release is not None:
            await self.boundary.run(self._executor, "closing the backend", release)
        self._executor.shutdown(wait=False)

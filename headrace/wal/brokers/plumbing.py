"""A broker backend's plumbing: blocking calls, lazily prepared topics, its clients.

A backend composes one :class:`Plumbing`: its blocking client calls run in the
plumbing's threads behind the backend's error :class:`~.contract.Boundary`;
a pchannel's topics are prepared (created, subscribed) on first use, once;
the readers and writers it opened are closed with it.
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
from headrace.wal.brokers.contract import Boundary
from headrace.wal.contract import BackendReader, BackendWriter

_T = TypeVar("_T")
_ID = TypeVar("_ID", bound=MessageID)
_Client = TypeVar("_Client", BackendReader, BackendWriter)


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
    def __init__(self, boundary: Boundary) -> None:
        self.boundary = boundary
        self._executor = concurrent.futures.ThreadPoolExecutor(2, f"{boundary.backend}-backend")
        self._prepared: set[str] = set()
        self._clients: weakref.WeakSet[BackendReader | BackendWriter] = weakref.WeakSet()
        self._closed = False

    async def run(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` in a backend thread, its library errors translated as ``what``."""
        if self._closed:
            raise errors.Closed(f"the {self.boundary.backend} WAL backend was closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self.boundary.call, what, fn, *args)

    async def prepare(self, pchannel: str, fn: Callable[[str], None]) -> None:
        """``fn(pchannel)`` unless it already succeeded for ``pchannel``."""
        if pchannel not in self._prepared:
            await self.run(f"preparing the topics of {pchannel}", fn, pchannel)
            self._prepared.add(pchannel)

    def track(self, client: _Client) -> _Client:
        """Close ``client`` with the backend (if it is still open then)."""
        self._clients.add(client)
        return client

    async def close(self, release: Callable[[], None] | None = None) -> None:
        """Close the tracked clients, then ``release()`` in a thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        await settle(
            (c.close() for c in list(self._clients)),
            what=f"closing the clients of the {self.boundary.backend} backend",
        )
        if release is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(
                self._executor, self.boundary.call, "closing the backend", release
            )
        self._executor.shutdown(wait=False)

"""SQLite metastore: one database file shared by several processes.

The embedded default (standalone mode), in the spirit of k3s's kine: the
etcd model (revisions, leases, transactions, watches) on a WAL-mode SQLite
file. Several processes may open the same file; writes serialise on SQLite's
write lock (``BEGIN IMMEDIATE`` with a busy timeout).

* All sqlite3 calls of an instance run in its one dedicated worker thread, so
  the event loop never blocks on the file.
* Leases carry wall-clock expiry times. Whoever touches the store expires
  overdue leases first (deleting their keys and logging DELETE events), and
  every open instance runs a reaper task, so leases expire within about
  ``reap_interval`` of their deadline while any process has the store open.
* Watches read the event log. An instance wakes its watches at once after its
  own writes and polls ``PRAGMA data_version`` every ``poll_interval`` for the
  writes of other processes. Events older than the newest ``event_retention``
  revisions are compacted; a watch that falls that far behind gets
  :class:`headrace.errors.Truncated`.
* sqlite3 errors become :mod:`headrace.errors`: a busy/locked file beyond the
  busy timeout or a file that cannot be opened is ``Unavailable`` (retryable,
  naming the path); a full disk is ``StorageFull``; a damaged file ``CorruptData``.

URL form (see :mod:`headrace.metastore.factory`): ``sqlite:///abs/path.db``;
whatever follows ``sqlite://`` is the file path, so ``sqlite://data/meta.db``
is relative to the working directory.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import logging
import sqlite3
from collections.abc import Callable, Sequence
from typing import TypeVar

from headrace import errors
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.metastore import sqlite_db
from headrace.metastore.contract import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Metastore,
    Op,
    Put,
    TxnResult,
    Watch,
    WatchEvent,
)
from headrace.metastore.ranges import check_lease_ttl

_T = TypeVar("_T")
log = logging.getLogger(__name__)


class SqliteMetastore(Metastore):
    """The metastore on one SQLite file; create with :meth:`open`."""

    def __init__(
        self,
        path: str,
        *,
        busy_timeout: float = 5.0,
        poll_interval: float = 0.025,
        reap_interval: float = 0.2,
        event_retention: int = 10_000,
        create: bool = True,
    ) -> None:
        if event_retention < 1:
            raise errors.InvalidArgument(f"event_retention must be >= 1, got {event_retention}")
        self.path = path
        self.url = f"sqlite://{path}"
        self._busy_timeout = busy_timeout
        self._poll_interval = poll_interval
        self._reap_interval = reap_interval
        self._retention = event_retention
        self._create = create
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="headrace-sqlite"
        )
        self._conn: sqlite3.Connection | None = None
        self._closed = False
        self._changed = asyncio.Event()
        self.generation = 0
        """Counts wake-ups; a watch compares it before and after a fetch."""
        self._watches: set[_SqliteWatch] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self._poller: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        path: str,
        *,
        busy_timeout: float = 5.0,
        poll_interval: float = 0.025,
        reap_interval: float = 0.2,
        event_retention: int = 10_000,
        create: bool = True,
    ) -> SqliteMetastore:
        """Open the store at ``path``, creating it if needed and ``create``;
        Unavailable if impossible, NotFound if missing and not ``create``."""
        store = cls(
            path,
            busy_timeout=busy_timeout,
            poll_interval=poll_interval,
            reap_interval=reap_interval,
            event_retention=event_retention,
            create=create,
        )
        try:
            await store._call(sqlite_db.revision)
        except BaseException:
            await store.close()
            raise
        store._start_reaper()
        return store

    def _start_reaper(self) -> None:
        """Expire leases in the background; a reaper that fails is logged and
        started again (it keeps no state), or leases would never expire."""
        self._tasks = [t for t in self._tasks if not t.done()]
        self._tasks.append(
            guarded_task(self._reap_loop(), "sqlite-reaper", self._on_reaper_failure, logger=log)
        )

    async def _on_reaper_failure(self, failure: TaskFailure) -> None:
        if self._closed:
            return
        log.error("SQLite metastore %s: restarting the lease reaper", self.path)
        await asyncio.sleep(self._reap_interval)
        if not self._closed:
            self._start_reaper()

    # -- plumbing ---------------------------------------------------------

    def _run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """Worker thread: run ``fn`` on the connection, translating sqlite3 errors."""
        try:
            if self._conn is None:
                self._conn = sqlite_db.connect(self.path, self._busy_timeout, create=self._create)
            return fn(self._conn)
        except sqlite3.Error as exc:
            raise sqlite_db.translate(exc, self.path) from None

    async def _call(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        if self._closed:
            raise errors.Closed(f"SQLite metastore {self.path} is closed")
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, self._run, fn)
        except RuntimeError as exc:
            if self._closed:
                raise errors.Closed(f"SQLite metastore {self.path} is closed") from None
            raise errors.HeadraceError(f"SQLite metastore {self.path}: {exc}") from exc

    def _notify(self) -> None:
        """Wake the watches of this instance (after a write, or a change seen by the poller)."""
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    async def _write(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        try:
            return await self._call(fn)
        finally:
            self._notify()

    async def _reap_loop(self) -> None:
        ticks = 0
        while not self._closed:
            await asyncio.sleep(self._reap_interval)
            ticks += 1
            try:
                if await self._call(sqlite_db.expire_leases):
                    self._notify()
                if ticks % 25 == 0:
                    await self.compact()
            except errors.Closed:
                return
            except errors.HeadraceError as exc:
                log.warning("SQLite metastore %s: lease reaper: %s", self.path, exc)

    async def _poll_loop(self) -> None:
        seen: int | None = None
        while self._watches and not self._closed:
            version: int | None = seen
            try:
                version = await self._call(sqlite_db.data_version)
            except errors.Closed:
                return
            except errors.HeadraceError as exc:
                log.warning("SQLite metastore %s: watch poller: %s", self.path, exc)
            if version != seen:
                self._notify()
            seen = version
            await asyncio.sleep(self._poll_interval)

    async def _wait_change(self, generation: int, limit: float) -> None:
        """Wait (at most ``limit`` s) for a change after wake-up ``generation``."""
        if self._poller is None or self._poller.done():
            # A poller that failed is logged at once, and started again here by the next wait.
            self._poller = guarded_task(
                self._poll_loop(),
                "sqlite-watch-poller",
                self._on_poller_failure,
                finishable=True,  # it returns once no watch is left
                logger=log,
            )
        if self.generation != generation:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit):
                await self._changed.wait()

    async def _on_poller_failure(self, failure: TaskFailure) -> None:
        self._notify()  # waiting watches look again, and start a new poller

    # -- the contract -----------------------------------------------------

    async def get(self, key: str) -> KeyValue | None:
        found = await self._call(lambda c: sqlite_db.get(c, Get(key)))
        return found[0] if found else None

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self._call(lambda c: sqlite_db.get(c, Get(prefix, prefix=True)))

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        result = await self.txn((), (Put(key, value, lease),))
        return result.revision

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        _, deleted = await self._write(lambda c: sqlite_db.txn(c, (), (Delete(key, prefix),), ()))
        return deleted[0]

    async def txn(
        self,
        compares: Sequence[Compare],
        success: Sequence[Op],
        failure: Sequence[Op] = (),
    ) -> TxnResult:
        result, _ = await self._write(lambda c: sqlite_db.txn(c, compares, success, failure))
        return result

    async def grant_lease(self, ttl: float) -> int:
        check_lease_ttl(ttl)
        return await self._call(lambda c: sqlite_db.grant_lease(c, ttl))

    async def keep_alive(self, lease: int) -> None:
        await self._write(lambda c: sqlite_db.keep_alive(c, lease))

    async def revoke_lease(self, lease: int) -> None:
        await self._write(lambda c: sqlite_db.revoke_lease(c, lease))

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> Watch:
        cursor = await self._call(lambda c: sqlite_db.open_cursor(c, prefix, start_revision))
        watch = _SqliteWatch(self, cursor)
        self._watches.add(watch)
        return watch

    async def revision(self) -> int:
        return await self._call(sqlite_db.revision)

    async def compact(self) -> None:
        """Drop events older than the newest ``event_retention`` revisions (the
        reaper does this every few seconds)."""
        await self._call(lambda c: sqlite_db.compact(c, self._retention))

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._watches.clear()
        self._notify()
        tasks = [*self._tasks, *([self._poller] if self._poller else [])]
        await cancel_and_settle(tasks, what=f"closing the SQLite metastore {self.path}")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._close_connection)
        self._executor.shutdown(wait=False)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class _SqliteWatch(Watch):
    """Iterating the watch (any number of ``aiter`` calls) consumes one stream:
    it ends when the watch is closed and raises Closed once the store is closed."""

    _BATCH = 256

    def __init__(self, store: SqliteMetastore, cursor: sqlite_db.WatchCursor) -> None:
        self._store = store
        self._cursor = cursor
        self._closed = False
        self._buffer: collections.deque[WatchEvent] = collections.deque()
        self._reading = asyncio.Lock()

    def __aiter__(self) -> _SqliteWatch:
        return self

    async def __anext__(self) -> WatchEvent:
        async with self._reading:
            while not self._closed:
                if self._buffer:
                    return self._buffer.popleft()
                generation = self._store.generation
                batch = await self._store._call(
                    lambda c: sqlite_db.fetch(c, self._cursor, self._BATCH)
                )
                if batch:
                    self._buffer.extend(batch)
                else:
                    await self._store._wait_change(generation, 1.0)
            raise StopAsyncIteration

    async def close(self) -> None:
        self._closed = True
        self._buffer.clear()
        self._store._watches.discard(self)
        self._store._notify()

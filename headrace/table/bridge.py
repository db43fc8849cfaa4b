"""Synchronous calls into the async metastore.

pyiceberg is synchronous and calls back into the catalog (load a table, commit
it) from the caller's thread; Headrace's metastore clients are asyncio objects
bound to one event loop. :class:`LoopThread` owns that loop in a daemon thread
for the life of a :class:`headrace.table.TableCatalog`: the metastore is opened,
used and closed there, and sync code waits for each coroutine with a deadline.
A flush job is its own process, so this thread is its only event loop; code
already running on an event loop must not call the catalog from that loop's
thread (it would block the loop), and :meth:`LoopThread.run` refuses it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from headrace import errors
from headrace.metastore.contract import Compare, KeyValue, Metastore, Op, TxnResult

T = TypeVar("T")


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits on it."""

    def __init__(self, name: str) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """The coroutine's result; Unavailable if it takes longer than ``timeout``."""
        if self._loop.is_closed():
            coro.close()
            raise errors.Closed("the table catalog is closed")
        if threading.current_thread() is self._thread:
            coro.close()
            raise errors.InvalidArgument("the table catalog was called from its own loop thread")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise errors.Unavailable(f"the metastore gave no answer within {timeout:g} s") from None

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._loop.is_closed():
            return
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()


class SyncStore:
    """The metastore operations the catalog needs, as blocking calls."""

    def __init__(self, loop: LoopThread, metastore: Metastore, timeout: float) -> None:
        self._loop = loop
        self.metastore = metastore
        self._timeout = timeout

    def get(self, key: str) -> KeyValue | None:
        return self._loop.run(self.metastore.get(key), self._timeout)

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self._loop.run(self.metastore.get_prefix(prefix), self._timeout)

    def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        return self._loop.run(self.metastore.txn(compares, success, failure), self._timeout)

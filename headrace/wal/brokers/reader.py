"""The broker reader: the lifecycle of a reader over a backend's :class:`Source`.

The source's blocking calls run in the reader's own thread. Waiting at the
tail is a loop of short fetches (:data:`POLL_S` each at most), so a close is
noticed within one of them and a timeout is kept.
"""

from __future__ import annotations

import concurrent.futures
import time

from headrace import errors
from headrace.wal.brokers.contract import Boundary, Source
from headrace.wal.contract import BackendReader, Record

POLL_S = 0.2
"""The longest single fetch."""


def fetch_wait(deadline: float | None, now: float) -> float:
    """How long the next fetch may wait for records, given the read's deadline (pure)."""
    if deadline is None:
        return POLL_S
    return max(min(POLL_S, deadline - now), 0.0)


class BrokerReader(BackendReader):
    def __init__(self, source: Source, pchannel: str, boundary: Boundary) -> None:
        self.pchannel = pchannel
        self._source = source
        self._topic = source.topic
        self._boundary = boundary
        self._executor = concurrent.futures.ThreadPoolExecutor(
            1, f"{boundary.backend}-reader-{pchannel}"
        )
        self._closed = False

    async def open(self) -> None:
        try:
            await self._boundary.run(
                self._executor, f"opening a reader of {self._topic}", self._source.open
            )
        except BaseException:
            await self.close()
            raise

    async def next_batch(
        self,
        max_records: int = 1024,
        timeout: float | None = None,
    ) -> list[Record]:
        if self._closed:
            raise errors.Closed(f"{self._boundary.backend} reader of {self.pchannel} is closed")
        if max_records < 1:
            raise errors.InvalidArgument(f"max_records must be >= 1, got {max_records}")
        return await self._boundary.run(
            self._executor, f"reading {self._topic}", self._poll, max_records, timeout
        )

    def _poll(self, max_records: int, timeout: float | None) -> list[Record]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._closed:
            records = self._source.fetch(max_records, fetch_wait(deadline, time.monotonic()))
            if records:
                return records
            if deadline is not None and time.monotonic() >= deadline:
                return []
        raise errors.Closed(
            f"{self._boundary.backend} reader of {self.pchannel} was closed while reading"
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._boundary.run(
            self._executor, f"closing a reader of {self._topic}", self._source.release
        )
        self._executor.shutdown(wait=False)

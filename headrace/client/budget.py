"""A byte budget: back-pressure for producers."""

from __future__ import annotations

import asyncio
import collections


class ByteBudget:
    """Admits work while the bytes in use stay within ``limit``.

    A single item larger than the limit is admitted when nothing else is in
    use, so it cannot wait forever. Waiters are admitted in arrival order.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, size: int) -> bool:
        return self.used == 0 or self.used + size <= self.limit

    def try_acquire(self, size: int) -> bool:
        """Take ``size`` now if it is admitted without waiting."""
        if not self._waiters and self._fits(size):
            self.used += size
            return True
        return False

    async def acquire(self, size: int) -> None:
        if self.try_acquire(size):
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (size, waiter)
        self._waiters.append(entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release(size)
            else:
                if entry in self._waiters:
                    self._waiters.remove(entry)
                self._admit()
            raise

    def release(self, size: int) -> None:
        self.used -= size
        self._admit()

    def _admit(self) -> None:
        while self._waiters:
            size, waiter = self._waiters[0]
            if waiter.done():
                self._waiters.popleft()
                continue
            if not self._fits(size):
                return
            self._waiters.popleft()
            self.used += size
            waiter.set_result(None)

"""Vchannel locks: DDL messages exclude every other append on their vchannel.

Data and transaction messages take their vchannel's lock shared; a DDL
message takes it exclusively, so it waits for in-flight appends on the
vchannel and holds back new ones until it is written. A batch takes the locks
of all its vchannels in sorted order (no deadlock between batches).
"""

from __future__ import annotations

import asyncio
from collections import deque

from headrace.message.types import MessageType
from headrace.wal.interceptors.chain import AppendContext, Handler

_DDL = frozenset(t for t in MessageType if t.is_ddl)


class RWLock:
    """A fair reader-writer lock (FIFO between readers and writers)."""

    __slots__ = ("_readers", "_waiters", "_writer")

    def __init__(self) -> None:
        self._readers = 0
        self._writer = False
        self._waiters: deque[tuple[bool, asyncio.Future[None]]] = deque()

    @property
    def idle(self) -> bool:
        return self._readers == 0 and not self._writer and not self._waiters

    def _can_grant(self, exclusive: bool) -> bool:
        if exclusive:
            return self._readers == 0 and not self._writer
        return not self._writer

    def _grant(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = True
        else:
            self._readers += 1

    async def acquire(self, exclusive: bool) -> None:
        if not self._waiters and self._can_grant(exclusive):
            self._grant(exclusive)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        item = (exclusive, fut)
        self._waiters.append(item)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(exclusive)
            else:
                self._waiters.remove(item)
                self._wake()
            raise

    def release(self, exclusive: bool) -> None:
        if exclusive:
            self._writer = False
        else:
            self._readers -= 1
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            exclusive, fut = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._can_grant(exclusive):
                return
            self._waiters.popleft()
            self._grant(exclusive)
            fut.set_result(None)


class LockInterceptor:
    """Outermost interceptor: per-vchannel shared/exclusive locks."""

    def __init__(self) -> None:
        self._locks: dict[str, RWLock] = {}

    def held(self, vchannel: str) -> bool:
        lock = self._locks.get(vchannel)
        return lock is not None and not lock.idle

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        wanted = lock_plan(batch)
        taken: list[tuple[str, bool]] = []
        try:
            for vchannel, exclusive in wanted:
                lock = self._locks.get(vchannel)
                if lock is None:
                    lock = self._locks[vchannel] = RWLock()
                await lock.acquire(exclusive)
                taken.append((vchannel, exclusive))
            await call_next(batch)
        finally:
            for vchannel, exclusive in taken:
                lock = self._locks[vchannel]
                lock.release(exclusive)
                if lock.idle:
                    del self._locks[vchannel]


def lock_plan(batch: list[AppendContext]) -> list[tuple[str, bool]]:
    """The ``(vchannel, exclusive)`` locks a batch needs, in acquisition order."""
    plan: dict[str, bool] = {}
    for ctx in batch:
        msg = ctx.message
        vchannel = msg.vchannel
        if msg.type in _DDL:
            plan[vchannel] = True
        elif vchannel not in plan and vchannel:
            plan[vchannel] = False
    return sorted(plan.items())

"""Vchannel locks: DDL messages exclude every other append on their vchannel.

Data and transaction messages take their vchannel's lock shared; a DDL
message takes it exclusively, so it waits for in-flight appends on the
vchannel and holds back new ones until it is written. A batch takes the locks
of all its vchannels in sorted order (no deadlock between batches).

While no DDL holds or waits for a lock on the pchannel, a batch without DDL
takes no per-vchannel lock at all: it is admitted at once as one *group*
(the set of its vchannels), so a batch spread over a thousand vchannels costs
what a batch on one does. A DDL that arrives takes its exclusive locks first
(from then on every batch takes per-vchannel locks, queued behind it), then
waits for the groups admitted before it that hold its vchannels.
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


class _Group:
    """A batch without DDL admitted while no DDL was pending."""

    __slots__ = ("done", "vchannels")

    def __init__(self, vchannels: set[str]) -> None:
        self.vchannels = vchannels
        self.done: asyncio.Event | None = None
        """Created by the first DDL that waits for the group."""


class LockInterceptor:
    """Outermost interceptor: per-vchannel shared/exclusive locks."""

    def __init__(self) -> None:
        self._locks: dict[str, RWLock] = {}
        self._groups: set[_Group] = set()
        self._exclusive = 0
        """Batches holding or waiting for an exclusive lock."""

    def held(self, vchannel: str) -> bool:
        lock = self._locks.get(vchannel)
        if lock is not None and not lock.idle:
            return True
        return any(vchannel in group.vchannels for group in self._groups)

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        if not self._exclusive and _DDL.isdisjoint([ctx.message.type for ctx in batch]):
            group = _Group({ctx.message.vchannel for ctx in batch})
            self._groups.add(group)
            try:
                await call_next(batch)
            finally:
                self._groups.discard(group)
                if group.done is not None:
                    group.done.set()
            return
        await self._locked(batch, call_next)

    async def _locked(self, batch: list[AppendContext], call_next: Handler) -> None:
        wanted = lock_plan(batch)
        exclusive = [vchannel for vchannel, ex in wanted if ex]
        self._exclusive += bool(exclusive)
        taken: list[tuple[str, bool]] = []
        try:
            for vchannel, ex in wanted:
                lock = self._locks.get(vchannel)
                if lock is None:
                    lock = self._locks[vchannel] = RWLock()
                await lock.acquire(ex)
                taken.append((vchannel, ex))
            if exclusive:
                await self._groups_done(exclusive)
            await call_next(batch)
        finally:
            self._exclusive -= bool(exclusive)
            for vchannel, ex in taken:
                lock = self._locks[vchannel]
                lock.release(ex)
                if lock.idle:
                    del self._locks[vchannel]

    async def _groups_done(self, vchannels: list[str]) -> None:
        """Wait for the groups admitted before this DDL that hold one of ``vchannels``."""
        wanted = set(vchannels)
        for group in [g for g in self._groups if not wanted.isdisjoint(g.vchannels)]:
            if group.done is None:
                group.done = asyncio.Event()
            await group.done.wait()


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

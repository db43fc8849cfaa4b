"""One timer loop per node for the periodic work of its WALs.

A WAL has periodic work only while something is pending: a TIME_TICK to
persist after data, a tail reader waiting for the timetick to advance, an
open transaction whose keepalive may run out, a growing segment whose idle
time or lifetime may run out, a seal record to retry. An idle WAL has none,
and costs nothing: it is not woken at all.

:class:`TickScheduler` keeps a heap of the WALs (its *clients*) that asked to
be woken, each at the earliest time it asked for, and one guarded loop task
that sleeps until the first is due. A due client's work runs as a guarded
task of its own (:mod:`headrace.guarded`; a failure goes to the client's
``on_task_failure``, which stops that WAL's writing), never two at once for
one client, so a slow backend append or metastore write of one WAL does not
hold back the ticks of the others. The work returns when the client next
needs to be woken (:func:`next_due`, pure, says why), or None.

A client asks again with :meth:`TickScheduler.wake` whenever something new is
pending (an append persisted data, a reader started waiting, a transaction
began). The node shares one scheduler between all its WALs; a WAL opened on
its own makes its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import heapq
import itertools
import logging
from typing import Protocol

from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task

log = logging.getLogger(__name__)

COALESCE_S = 0.001
"""Clients due within this much of each other are started in one pass."""


@dataclasses.dataclass(frozen=True, slots=True)
class Due:
    """When a client must be woken next, and why."""

    delay_s: float
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Needs:
    """What a WAL has pending, as its periodic work sees it."""

    unticked: bool
    """Data was persisted since the last persisted tick (a tick must follow)."""
    reader_waiting: bool
    """A tail reader waits for the buffer: the timetick must advance."""
    chore_s: float | None
    """Seconds until an interceptor's chore is due (an open transaction's
    keepalive, a growing segment's check, a seal record to retry); None:
    nothing pending."""
    flowing: bool = False
    """Data was planned since the WAL's previous tick run."""


TICK_AFTER_DATA = "a tick must follow the data persisted since the last one"
TICK_FOR_READER = "a tail reader waits for the timetick to advance"
CHORE = "an interceptor's chore is due"


@dataclasses.dataclass(frozen=True, slots=True)
class TickKind:
    """How a due TIME_TICK is written, and why."""

    rides: bool
    """True: to the buffer now, and to the log behind the next data write
    (``Appender.advance``); False: a sync tick (``Appender.tick``), persisted
    in a write of its own only if data was persisted since the last tick."""
    reason: str


RIDE_WITH_DATA = TickKind(
    True,
    "data flows: the tick goes to the buffer now and to the log in the next data write, "
    "so it takes no write (and no fsync) that data would wait behind",
)
PERSIST_AT_REST = TickKind(
    False, "the data rests since the previous tick: the tick is persisted on its own"
)
BUFFER_ONLY = TickKind(
    False, "nothing was persisted since the last tick: the tick goes only to the buffer"
)


def tick_kind(needs: Needs) -> TickKind | None:
    """How the tick of a WAL with ``needs`` is written (pure); None: no tick is due.

    Readers see time advance at every run either way; the log gets a tick
    after its last data within about two intervals once the data rests.
    """
    if needs.unticked:
        return RIDE_WITH_DATA if needs.flowing else PERSIST_AT_REST
    if needs.reader_waiting:
        return BUFFER_ONLY
    return None


def next_due(needs: Needs, interval_s: float) -> Due | None:
    """When a WAL with ``needs`` must be woken next (pure); None: it is idle.

    Nothing is woken sooner than ``interval_s`` (the timetick interval), so a
    deadline that is not quite reached yet never makes a busy loop.
    """
    tick: Due | None = None
    if needs.unticked:
        tick = Due(interval_s, TICK_AFTER_DATA)
    elif needs.reader_waiting:
        tick = Due(interval_s, TICK_FOR_READER)
    if needs.chore_s is None:
        return tick
    chore = Due(max(interval_s, needs.chore_s), CHORE)
    return chore if tick is None or chore.delay_s < tick.delay_s else tick


class Client(Protocol):
    """What the scheduler wakes: one WAL's periodic work."""

    @property
    def name(self) -> str: ...

    async def run_due(self) -> Due | None:
        """Do the due work; when to be woken next (None: not until asked)."""

    async def on_task_failure(self, failure: TaskFailure) -> None:
        """The work failed: the client stops (a WAL turns UNAVAILABLE)."""


class TickScheduler:
    """The timer loop of one node's WALs (see the module docstring)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._heap: list[tuple[float, int, Client]] = []
        self._at: dict[Client, float] = {}
        """The time each scheduled client is due at (heap entries not matching it are stale)."""
        self._running: dict[Client, asyncio.Task[None]] = {}
        self._rerun: set[Client] = set()
        """Clients that came due while their work ran: woken again right after."""
        self._clients: set[Client] = set()
        self._order = itertools.count()
        self._loop_task: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Future[None] | None = None
        self._closed = False
        self.runs = 0
        """Work runs started (for tests and benchmarks)."""

    @property
    def scheduled(self) -> int:
        """Clients waiting to be woken."""
        return len(self._at)

    def add(self, client: Client) -> None:
        """Take ``client``: it is woken once it asks (:meth:`wake`)."""
        self._clients.add(client)

    def wake(self, client: Client, due: Due) -> None:
        """Wake ``client`` ``due.delay_s`` from now, unless it is due sooner already."""
        if self._closed or client not in self._clients:
            return
        loop = asyncio.get_running_loop()
        at = loop.time() + due.delay_s
        current = self._at.get(client)
        if current is not None and current <= at:
            return
        self._at[client] = at
        heapq.heappush(self._heap, (at, next(self._order), client))
        if self._loop_task is None:
            self._loop_task = guarded_task(
                self._run(), f"wal-ticks-{self.name}", self._on_loop_failure, logger=log
            )
        elif self._heap[0][2] is client:
            self._nudge()

    async def forget(self, client: Client) -> None:
        """Stop waking ``client``; its work in progress is cancelled and awaited."""
        self._clients.discard(client)
        self._at.pop(client, None)
        self._rerun.discard(client)
        task = self._running.pop(client, None)
        if task is not None and task is not asyncio.current_task():
            await cancel_and_settle([task], what=f"stopping the ticks of {client.name}")

    async def close(self) -> None:
        """Stop the loop and every client's work in progress."""
        self._closed = True
        running = list(self._running.values())
        self._running.clear()
        self._at.clear()
        self._heap.clear()
        self._clients.clear()
        tasks = running if self._loop_task is None else [self._loop_task, *running]
        self._loop_task = None
        await cancel_and_settle(tasks, what=f"stopping the tick loop of {self.name}")

    def _nudge(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            heap = self._heap
            while heap and heap[0][0] <= now + COALESCE_S:
                at, _, client = heapq.heappop(heap)
                if self._at.get(client) != at:
                    continue  # superseded by an earlier wake, or forgotten
                del self._at[client]
                self._start(client)
            self._wakeup = wakeup = loop.create_future()
            timer = loop.call_at(heap[0][0], _resolve, wakeup) if heap else None
            try:
                await wakeup
            finally:
                self._wakeup = None
                if timer is not None:
                    timer.cancel()

    def _start(self, client: Client) -> None:
        if client in self._running:
            self._rerun.add(client)
            return
        self.runs += 1
        self._running[client] = guarded_task(
            self._work(client),
            f"wal-ticks-{client.name}",
            client.on_task_failure,
            finishable=True,
            logger=log,
        )

    async def _work(self, client: Client) -> None:
        try:
            due = await client.run_due()
        finally:
            if self._running.get(client) is asyncio.current_task():
                del self._running[client]
        if client in self._rerun:
            self._rerun.discard(client)
            self.wake(client, Due(0.0, "it came due while its work ran"))
        if due is not None:
            self.wake(client, due)

    async def _on_loop_failure(self, failure: TaskFailure) -> None:
        # Without the loop no client would be woken again: every one stops.
        clients = list(self._clients)
        self._loop_task = None
        for client in clients:
            await client.on_task_failure(failure)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

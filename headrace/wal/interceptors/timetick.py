"""Timetick sync: the WAL's own TIME_TICKs and its interceptors' chores, on top of the appender.

The appender (:mod:`.appender`) gives every message its timetick and writes
it. :class:`TimetickSync` is the WAL's client of the node's
:class:`~headrace.wal.ticks.TickScheduler`: it is woken only while something
is pending (:func:`~headrace.wal.ticks.next_due`), then runs the interceptors'
chores and asks the appender for a TIME_TICK, written as
:func:`~headrace.wal.ticks.tick_kind` says. The appender persists a sync tick
only if data was persisted since the last persisted tick or fence; otherwise
the tick goes only to the buffer, carrying the last persisted message's id,
so tail readers see progress without the log filling with empty ticks. While
data flows (data was planned since the previous run), the tick goes to the
buffer and the log's tick is written behind the next data, in the same
backend append: a tick never takes a write (and an fsync) of its own that
data would wait behind; once the data rests for a run, the tick is persisted
on its own. An idle WAL (nothing persisted since its last tick, no reader
waiting, no chore pending) is not woken.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from headrace import errors
from headrace.guarded import TaskFailure
from headrace.wal.buffer import WriteAheadBuffer
from headrace.wal.interceptors.appender import Appender, AppenderConfig, system_context
from headrace.wal.interceptors.chain import Handler, Interceptors
from headrace.wal.ticks import TICK_AFTER_DATA, Due, Needs, TickScheduler, next_due, tick_kind

__all__ = ["Appender", "AppenderConfig", "TimetickSync", "system_context"]


class TimetickSync:
    """One WAL's ticks and chores, woken by the node's scheduler when due."""

    def __init__(
        self,
        appender: Appender,
        buffer: WriteAheadBuffer,
        interceptors: Interceptors,
        *,
        write: Handler,
        interval_s: float,
        scheduler: TickScheduler,
        serving: Callable[[], bool],
    ) -> None:
        self.name = appender.pchannel
        self._appender = appender
        self._buffer = buffer
        self._interceptors = interceptors
        self._write = write
        self._interval = interval_s
        self.scheduler = scheduler
        self._serving = serving
        self._after_data = Due(interval_s, TICK_AFTER_DATA)
        self._writes_seen = appender.writes_planned
        """The appender's planned writes at the previous run (see :meth:`needs`)."""

    def start(self) -> None:
        self.scheduler.add(self)
        self._buffer.on_wait = self.attention
        self._appender.on_unticked = self._unticked
        self.attention()

    async def stop(self) -> None:
        self._buffer.on_wait = None
        self._appender.on_unticked = None
        await self.scheduler.forget(self)

    def needs(self) -> Needs:
        return Needs(
            unticked=self._appender.unticked,
            reader_waiting=self._buffer.waiting,
            chore_s=self._interceptors.chore_due_s(),
            flowing=self._appender.writes_planned != self._writes_seen,
        )

    @property
    def idle(self) -> bool:
        """Nothing is pending: the timetick has nothing to catch up with."""
        return next_due(self.needs(), self._interval) is None

    def attention(self) -> None:
        """Something may be pending now: be woken when it is due."""
        due = next_due(self.needs(), self._interval)
        if due is not None:
            self.scheduler.wake(self, due)

    def _unticked(self) -> None:
        """Data was planned after the last persisted tick: a tick is due an interval later."""
        self.scheduler.wake(self, self._after_data)

    async def run_due(self) -> Due | None:
        if self._appender.failure is not None or not self._serving():
            return None
        await self._interceptors.chores(self._write)
        needs = self.needs()
        self._writes_seen = self._appender.writes_planned
        kind = tick_kind(needs)
        if kind is not None:
            # A tick that fails means the appender failed or stopped: seen below.
            with contextlib.suppress(errors.HeadraceError):
                if kind.rides:
                    await self._appender.advance()
                else:
                    await self._appender.tick(sync=True)
            needs = self.needs()
        if self._appender.failure is not None:
            return None
        return next_due(needs, self._interval)

    async def on_task_failure(self, failure: TaskFailure) -> None:
        # A failed sync stops the WAL's writing (it turns UNAVAILABLE and is
        # reopened): without ticks, tail readers would wait forever.
        await self._appender.on_task_failure(failure)

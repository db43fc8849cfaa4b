"""Timetick sync: the WAL's own TIME_TICKs, on top of the appender.

The appender (:mod:`.appender`) gives every message its timetick and writes
it. The sync task asks it for a TIME_TICK every interval. The appender
persists the tick only if data was persisted since the last persisted tick or
fence; otherwise the tick goes only to the buffer, carrying the last persisted
message's id, so tail readers see progress without the log filling with
empty ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from headrace import errors
from headrace.guarded import guarded_task
from headrace.wal.interceptors.appender import Appender, AppenderConfig, system_context

__all__ = ["Appender", "AppenderConfig", "TimetickSync", "system_context"]


class TimetickSync:
    """Asks the appender for a tick every interval and runs periodic chores."""

    def __init__(
        self,
        appender: Appender,
        interval_s: float,
        chores: list[Callable[[], Awaitable[None]]],
    ) -> None:
        self._appender = appender
        self._interval = interval_s
        self._chores = chores
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        # A sync task that fails stops the WAL's writing (it turns UNAVAILABLE
        # and is reopened): without ticks, tail readers would wait forever.
        self._task = guarded_task(
            self._run(),
            "wal-timetick-sync",
            self._appender.on_task_failure,
            finishable=True,  # it returns once the appender failed
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while self._appender.failure is None:
            await asyncio.sleep(self._interval)
            for chore in self._chores:
                await chore()
            try:
                await self._appender.tick(sync=True)
            except errors.HeadraceError:
                continue

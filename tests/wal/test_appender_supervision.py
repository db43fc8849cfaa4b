"""A task the WAL's appender runs (its append loop, the recovery after a failed
append) that fails on a defect stops the WAL's writing at once: every waiting
caller gets an answer, and the WAL turns UNAVAILABLE (the node reopens it),
instead of callers waiting forever on a loop that silently died."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from headrace import errors
from headrace.wal.api import WALState
from tests.wal.test_appender import WAIT, data, open_wal, results


async def test_an_append_loop_that_fails_answers_every_waiting_caller(
    caplog: pytest.LogCaptureFixture,
) -> None:
    wal, writer = await open_wal(max_batch=4)
    writer.gate.clear()
    first = asyncio.create_task(wal.append_many(data("a", 4)))
    await asyncio.sleep(0.01)
    appender: Any = wal._appender

    def defect(*_: object) -> None:
        raise RuntimeError("injected planning defect")

    appender._plan_more = defect
    queued = asyncio.create_task(wal.append_many(data("b", 2)))
    await asyncio.sleep(0.01)
    writer.gate.set()
    async with asyncio.timeout(WAIT):
        assert len(results(await first)) == 4
        outcomes = await queued
    assert all(isinstance(o, errors.Unavailable) for o in outcomes), outcomes
    assert all("injected planning defect" in str(o) for o in outcomes)
    assert wal.state is WALState.UNAVAILABLE
    logged = [r for r in caplog.records if "wal-appender-p failed" in r.getMessage()]
    assert logged and logged[0].exc_info is not None
    await wal.close()


async def test_a_recovery_that_fails_makes_the_wal_unavailable() -> None:
    wal, writer = await open_wal(max_batch=4)
    appender: Any = wal._appender

    async def defect() -> None:
        raise RuntimeError("injected recovery defect")

    appender._after_failed_append = defect
    writer.fail_next = errors.Unavailable("broker hiccup")
    async with asyncio.timeout(WAIT):
        failed = await wal.append_many(data("a", 1))
        assert isinstance(failed[0], errors.Unavailable)
        while True:
            if wal.state is not WALState.SERVING:
                break
            await asyncio.sleep(0.01)
        refused = await wal.append_many(data("b", 1))
    assert wal.state is WALState.UNAVAILABLE
    assert isinstance(refused[0], errors.Unavailable)
    assert "injected recovery defect" in str(refused[0])
    await wal.close()

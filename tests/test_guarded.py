"""Guarded tasks report a failure at once; teardown reports every failure."""

from __future__ import annotations

import asyncio
import logging

import pytest

from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task, settle, wait_any


class Reports:
    def __init__(self) -> None:
        self.failures: list[TaskFailure] = []
        self.reported = asyncio.Event()

    async def __call__(self, failure: TaskFailure) -> None:
        self.failures.append(failure)
        self.reported.set()


async def test_a_failure_is_logged_with_its_traceback_and_reported_at_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    reports = Reports()

    async def loop() -> None:
        await asyncio.sleep(0)
        raise KeyError("boom")

    task = guarded_task(loop(), "the-loop", reports)
    # Reported while nobody awaits the task (and long before any teardown).
    await asyncio.wait_for(reports.reported.wait(), 5)
    (failure,) = reports.failures
    assert failure.name == "the-loop" and isinstance(failure.error, KeyError)
    assert "the-loop failed: KeyError" in failure.describe()
    (record,) = [r for r in caplog.records if "the-loop" in r.getMessage()]
    assert record.levelno == logging.ERROR and record.exc_info is not None
    await task  # reported once: the task itself ends cleanly


async def test_a_task_that_returns_although_it_should_run_is_a_failure() -> None:
    reports = Reports()

    async def quits() -> None:
        return None

    await guarded_task(quits(), "quitter", reports)
    (failure,) = reports.failures
    assert failure.error is None and "ended although it should run" in failure.describe()


async def test_finishing_a_finishable_task_and_cancelling_any_are_no_failures() -> None:
    reports = Reports()

    async def done() -> None:
        return None

    async def forever() -> None:
        await asyncio.Event().wait()

    await guarded_task(done(), "worker", reports, finishable=True)
    endless = guarded_task(forever(), "endless", reports)
    await asyncio.sleep(0)
    endless.cancel()
    with pytest.raises(asyncio.CancelledError):
        await endless
    assert reports.failures == []


async def test_a_failing_failure_handler_is_logged_too(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(failure: TaskFailure) -> None:
        raise RuntimeError("handler broke")

    async def fails() -> None:
        raise ValueError("first")

    await guarded_task(fails(), "doubly", handler)
    messages = [r.getMessage() for r in caplog.records]
    assert any("doubly failed: ValueError" in m for m in messages)
    assert any("handling the failure of task doubly failed too" in m for m in messages)


async def test_settle_awaits_everything_and_reports_every_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    finished: list[str] = []

    async def close(name: str, error: Exception | None) -> None:
        await asyncio.sleep(0.01)
        finished.append(name)
        if error is not None:
            raise error

    failures = await settle(
        [close("a", OSError("disk")), close("b", None), close("c", RuntimeError("bug"))],
        what="closing three things",
    )
    assert sorted(finished) == ["a", "b", "c"]
    assert [type(f) for f in failures] == [OSError, RuntimeError]
    logged = [r for r in caplog.records if r.getMessage().startswith("closing three things")]
    assert len(logged) == 2 and all(r.exc_info is not None for r in logged)
    assert await settle([], what="nothing") == []


async def test_cancel_and_settle_reports_what_tasks_raised_not_their_cancellation() -> None:
    async def crashed() -> None:
        raise LookupError("gone")

    async def sleeping() -> None:
        await asyncio.sleep(60)

    crashed_task = asyncio.create_task(crashed())
    sleeping_task = asyncio.create_task(sleeping())
    await asyncio.sleep(0.01)
    failures = await cancel_and_settle([crashed_task, sleeping_task], what="teardown")
    assert [type(f) for f in failures] == [LookupError]
    assert sleeping_task.cancelled()


async def test_wait_any_returns_on_the_first_event_or_the_timeout() -> None:
    first, second = asyncio.Event(), asyncio.Event()
    asyncio.get_running_loop().call_later(0.01, second.set)
    await asyncio.wait_for(wait_any((first, second)), 5)
    await wait_any((first,), timeout=0.01)
    assert not first.is_set()
    leftover = [t for t in asyncio.all_tasks() if t.get_name() == "wait-any"]
    assert leftover == []


async def test_a_task_cancelled_before_it_starts_leaves_no_unawaited_coroutine() -> None:
    reports = Reports()

    async def never_started() -> None:
        raise AssertionError("unreachable")

    coro = never_started()
    task = guarded_task(coro, "early", reports)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert coro.cr_frame is None, "the coroutine was left open (never awaited)"
    assert reports.failures == []

"""Long-running tasks that cannot die unnoticed, and teardown that loses no error.

A bare ``asyncio.create_task`` keeps its exception until somebody awaits the
task: a loop that should run until stopped can end on an unexpected error
while everything that depends on it goes on as if it still ran, and the error
shows only at teardown, if at all. :func:`guarded_task` (the idea of kopf's
``create_guarded_task``) reports such a failure at once: it is logged with its
traceback and handed to an ``on_failure`` callback, which stops what depends
on the task (the node turns NOT_SERVING and exits, a session counts as lost, a
WAL turns UNAVAILABLE and is reopened). A task that ends on its own although it
should run until cancelled is a failure too, unless it is ``finishable``.

Teardown used to be ``gather(..., return_exceptions=True)``, which throws the
errors away. :func:`settle` awaits several things to their end and logs every
failure with its traceback; :func:`cancel_and_settle` cancels tasks first. Both
return the failures, so a caller can also act on them. :func:`wait_any` waits
for the first of several events without leaving waiters behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from typing import Any

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFailure:
    """A guarded task that failed, or ended although it should not have."""

    name: str
    error: Exception | None
    """What it raised; None if it returned while it should run until cancelled."""

    def describe(self) -> str:
        if self.error is None:
            return f"task {self.name} ended although it should run until stopped"
        return f"task {self.name} failed: {type(self.error).__name__}: {self.error}"


OnFailure = Callable[[TaskFailure], Awaitable[None]]


async def _guard(
    coro: Coroutine[Any, Any, None],
    name: str,
    on_failure: OnFailure,
    finishable: bool,
    logger: logging.Logger,
) -> None:
    try:
        await coro
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        failure = TaskFailure(name, exc)
        logger.error("%s", failure.describe(), exc_info=exc)
    else:
        if finishable:
            return
        failure = TaskFailure(name, None)
        logger.error("%s", failure.describe())
    try:
        await on_failure(failure)
    except Exception:
        logger.exception("handling the failure of task %s failed too", name)


def guarded_task(
    coro: Coroutine[Any, Any, None],
    name: str,
    on_failure: OnFailure,
    *,
    finishable: bool = False,
    logger: logging.Logger = log,
) -> asyncio.Task[None]:
    """Run ``coro`` as a task whose failure is logged and handed to ``on_failure`` at once.

    The task itself then ends without an exception (its failure was
    reported), so awaiting or settling it later does not report it twice.
    Cancellation is not a failure. ``finishable``: returning is normal (a
    worker that runs out of work), not a failure.
    """
    task = asyncio.get_running_loop().create_task(
        _guard(coro, name, on_failure, finishable, logger), name=name
    )
    # A task cancelled before its first step never awaits ``coro``: close it,
    # or Python warns that it was never awaited (a no-op once it has run).
    task.add_done_callback(lambda _: coro.close())
    return task


async def settle(
    awaitables: Iterable[Awaitable[object]], *, what: str, logger: logging.Logger = log
) -> list[Exception]:
    """Await every one of ``awaitables`` to its end, side by side, whatever the others do.

    Every failure is logged with its traceback, naming ``what`` (say "closing
    node-1's clients"), and returned. A cancelled one is not a failure. If
    the caller is cancelled meanwhile, those not done yet are cancelled too.
    """
    tasks = [_future(a) for a in awaitables]
    if not tasks:
        return []
    try:
        await asyncio.wait(tasks)
    except asyncio.CancelledError:
        for task in tasks:
            task.cancel()
        raise
    failures: list[Exception] = []
    for task in tasks:
        if task.cancelled():
            continue
        error = task.exception()
        if error is None:
            continue
        if not isinstance(error, Exception):
            raise error
        logger.error("%s: %s failed: %r", what, _name(task), error, exc_info=error)
        failures.append(error)
    return failures


def _future(awaitable: Awaitable[object]) -> asyncio.Future[object]:
    if asyncio.iscoroutine(awaitable):
        name = getattr(awaitable, "__qualname__", None)
        return asyncio.get_running_loop().create_task(awaitable, name=name)
    return asyncio.ensure_future(awaitable)


def _name(future: asyncio.Future[object]) -> str:
    return future.get_name() if isinstance(future, asyncio.Task) else repr(future)


async def cancel_and_settle(
    tasks: Iterable[asyncio.Task[Any]], *, what: str, logger: logging.Logger = log
) -> list[Exception]:
    """Cancel ``tasks``, then :func:`settle` them: the failures they had are reported."""
    pending = list(tasks)
    for task in pending:
        task.cancel()
    return await settle(pending, what=what, logger=logger)


async def wait_any(events: Sequence[asyncio.Event], timeout: float | None = None) -> None:
    """Return when one of ``events`` is set, or after ``timeout`` seconds (None: no bound)."""
    if any(event.is_set() for event in events):
        return
    waiters = [
        asyncio.get_running_loop().create_task(event.wait(), name="wait-any") for event in events
    ]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await cancel_and_settle(waiters, what="waiting for one of several events")

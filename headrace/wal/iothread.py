"""A dedicated thread for one writer's blocking calls, run one at a time, in order.

A thread fed by a :class:`queue.SimpleQueue`, whose jobs hand their outcome
back with one ``loop.call_soon_threadsafe``, costs less per call than a
thread pool (``loop.run_in_executor``, ``Executor.submit``): no work item, no
:class:`concurrent.futures.Future` with its condition and done callbacks, no
pool bookkeeping; on the event loop's side a call is one queue put. One
producer's appends pay that hand-off twice per append (issue #14).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from headrace import errors

J = TypeVar("J")
T = TypeVar("T")


class IOThread(Generic[J]):
    """Runs ``run(job)`` for each submitted job in its own thread, in order.

    ``run`` must not raise: it hands the job's outcome (result or error) to
    whoever waits for it. The thread starts with the first job.
    """

    def __init__(self, name: str, run: Callable[[J], None]) -> None:
        self._name = name
        self._run_job = run
        self._jobs: queue.SimpleQueue[J | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False

    @property
    def stopped(self) -> bool:
        """No job is taken any more (:meth:`stop`)."""
        return self._stopped

    def submit(self, job: J) -> bool:
        """Run ``run(job)`` after the jobs submitted before; False (not run) once stopped."""
        if self._stopped:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put(job)
        return True

    def stop(self) -> None:
        """Take no more jobs; the thread ends once the jobs submitted before are done."""
        if self._stopped:
            return
        self._stopped = True
        if self._thread is not None:
            self._jobs.put(None)

    def _run(self) -> None:
        get, run = self._jobs.get, self._run_job
        while (job := get()) is not None:
            run(job)


def answer(loop: asyncio.AbstractEventLoop, deliver: Callable[..., object], *args: object) -> None:
    """Call ``deliver(*args)`` on ``loop`` (from a thread); nothing if the loop is closed."""
    with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile
        loop.call_soon_threadsafe(deliver, *args)


def call_job(fn: Callable[[], object]) -> None:
    """The ``run`` of an :class:`IOThread` whose jobs are plain calls that answer themselves."""
    fn()


async def call_in(thread: IOThread[Callable[[], None]], what: str, fn: Callable[[], T]) -> T:
    """``fn()`` in ``thread``, after the jobs submitted before; its result or its error.

    Raises :class:`~headrace.errors.Closed` (``what`` says what was refused) once
    the thread is stopped.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        try:
            result = fn()
        except BaseException as exc:  # handed to the caller on the loop
            answer(loop, _fail, future, exc)
        else:
            answer(loop, _succeed, future, result)

    if not thread.submit(job):
        raise errors.Closed(f"{what}: the writer's thread is stopped")
    return await future


def _succeed(future: asyncio.Future[T], result: T) -> None:
    if not future.done():  # not cancelled meanwhile
        future.set_result(result)


def _fail(future: asyncio.Future[T], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)

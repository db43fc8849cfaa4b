"""Group commit for backends whose write is one blocking client call.

Append calls queue up. When no write is in flight, the queued calls (up to a
record and byte bound) go to the writer's thread at once, as one call of
``write`` (a :class:`~headrace.wal.iothread.IOThread`: cheaper per write than a
thread pool); the moment it returns, every caller is settled with its own
slice of the ids, the next queued group is started, and only then do the
callers' ``on_done`` callbacks run. No event-loop task sits in between: a call
that finds the writer idle starts its write before :meth:`GroupCommit.start`
returns, and the calls that arrive while a write is in flight form the next
group, so a write's fixed cost (a Kafka transaction, a Pulsar round trip) is
shared by everything that queued meanwhile.

The Kafka and Pulsar writers share it. A Fenced error is remembered: later
appends, and the calls still queued behind the fenced write, fail at once.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Callable, Iterable, Sequence

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.iothread import IOThread, answer

Future = asyncio.Future[list[MessageID]]
OnDone = Callable[[Future], None] | None
_Pending = tuple[list[bytes], Future, OnDone]
_Answered = tuple[Future, Callable[[Future], None]]


def take_group(sizes: Iterable[tuple[int, int]], max_records: int, max_bytes: int) -> int:
    """How many of the queued calls (``(records, bytes)`` each) go into one write (pure).

    Calls are taken in order while both bounds hold; the first call always
    goes, however large (a call is never split).
    """
    count = size = taken = 0
    for records, nbytes in sizes:
        if taken and (count + records > max_records or size + nbytes > max_bytes):
            break
        count += records
        size += nbytes
        taken += 1
    return taken


def failed(error: errors.HeadraceError, on_done: OnDone = None) -> Future:
    """A future that already failed with ``error`` (``on_done`` runs soon after)."""
    future: Future = asyncio.get_running_loop().create_future()
    future.set_exception(error.with_traceback(None))
    if on_done is not None:
        future.add_done_callback(on_done)
    return future


class PartlyWritten(Exception):
    """A write that failed with ``failure`` after its first records were stored for good.

    ``written`` are the ids of those records, in order: the calls whose
    records all lie among them succeed, the others fail with ``failure``.
    """

    def __init__(self, failure: errors.HeadraceError, written: Sequence[MessageID]) -> None:
        super().__init__(failure, list(written))
        self.failure = failure
        self.written: list[MessageID] = list(written)


def failure_of(exc: BaseException, what: str) -> errors.HeadraceError:
    """The error callers get for a failed write (library errors are translated already)."""
    if isinstance(exc, errors.HeadraceError):
        return exc
    return errors.HeadraceError(f"{what} failed unexpectedly: {exc!r}")


class GroupCommit:
    def __init__(
        self,
        write: Callable[[list[bytes]], Sequence[MessageID]],
        thread: IOThread[Callable[[], None]],
        *,
        what: str = "backend append",
        max_records: int = 10_000,
        max_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        self._write = write
        self._thread = thread
        self._what = what
        self._max_records = max_records
        self._max_bytes = max_bytes
        self._queue: deque[_Pending] = deque()
        self._busy = False
        """A write is in flight."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: asyncio.Future[None] | None = None
        self.fenced: errors.Fenced | None = None

    def start(self, batch: list[bytes], on_done: OnDone = None) -> Future:
        """Queue ``batch``; its write starts now if none is in flight.

        The future gets the batch's ids, in order; ``on_done(future)`` runs
        right when the outcome is set.
        """
        if self.fenced is not None:
            return failed(self.fenced, on_done)
        loop = asyncio.get_running_loop()
        future: Future = loop.create_future()
        if not batch:
            future.set_result([])
            if on_done is not None:
                future.add_done_callback(on_done)
            return future
        self._queue.append((batch, future, on_done))
        if not self._busy:
            self._loop = loop
            self._run_callbacks(self._dispatch())
        return future

    async def submit(self, batch: list[bytes]) -> list[MessageID]:
        """Write ``batch`` with whatever else is queued; its ids, in order."""
        return await self.start(batch)

    async def drain(self) -> None:
        """Wait until every queued call is settled."""
        while self._busy or self._queue:
            if self._idle is None or self._idle.done():
                self._idle = asyncio.get_running_loop().create_future()
            await asyncio.shield(self._idle)

    def _take_group(self) -> list[_Pending]:
        queue = self._queue
        sizes = ((len(batch), sum(map(len, batch))) for batch, _, _ in queue)
        return [
            queue.popleft() for _ in range(take_group(sizes, self._max_records, self._max_bytes))
        ]

    def _dispatch(self) -> list[_Answered]:
        """Start the write of the next group (on the event loop); callbacks to run."""
        loop = self._loop
        assert loop is not None
        group = self._take_group()
        if not group:
            self._busy = False
            idle, self._idle = self._idle, None
            if idle is not None and not idle.done():
                idle.set_result(None)
            return []
        self._busy = True
        flat = group[0][0] if len(group) == 1 else [r for batch, _, _ in group for r in batch]
        if not self._thread.submit(functools.partial(self._run_write, loop, group, flat)):
            closed = errors.Closed(f"{self._what}: the writer is closed (its thread is stopped)")
            return self._settle(group, None, closed) + self._fail_queued(closed)
        return []

    def _run_write(
        self, loop: asyncio.AbstractEventLoop, group: list[_Pending], flat: list[bytes]
    ) -> None:
        """Write ``flat``, then hand the outcome to the event loop (in the writer's thread)."""
        try:
            ids = self._write(flat)
        except BaseException as exc:  # every caller gets an answer
            answer(loop, self._completed, group, None, exc)
        else:
            answer(loop, self._completed, group, ids, None)

    def _fail_queued(self, failure: errors.HeadraceError) -> list[_Answered]:
        queued = list(self._queue)
        self._queue.clear()
        answered = self._settle(queued, None, failure)
        self._busy = False
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)
        return answered

    def _completed(
        self,
        group: list[_Pending],
        ids: Sequence[MessageID] | None,
        exc: BaseException | None,
    ) -> None:
        """Settle a finished write's callers, start the next write, then run callbacks."""
        if exc is None:
            assert ids is not None
            answered = self._settle(group, ids, None)
            answered += self._dispatch()
        else:
            written: Sequence[MessageID] = ()
            if isinstance(exc, PartlyWritten):
                written = exc.written
                exc = exc.failure
            failure = failure_of(exc, self._what)
            answered = self._settle(group, written, failure)
            if isinstance(failure, errors.Fenced):
                self.fenced = failure
                answered += self._fail_queued(failure)
            else:
                answered += self._dispatch()
        self._run_callbacks(answered)

    def _run_callbacks(self, answered: list[_Answered]) -> None:
        loop = self._loop
        assert loop is not None
        for future, on_done in answered:
            try:
                on_done(future)
            except Exception as error:  # a caller's callback must not stop the writer
                loop.call_exception_handler(
                    {"message": "append callback failed", "exception": error, "future": future}
                )

    @staticmethod
    def _settle(
        group: list[_Pending],
        ids: Sequence[MessageID] | None,
        failure: errors.HeadraceError | None,
    ) -> list[_Answered]:
        """Set each call's outcome; the callbacks still to run.

        A call succeeds if ``ids`` hold all its records (a failed write's
        ``ids`` are the stored prefix), and fails with ``failure`` otherwise."""
        answered: list[_Answered] = []
        index = 0
        for batch, future, on_done in group:
            if not future.done():
                if ids is not None and index + len(batch) <= len(ids):
                    future.set_result(list(ids[index : index + len(batch)]))
                else:
                    assert failure is not None
                    future.set_exception(failure.with_traceback(None))
                if on_done is not None:
                    answered.append((future, on_done))
            index += len(batch)
        return answered

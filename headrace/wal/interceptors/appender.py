"""The appender: timetick assignment and group commit, the chain's innermost stage.

One appender per WAL takes the queued messages (up to the batch limit),
gives them timeticks from the TSO in order (never below the last one plus
one, so timeticks strictly increase in log order even if the TSO goes
backwards), stamps the term, writes them with a single backend append, then
settles every caller's context and feeds the write-ahead buffer. Concurrent
producers therefore share backend appends.

Backend appends never overlap, and they follow each other closely: while one
is in flight the next batch is planned (timeticks, encoding), and the moment
the backend acknowledges the first, the next one starts, before the first's
callers are settled. See :mod:`.planning` for the bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from headrace import errors
from headrace.guarded import TaskFailure, guarded_task
from headrace.message import codec, records
from headrace.message.ids import MessageID
from headrace.message.records import BatchEntry
from headrace.message.types import Message, MessageType
from headrace.tso import TimestampAllocator
from headrace.wal.api import AppendResult
from headrace.wal.buffer import Position, WriteAheadBuffer, end_of
from headrace.wal.contract import BackendWriter, Record
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.interceptors.planning import (
    Batch,
    Persist,
    Request,
    Stamp,
    persists,
    plan,
    resolve,
    settle,
    settle_early,
    settle_failed,
    ticks_needed,
    unsettle,
)
from headrace.wal.interceptors.txn import TXN_ID_BYTES
from headrace.wal.progress import Progress, Sample

log = logging.getLogger(__name__)


def system_context(msg_type: MessageType, properties: Mapping[str, str]) -> AppendContext:
    msg = Message(msg_type, properties=dict(properties))
    return AppendContext(msg, codec.encoded_size(msg))


@dataclasses.dataclass(frozen=True, slots=True)
class AppenderConfig:
    pchannel: str
    term: int
    max_batch_messages: int
    max_message_bytes: int
    tick_properties: Callable[[], Mapping[str, str]]
    """Properties of the WAL's own ticks (the dedup rebuild hint)."""
    resync: Callable[[], Awaitable[Record | None]]
    """The backend's last record, asked after a failed append."""
    message_format: int = codec.FORMAT_VERSION
    """The format records are encoded in."""


class Appender:
    """The group-commit loop; :meth:`write` is the chain's innermost handler."""

    def __init__(
        self,
        config: AppenderConfig,
        writer: BackendWriter,
        tso: TimestampAllocator,
        buffer: WriteAheadBuffer,
        last: Position,
    ) -> None:
        self._cfg = config
        self._writer = writer
        self._tso = tso
        self._buffer = buffer
        self._stamp = Stamp(
            config.term,
            last.timetick,
            False,
            config.max_message_bytes + TXN_ID_BYTES,
            config.message_format,
        )
        self.last_id: MessageID | None = last.id
        self.appended_total = 0
        self.progress = Progress()
        """Bytes appended and sampled positions (retention, back-pressure)."""
        if last.id is not None:
            self.progress.positions.note(Sample(last.id, last.timetick, 0), force=True)
        self.failure: errors.HeadraceError | None = None
        """Set once the WAL can no longer write (fenced, backend state unknown)."""
        self._queue: deque[Request] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._writing: Batch | None = None
        """The batch whose backend append is in flight."""
        self._write_future: asyncio.Future[list[MessageID]] | None = None
        self._ready: Batch | None = None
        """The next batch, planned, waiting for the append in flight."""
        self._extending = False
        """The loop is adding requests to ``_ready`` (it must not start meanwhile)."""
        self._planning = False
        """A batch is being planned (by the loop, or by a caller while nothing else ran)."""
        self._recovery: asyncio.Task[None] | None = None
        """After a failed append: finding out what the backend holds."""
        self._shared = False
        """Whether the last batch held requests of several producers."""
        self.on_unticked: Callable[[], None] | None = None
        """Called when data is planned after the last persisted tick (a tick
        is due an interval later)."""
        self.writes_planned = 0
        """Batches planned that write something anyway (data, a fence): the
        timetick sync compares it between its runs to tell whether data flows."""
        self._ride = False
        """A TIME_TICK is to be persisted in the next data write (see :meth:`advance`)."""

    @property
    def last_timetick(self) -> int:
        return self._stamp.last_timetick

    @property
    def pchannel(self) -> str:
        return self._cfg.pchannel

    @property
    def unticked(self) -> bool:
        """Data was planned since the last persisted tick or fence: a tick must follow."""
        return self._stamp.dirty

    def start(self) -> None:
        self._task = guarded_task(
            self._run(),
            f"wal-appender-{self._cfg.pchannel}",
            self._on_loop_failure,
            finishable=True,  # it returns once stopped or failed
            logger=log,
        )

    def fail(self, error: errors.HeadraceError) -> None:
        """Stop writing: a task the WAL depends on failed. The loop fails what is
        queued; the WAL turns UNAVAILABLE (the node reopens it)."""
        if self.failure is None:
            self.failure = error
        self._wake()

    async def on_task_failure(self, failure: TaskFailure) -> None:
        """For a guarded task the appender depends on (sync ticks, recovery)."""
        self.fail(self._stopped_by(failure))

    async def _on_loop_failure(self, failure: TaskFailure) -> None:
        # The loop itself is gone: fail its queue here, or the callers would wait forever.
        self.fail(self._stopped_by(failure))
        self._fail_pending(self.failure or self._stopped_by(failure))

    def _stopped_by(self, failure: TaskFailure) -> errors.HeadraceError:
        return errors.Unavailable(
            f"the WAL of {self._cfg.pchannel} (term {self._cfg.term}) stopped writing: "
            f"{failure.describe()}"
        )

    async def stop(self) -> None:
        """Write what is queued, then end the loop."""
        self._stopping = True
        self._wake()
        if self._task is not None:
            await self._task

    async def abort(self) -> None:
        """End the loop now; queued requests fail with the current failure."""
        self._stopping = True
        for task in (self._task, self._recovery):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        batch, future = self._writing, self._write_future
        self._writing = self._write_future = None
        if batch is not None:
            # Every caller gets an answer; the append may still become durable.
            if future is not None:
                future.cancel()
            unsettle(batch)
            error = errors.Closed("the WAL closed during the append; outcome unknown")
            settle_failed(batch.requests, error)
            resolve(batch.requests)
        self._fail_pending(self.failure or errors.Closed("the WAL was closed"))

    async def write(self, batch: list[AppendContext]) -> None:
        """Queue ``batch`` and wait until every context is settled."""
        await self._submit(batch, Persist.ALWAYS)

    async def tick(self, *, sync: bool) -> None:
        """Write a TIME_TICK (only to the buffer if ``sync`` and nothing new was persisted)."""
        await self._tick(Persist.AFTER_DATA if sync else Persist.ALWAYS)

    async def advance(self) -> None:
        """Data flows: a TIME_TICK to the buffer now (tail readers see time
        advance), and one persisted behind the data of the next write, in the
        same backend append: no write of its own that data would wait for."""
        self._ride = True
        await self._tick(Persist.NEVER)

    async def _tick(self, persist: Persist) -> None:
        ctx = system_context(MessageType.TIME_TICK, self._cfg.tick_properties())
        await self._submit([ctx], persist)
        if ctx.error is not None:
            raise ctx.error

    async def fence(self) -> AppendResult:
        """Write the FENCE that opens this term."""
        ctx = system_context(MessageType.FENCE, self._cfg.tick_properties())
        await self._submit([ctx], Persist.ALWAYS)
        if ctx.error is not None:
            raise ctx.error
        assert ctx.result is not None
        return ctx.result

    async def _submit(self, batch: list[AppendContext], persist: Persist) -> None:
        if self.failure is not None or self._stopping:
            error = self.failure or errors.NotOwner(
                f"pchannel {self._cfg.pchannel} stopped taking appends", term=self._cfg.term
            )
            for ctx in batch:
                ctx.fail(error)
            return
        loop = asyncio.get_running_loop()
        step = self._cfg.max_batch_messages
        futures = []
        for i in range(0, len(batch), step):
            fut: asyncio.Future[None] = loop.create_future()
            part = batch if len(batch) <= step else batch[i : i + step]
            self._queue.append(Request(part, fut, persist))
            futures.append(fut)
        if self._planning or self._ready is not None or self._busy() or self._shared:
            self._wake()
        else:
            # Nothing else is going on: plan and start the append in the
            # caller's task (the loop would only take a turn to do the same).
            await self._plan_next()
        for fut in futures:
            # A cancelled caller cancels only its future; the loop still writes
            # the batch (it may be durable, it is just not acknowledged).
            await fut

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    # -- the loop: planning ------------------------------------------------

    async def _run(self) -> None:
        """Plan batches in order; start each as soon as the previous append finished."""
        loop = asyncio.get_running_loop()
        while True:
            if self.failure is not None:
                self._fail_pending(self.failure)
                return
            ready = self._ready
            if self._queue and not self._planning and (ready is None or self._fits(ready)):
                if ready is None:
                    await self._plan_next()
                else:
                    await self._extend(ready)
                continue
            if self._stopping and self._idle():
                return
            self._wakeup = loop.create_future()
            await self._wakeup

    def _loop_due(self) -> bool:
        """The planning loop (:meth:`_run`) may act after an append: requests
        are queued, a batch waits (the released producers' next calls are
        to extend it before it starts), a failure or a stop. Otherwise waking
        it only costs it a turn (one producer's every append: its next call
        is not queued yet)."""
        return (
            bool(self._queue)
            or self._ready is not None
            or self.failure is not None
            or self._stopping
        )

    def _idle(self) -> bool:
        return not self._queue and self._ready is None and not self._busy() and not self._planning

    def _busy(self) -> bool:
        return self._writing is not None or self._recovery is not None

    def _fits(self, batch: Batch) -> bool:
        return batch.count + len(self._queue[0].contexts) <= self._cfg.max_batch_messages

    async def _plan_next(self) -> None:
        """Plan a new batch of what is queued; start it if nothing is in flight."""
        self._planning = True
        try:
            if self._shared:
                # Let producers woken by the previous batch queue their next
                # messages first, so they share this backend append.
                await asyncio.sleep(0)
            batch = Batch()
            await self._plan_more(batch)
        finally:
            self._planning = False
            if self._queue:
                self._wake()
        if not batch.requests:
            return
        if self._busy() or self.failure is not None:
            self._ready = batch
        else:
            self._launch(batch)

    async def _extend(self, ready: Batch) -> None:
        """Add what arrived meanwhile to the waiting batch, if it fits."""
        self._extending = self._planning = True
        try:
            await self._plan_more(ready)
        finally:
            self._extending = self._planning = False
        if self._ready is ready and not self._busy() and self.failure is None:
            self._ready = None
            self._launch(ready)

    async def _plan_more(self, batch: Batch) -> None:
        """Take the queued requests that fit into ``batch`` and plan them."""
        taken: list[Request] = []
        count = 0
        room = self._cfg.max_batch_messages - batch.count
        while self._queue and (
            count + len(self._queue[0].contexts) <= room
            # A request larger than the limit still goes, alone.
            or (not count and not batch.count)
        ):
            request = self._queue.popleft()
            count += len(request.contexts)
            taken.append(request)
            if count >= room:
                break
        if not taken:
            return
        writes = persists(taken)
        planned = taken
        if writes and self._ride and count < room:
            planned = [*taken, self._riding_tick()]
            count += 1
        try:
            # A whole record batch takes a timetick per message.
            first = await self._tso.allocate(
                ticks_needed(planned) if self._stamp.batches else count
            )
        except asyncio.CancelledError:
            self._queue.extendleft(reversed(taken))  # planned later, or failed by abort()
            raise
        except errors.HeadraceError as exc:
            settle_failed(planned, exc)
            resolve(planned)
            return
        stamp = self._stamp
        ticked = not stamp.dirty
        plan(batch, planned, first, stamp)
        if ticked and stamp.dirty and self.on_unticked is not None:
            self.on_unticked()
        if not stamp.dirty:
            self._ride = False  # the log's last tick or fence follows every data record
        if writes:
            self.writes_planned += 1
        batch.requests += planned
        batch.count += count

    def _riding_tick(self) -> Request:
        """The TIME_TICK :meth:`advance` asked for, planned behind this batch's data."""
        ctx = system_context(MessageType.TIME_TICK, self._cfg.tick_properties())
        return Request([ctx], asyncio.get_running_loop().create_future(), Persist.AFTER_DATA)

    def _fail_pending(self, error: errors.HeadraceError) -> None:
        """Fail the waiting batch and everything queued."""
        ready, self._ready = self._ready, None
        requests = list(self._queue)
        self._queue.clear()
        if ready is not None:
            requests = ready.requests + requests
        settle_failed(requests, error)
        resolve(requests)

    # -- appends -----------------------------------------------------------

    def _launch(self, batch: Batch) -> None:
        """Start the backend append of ``batch`` (nothing is in flight)."""
        self._shared = len(batch.requests) > 1
        self._writing = batch
        on_done = functools.partial(self._written, batch)
        if batch.records:
            ids = self._writer.next_ids(len(batch.records))
            if ids is not None:
                # The bookkeeping is done before the append starts, not while
                # the backend's I/O thread starts up: that thread needs the
                # GIL to reach its system call, so work here would delay the
                # write by as much. It is published only once the append ends.
                settle_early(batch, ids)
            self._write_future = self._writer.start_append_stamped(batch.records, on_done)
        else:
            future: asyncio.Future[list[MessageID]] = asyncio.get_running_loop().create_future()
            future.set_result([])
            future.add_done_callback(on_done)
            self._write_future = future

    def _written(self, batch: Batch, future: asyncio.Future[list[MessageID]]) -> None:
        """The backend append of ``batch`` ended: start the next, then settle this one."""
        if self._writing is not batch:
            return  # abort() answered its callers already
        self._writing = self._write_future = None
        requests = batch.requests
        error = (
            errors.Closed("the WAL closed during the append; outcome unknown")
            if future.cancelled()
            else future.exception()
        )
        deferred: Batch | None = None
        if error is None:
            ready = self._ready
            if ready is not None and not self._extending:
                if ready.count * 2 < self._cfg.max_batch_messages:
                    # Less than half full (a lone sync tick, say): started once
                    # the producers this append releases had their turn, so
                    # their next messages ride in it instead of waiting for an
                    # append of their own.
                    deferred = ready
                else:
                    self._ready = None
                    self._launch(ready)
            ids = future.result()
            early = batch.early
            if early is not None and early.ids is ids:
                columns = early.columns
            else:
                unsettle(batch)
                columns = settle(batch, ids, self.last_id)
            entries, timeticks = columns.entries, columns.timeticks
            if entries:
                tail = entries[-1]
                last_id = tail.last_id if type(tail) is BatchEntry else end_of(tail).id
                assert last_id is not None
                self.last_id = last_id
                if batch.records:
                    self.progress.appended(last_id, timeticks[-1], sum(map(len, batch.records)))
            self.appended_total += len(batch.records)
            self._buffer.extend_columns(entries, timeticks, columns.sizes, columns.persisted)
        elif isinstance(error, errors.Fenced):
            unsettle(batch)
            self.failure = error
            settle_failed(requests, error)
        elif isinstance(error, errors.HeadraceError):
            unsettle(batch)
            self._stamp.dirty = True
            settle_failed(requests, error)
            self._recovery = guarded_task(
                self._recover(),
                f"wal-recovery-{self._cfg.pchannel}",
                self.on_task_failure,
                finishable=True,
                logger=log,
            )
        else:  # a backend bug must not stop the WAL silently
            unsettle(batch)
            self.failure = errors.HeadraceError(f"backend append failed unexpectedly: {error!r}")
            settle_failed(requests, self.failure)
        resolve(requests)
        if self._loop_due():
            self._wake()
        if deferred is not None:
            # Scheduled after the callers' wake-ups and the planning loop's.
            asyncio.get_running_loop().call_soon(self._launch_ready, deferred)

    def _launch_ready(self, ready: Batch) -> None:
        """Start the waiting batch unless it was started or extended meanwhile."""
        if self._ready is ready and not (self._extending or self._busy() or self.failure):
            self._ready = None
            self._launch(ready)

    async def _recover(self) -> None:
        try:
            await self._after_failed_append()
        finally:
            self._recovery = None
            ready = self._ready
            if ready is not None and not self._extending and self.failure is None:
                self._ready = None
                self._launch(ready)
            self._wake()

    async def _after_failed_append(self) -> None:
        """Find out whether a failed append wrote anything; if so, reset the buffer."""
        try:
            record = await self._cfg.resync()
        except errors.HeadraceError as exc:
            self.failure = errors.Unavailable(
                f"cannot tell what the backend holds after a failed append: {exc}"
            )
            return
        if record is None:
            return
        try:
            last_id, msg = records.last_entry(record.id, record.data)
        except errors.CorruptData as exc:
            self.failure = exc
            return
        if last_id == self.last_id:
            return
        self.last_id = last_id
        self._stamp.last_timetick = max(self._stamp.last_timetick, msg.timetick)
        self._buffer.reset(Position(last_id, msg.timetick))

"""Timetick assignment, group commit, and timetick sync: the innermost stage.

One appender loop per WAL takes every queued message (up to the batch
limit), gives them timeticks from the TSO in order (never below the last one
plus one, so timeticks strictly increase in log order even if the TSO goes
backwards), stamps the term, writes them with a single backend append, then
settles every caller's context and feeds the write-ahead buffer. Concurrent
producers therefore share backend appends. The loop plans (timeticks,
encoding) the next batch while the previous one is being written; backend
appends never overlap.

The sync task asks for a TIME_TICK every interval. The loop persists it only
if data was persisted since the last persisted tick or fence; otherwise the
tick goes only to the buffer, carrying the last persisted message's id, so
tail readers see progress without the log filling with empty ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import deque
from collections.abc import Awaitable, Callable, Mapping

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import TimestampAllocator
from headrace.wal.api import AppendResult
from headrace.wal.buffer import Position, WriteAheadBuffer
from headrace.wal.contract import BackendWriter, Record
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.interceptors.txn import TXN_ID_BYTES

_SYSTEM = frozenset((MessageType.TIME_TICK, MessageType.FENCE))


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


class _Request:
    __slots__ = ("contexts", "future", "sync_tick")

    def __init__(
        self, contexts: list[AppendContext], future: asyncio.Future[None], sync_tick: bool
    ) -> None:
        self.contexts = contexts
        self.future = future
        self.sync_tick = sync_tick


_Planned = tuple[AppendContext, Message, int, bool]
"""(context, stamped message, encoded size, persisted)"""


class _Batch:
    """Requests planned for one backend append."""

    __slots__ = ("count", "plan", "records", "requests")

    def __init__(self) -> None:
        self.requests: list[_Request] = []
        self.plan: list[_Planned] = []
        self.records: list[bytes] = []
        self.count = 0


def _resolve(requests: list[_Request]) -> None:
    for request in requests:
        if not request.future.done():
            request.future.set_result(None)


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
        self.last_timetick = last.timetick
        self.last_id: MessageID | None = last.id
        self.appended_total = 0
        self.failure: errors.HeadraceError | None = None
        """Set once the WAL can no longer write (fenced, backend state unknown)."""
        self._dirty = False
        self._queue: deque[_Request] = deque()
        self._wakeup: asyncio.Future[None] | None = None
        self._stopping = False
        self._task: asyncio.Task[None] | None = None
        self._writing: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"wal-appender-{self._cfg.pchannel}"
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
        for task in (self._writing, self._task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._fail_queued(self.failure or errors.Closed("the WAL was closed"))

    async def write(self, batch: list[AppendContext]) -> None:
        """Queue ``batch`` and wait until every context is settled."""
        await self._submit(batch, sync_tick=False)

    async def tick(self, *, sync: bool) -> None:
        """Write a TIME_TICK (only to the buffer if ``sync`` and nothing new was persisted)."""
        ctx = system_context(MessageType.TIME_TICK, self._cfg.tick_properties())
        await self._submit([ctx], sync_tick=sync)
        if ctx.error is not None:
            raise ctx.error

    async def fence(self) -> AppendResult:
        """Write the FENCE that opens this term."""
        ctx = system_context(MessageType.FENCE, self._cfg.tick_properties())
        await self._submit([ctx], sync_tick=False)
        if ctx.error is not None:
            raise ctx.error
        assert ctx.result is not None
        return ctx.result

    async def _submit(self, batch: list[AppendContext], *, sync_tick: bool) -> None:
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
            self._queue.append(_Request(batch[i : i + step], fut, sync_tick))
            futures.append(fut)
        self._wake()
        for fut in futures:
            # A cancelled caller cancels only its future; the loop still writes
            # the batch (it may be durable, it is just not acknowledged).
            await fut

    def _wake(self) -> None:
        wakeup = self._wakeup
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)

    async def _run(self) -> None:
        """Plan batches in order; write each once the previous write finished.

        Planning (timeticks, encoding) of the next batch overlaps the backend
        write of the previous one; what arrives meanwhile joins the batch if
        it fits. Writes themselves never overlap.
        """
        loop = asyncio.get_running_loop()
        try:
            while True:
                if not self._queue:
                    if self._stopping:
                        return
                    self._wakeup = loop.create_future()
                    await self._wakeup
                    continue
                # Let producers woken by the previous batch queue their next
                # messages first, so they share this backend append.
                await asyncio.sleep(0)
                batch = _Batch()
                await self._plan_more(batch)
                if self._writing is not None and not self._writing.done():
                    await self._writing
                    await self._plan_more(batch)
                if not batch.requests:
                    continue
                if self.failure is not None:
                    self._settle_failed(batch.requests, self.failure)
                    _resolve(batch.requests)
                    self._fail_queued(self.failure)
                    return
                self._writing = loop.create_task(self._write(batch))
        finally:
            if self._writing is not None:
                await self._writing

    async def _plan_more(self, batch: _Batch) -> None:
        """Take the queued requests that fit into ``batch`` and plan them."""
        taken: list[_Request] = []
        count = 0
        room = self._cfg.max_batch_messages - batch.count
        while self._queue and (count + len(self._queue[0].contexts) <= room or not batch.count):
            request = self._queue.popleft()
            count += len(request.contexts)
            taken.append(request)
            if count >= room:
                break
        if not taken:
            return
        try:
            first = await self._tso.allocate(count)
        except errors.HeadraceError as exc:
            self._settle_failed(taken, exc)
            _resolve(taken)
            return
        plan, records = self._plan(taken, first)
        batch.requests += taken
        batch.plan += plan
        batch.records += records
        batch.count += count

    def _fail_queued(self, error: errors.HeadraceError) -> None:
        while self._queue:
            request = self._queue.popleft()
            for ctx in request.contexts:
                if not ctx.settled:
                    ctx.fail(error)
            if not request.future.done():
                request.future.set_result(None)

    def _plan(self, requests: list[_Request], first: int) -> tuple[list[_Planned], list[bytes]]:
        """Timeticks, term and encoding for a batch; what to persist, in order."""
        term = self._cfg.term
        tt = self.last_timetick
        dirty = self._dirty
        encode = codec.encode
        max_bytes = self._cfg.max_message_bytes + TXN_ID_BYTES
        i = first
        plan: list[_Planned] = []
        records: list[bytes] = []
        for request in requests:
            for ctx in request.contexts:
                tt = i if i > tt else tt + 1
                i += 1
                m = ctx.message
                kind = m.type
                stamped = Message(kind, m.vchannel, m.payload, m.properties, tt, term, m.txn_id)
                if kind in _SYSTEM and request.sync_tick and not dirty:
                    plan.append((ctx, stamped, ctx.size, False))
                    continue
                try:
                    data = encode(stamped, max_bytes)
                except errors.HeadraceError as exc:
                    ctx.fail(exc)
                    continue
                dirty = kind not in _SYSTEM
                records.append(data)
                plan.append((ctx, stamped, len(data), True))
        self.last_timetick = tt
        self._dirty = dirty
        return plan, records

    async def _write(self, batch: _Batch) -> None:
        requests = batch.requests
        try:
            ids = await self._writer.append(batch.records) if batch.records else []
        except errors.Fenced as exc:
            self.failure = exc
            self._settle_failed(requests, exc)
        except errors.HeadraceError as exc:
            self._dirty = True
            self._settle_failed(requests, exc)
            await self._after_failed_append()
        except Exception as exc:  # a backend bug must not kill the loop silently
            self.failure = errors.HeadraceError(f"backend append failed unexpectedly: {exc!r}")
            self._settle_failed(requests, self.failure)
        else:
            self._settle(batch.plan, ids)
        finally:
            # Also when cancelled by abort(): every caller gets an answer.
            self._settle_failed(
                requests, errors.Closed("the WAL closed during the append; outcome unknown")
            )
            _resolve(requests)

    def _settle(self, plan: list[_Planned], ids: list[MessageID]) -> None:
        entries: list[tuple[LogEntry, int, bool]] = []
        it = iter(ids)
        last_id = self.last_id
        for ctx, msg, size, persisted in plan:
            if persisted:
                last_id = next(it)
            assert last_id is not None, "a sync tick before any persisted record"
            ctx.result = AppendResult(last_id, msg.timetick, msg.term, msg.txn_id)
            entries.append((LogEntry(last_id, msg), size, persisted))
        self.last_id = last_id
        self.appended_total += len(ids)
        self._buffer.extend(entries)

    @staticmethod
    def _settle_failed(requests: list[_Request], error: errors.HeadraceError) -> None:
        for request in requests:
            for ctx in request.contexts:
                if not ctx.settled:
                    ctx.fail(error)

    async def _after_failed_append(self) -> None:
        """Find out whether a failed append wrote anything; if so, reset the buffer."""
        try:
            record = await self._cfg.resync()
        except errors.HeadraceError as exc:
            self.failure = errors.Unavailable(
                f"cannot tell what the backend holds after a failed append: {exc}"
            )
            return
        if record is None or record.id == self.last_id:
            return
        try:
            msg = codec.decode(record.data)
        except errors.CorruptData as exc:
            self.failure = exc
            return
        self.last_id = record.id
        self.last_timetick = max(self.last_timetick, msg.timetick)
        self._buffer.reset(Position(record.id, msg.timetick))


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
        self._writing: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="wal-timetick-sync")

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

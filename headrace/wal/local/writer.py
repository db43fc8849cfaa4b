"""The local WAL writer: group commit, segment rolling and fencing checks.

Concurrent ``append`` calls queue up; when no write is in flight, everything
queued goes to the writer's own I/O thread at once (one wake-up of the thread
and one of the event loop per write, whatever the number of calls), which
writes the frame headers and the records as they are with one ``pwritev`` (no
copy into one buffer; a record batch stamped but not joined yet goes as its
parts, see :class:`~headrace.message.batch.Stamped`), syncs once (``O_DSYNC``,
or ``fdatasync``: the file's new size is synced with the data) and then
re-reads the term file through a descriptor it keeps, comparing its bytes with
the writer's own identity (term and epoch, see :mod:`.fence`). Only if it still
holds that identity are the callers acknowledged: a new owner, even one of the
same term, stores its identity before measuring the log, so every acknowledged
byte lies below what it measured. The next queued write starts as the previous
one is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import NamedTuple

from headrace import errors
from headrace.message.batch import Stamped
from headrace.message.ids import MessageID
from headrace.wal.contract import BackendWriter
from headrace.wal.iothread import IOThread, answer
from headrace.wal.local import fence, files, segment, space
from headrace.wal.local.channel import Channel
from headrace.wal.local.fence import Fence
from headrace.wal.local.segment import SegmentHeader, SegmentName


@dataclasses.dataclass(frozen=True, slots=True)
class WriterSettings:
    fsync: str
    """``batch``: sync every write before acknowledging it; ``interval``:
    appends wait for the next periodic sync, so many calls share one."""
    fsync_interval: float
    segment_bytes: int
    reserve_bytes: int | None = None
    """Free space the writer leaves on the file system (None: :func:`space.default_reserve`)."""

    @property
    def sync_writes(self) -> bool:
        """Segments are opened so that each write is durable when it returns."""
        return self.fsync == "batch" and files.SYNC_WRITES != 0


@dataclasses.dataclass(slots=True)
class OpenSegment:
    """The segment a writer appends to: acknowledged length and next LSN."""

    name: SegmentName
    fd: int
    length: int
    next_lsn: int
    path: str
    """The segment file's path (for messages)."""
    version: int
    """The segment's format (its frames' checksum); the writer's next segments keep it."""


BATCH_BYTES = 8 * 1024 * 1024
"""Group commit writes at most about this much at once (one call is never split)."""

_Future = asyncio.Future[list[MessageID]]
_OnDone = Callable[[_Future], None] | None
_Announced = tuple[int, list[MessageID]]
"""Ids announced for a call: its first LSN and the ids."""
_Pending = tuple[list[bytes | Stamped], _Future, _OnDone, _Announced | None]
"""Records of one call, its future and callback, and the ids announced for it."""


class _Write(NamedTuple):
    """One write for the I/O thread: the frames of the calls in ``batch``."""

    parts: list[bytes | memoryview]
    """Frame headers and record bodies, in order (see :func:`segment.frame_parts`)."""
    size: int
    """Bytes of ``parts``."""
    records: int
    """Records written."""
    batch: list[_Pending]


class LocalWriter(BackendWriter):
    def __init__(
        self,
        channel: Channel,
        identity: Fence,
        current: OpenSegment,
        settings: WriterSettings,
        on_close: Callable[[LocalWriter], None],
    ) -> None:
        self.pchannel = channel.pchannel
        self.fence = identity
        """This writer's identity; it acknowledges only while the term file holds it."""
        self.term = identity.term
        self._identity = fence.encode(identity)
        """The term file's bytes while this writer holds it."""
        self._channel = channel
        self._segment = current
        self._settings = settings
        self._interval = settings.fsync == "interval"
        """Appends wait for the next periodic sync (see :class:`WriterSettings`)."""
        self._sync_after_write = not settings.sync_writes
        """Writes are followed by ``fdatasync`` (the segment is not opened with O_DSYNC)."""
        self._on_close = on_close
        self._queue: list[_Pending] = []
        self._busy = False
        """A write is in flight (or, with interval fsync, scheduled)."""
        self._idle: asyncio.Future[None] | None = None
        """Resolved when the writer next has nothing queued or in flight."""
        self._io: IOThread[_Write] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._failure: errors.HeadraceError | None = None
        self._closing = False
        self._last_sync = 0.0
        self._announced: _Announced | None = None
        """Ids :meth:`next_ids` announced for the next call."""
        self._names = {current.name}
        self._space = space.SpaceGuard(channel.directory, settings.reserve_bytes)
        """Segments this writer created (to recognise its own ``channel.active``)."""
        self._publish(current.name, current.length, current.next_lsn)

    def _publish(self, name: SegmentName, length: int, next_lsn: int) -> None:
        """Tell same-process readers how far this writer's segment is acknowledged."""
        self._names.add(name)
        self._channel.active = (name, length, next_lsn)

    def _unpublish(self) -> None:
        active = self._channel.active
        if active is not None and active[0] in self._names:
            self._channel.active = None

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        return await self.start_append_stamped(records)

    def next_ids(self, count: int) -> list[MessageID] | None:
        """The LSNs the next call gets, if it starts a write at once (nothing queued)."""
        self._announced = None
        if self._busy or self._queue or self._refusal() is not None or count < 1:
            return None
        ids = segment.lsn_ids(self._segment.next_lsn, count)
        self._announced = (self._segment.next_lsn, ids)
        return ids

    def start_append(self, records: Sequence[bytes], on_done: _OnDone = None) -> _Future:
        """Queue ``records`` and start writing them now if no write is in flight.

        ``on_done`` runs right when the write's outcome is set.
        """
        return self.start_append_stamped(records, on_done)

    def start_append_stamped(
        self, records: Sequence[bytes | Stamped], on_done: _OnDone = None
    ) -> _Future:
        """:meth:`start_append`; a stamped batch not joined yet is written as
        its parts (one ``pwritev`` takes them as they are: no copy)."""
        loop = asyncio.get_running_loop()
        future: _Future = loop.create_future()
        announced, self._announced = self._announced, None
        refusal = self._refusal()
        data = _as_bytes(records) if refusal is None else []
        if refusal is None and data and max(map(len, data)) > segment.MAX_RECORD_BYTES:
            refusal = errors.MessageTooLarge(
                f"record of {max(map(len, data))} bytes exceeds the local WAL limit of "
                f"{segment.MAX_RECORD_BYTES} bytes; nothing was written"
            )
        if refusal is not None or not data:
            if refusal is not None:
                future.set_exception(refusal)
            else:
                future.set_result([])
            if on_done is not None:
                future.add_done_callback(on_done)
            return future
        if announced is not None and (
            self._busy
            or self._queue
            or announced[0] != self._segment.next_lsn
            or len(announced[1]) != len(data)
        ):
            announced = None
        self._queue.append((data, future, on_done, announced))
        if not self._busy:
            self._loop = loop
            self._dispatch()
        return future

    def _refusal(self) -> errors.HeadraceError | None:
        if self._failure is not None:
            return self._failure.with_traceback(None)
        if self._closing:
            return errors.Closed(f"writer of pchannel {self.pchannel} (term {self.term}) is closed")
        return None

    def _dispatch(self) -> None:
        """Start the next write of what is queued (on the event loop)."""
        loop = self._loop
        assert loop is not None
        if self._interval:
            delay = self._last_sync + self._settings.fsync_interval - loop.time()
            if delay > 0:
                # Appends wait for the next periodic sync and share it.
                self._busy = True
                loop.call_later(delay, self._dispatch_now)
                return
        self._dispatch_now()

    def _dispatch_now(self) -> None:
        batch, size = self._take_batch()
        if not batch:
            self._busy = False
            self._set_idle()
            return
        self._busy = True
        bodies = batch[0][0] if len(batch) == 1 else [b for data, _, _, _ in batch for b in data]
        # Framed here, so the I/O thread holds the GIL only around its system
        # calls (framed there, a 64 KiB batch's checksum took longer: its bytes
        # are in this core's cache, just checked). Only one write is in
        # flight: the next LSN is settled.
        parts = segment.frame_parts(self._segment.next_lsn, bodies, self._segment.version)
        if self._io is None:
            self._io = IOThread(f"wal-writer-{self.pchannel}", self._run_write)
        self._io.submit(_Write(parts, size + segment.FRAME_SIZE * len(bodies), len(bodies), batch))

    def _run_write(self, write: _Write) -> None:
        """Write, then hand the outcome to the event loop (in the I/O thread)."""
        loop = self._loop
        assert loop is not None
        try:
            first, error = self._write(write), None
        except BaseException as exc:
            first, error = 0, exc
        answer(loop, self._completed, write.batch, first, error)

    def _completed(self, batch: list[_Pending], first: int, error: BaseException | None) -> None:
        """Answer the callers of a finished write and start the next (on the event loop)."""
        loop = self._loop
        assert loop is not None
        answered: list[tuple[_Future, Callable[[_Future], None]]] = []
        if error is not None:
            failure = (
                error
                if isinstance(error, errors.HeadraceError)
                else errors.Unavailable(f"appending to pchannel {self.pchannel}: {error}")
            )
            for _, future, on_done, _ in batch:
                if not future.done():
                    future.set_exception(failure)
                    if on_done is not None:
                        answered.append((future, on_done))
        else:
            if self._interval:
                self._last_sync = loop.time()
            current = self._segment
            self._publish(current.name, current.length, current.next_lsn)
            lsn = first
            for data, future, on_done, announced in batch:
                if not future.done():
                    ids = (
                        announced[1]
                        if announced is not None and announced[0] == lsn
                        else segment.lsn_ids(lsn, len(data))
                    )
                    future.set_result(ids)
                    if on_done is not None:
                        answered.append((future, on_done))
                lsn += len(data)
        self._channel.notify()
        if self._queue:
            self._dispatch()
        else:
            self._busy = False
            self._set_idle()
        for future, on_done in answered:
            try:
                on_done(future)
            except Exception as exc:  # a caller's callback must not stop the writer
                loop.call_exception_handler(
                    {"message": "append callback failed", "exception": exc, "future": future}
                )

    def _set_idle(self) -> None:
        idle, self._idle = self._idle, None
        if idle is not None and not idle.done():
            idle.set_result(None)

    async def _wait_idle(self) -> None:
        """Wait until nothing is queued or in flight."""
        while self._busy or self._queue:
            if self._idle is None:
                self._idle = asyncio.get_running_loop().create_future()
            if not self._busy:
                self._loop = asyncio.get_running_loop()
                self._dispatch()
                continue
            await asyncio.shield(self._idle)

    def _take_batch(self) -> tuple[list[_Pending], int]:
        """Queued calls for one write: all of them, up to about BATCH_BYTES,
        and the bytes of their records."""
        size, count = 0, 0
        for data, _, _, _ in self._queue:
            if count and size >= BATCH_BYTES:
                break
            size += sum(map(len, data))
            count += 1
        batch, self._queue = self._queue[:count], self._queue[count:]
        return batch, size

    def _check_fence(self) -> None:
        if self._channel.term_bytes() == self._identity:
            return
        stored = self._channel.fence()
        if stored != self.fence:
            self._fail(
                fence.fenced_error(
                    self.pchannel, self.fence, stored, "this write was not acknowledged"
                )
            )

    def _fail(self, failure: errors.HeadraceError) -> None:
        self._failure = failure
        self._unpublish()
        raise failure

    def _write(self, write: _Write) -> int:
        """Write framed records, sync, check the fence; the first LSN (blocking)."""
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        current = self._segment
        if current.length >= self._settings.segment_bytes:
            current = self._roll()
        try:
            self._space.check(write.size, current.path)
            files.write_parts(current.fd, write.parts, write.size, current.length)
            if self._sync_after_write:
                files.sync_data(current.fd)
        except OSError as exc:
            self._cut_back(current, exc)
        self._check_fence()
        first = current.next_lsn
        current.length += write.size
        current.next_lsn += write.records
        return first

    def _cut_back(self, current: OpenSegment, exc: OSError) -> None:
        """After a failed write: cut the file back to what was acknowledged."""
        path = current.path
        failure = files.storage_error(exc, f"appending to {path}")
        self._check_fence()
        try:
            os.ftruncate(current.fd, current.length)
            files.sync_data(current.fd)
        except OSError as cut_exc:
            self._fail(
                errors.Unavailable(
                    f"{failure.message}; cutting {path} back to {current.length} bytes also "
                    f"failed ({cut_exc}); reopen the writer"
                )
            )
        raise failure

    def _roll(self) -> OpenSegment:
        """Start the next segment; the old one ends at its acknowledged length."""
        old = self._segment
        directory = self._channel.directory
        name = SegmentName(old.next_lsn, self.fence.term, self.fence.epoch)
        # Published before the file exists, so readers of this process never
        # read the new segment past what this writer acknowledged.
        self._publish(name, segment.HEADER_SIZE, old.next_lsn)
        try:
            fd = files.create_segment(
                directory,
                SegmentHeader(name, old.name, old.length, old.version),
                sync_writes=self._settings.sync_writes,
            )
        except errors.CorruptData:
            self._publish(old.name, old.length, old.next_lsn)
            raise
        except OSError as exc:
            self._publish(old.name, old.length, old.next_lsn)
            raise files.storage_error(exc, f"creating a segment in {directory}") from None
        new = OpenSegment(
            name,
            fd,
            segment.HEADER_SIZE,
            old.next_lsn,
            os.path.join(directory, name.filename),
            old.version,
        )
        try:
            # A fenced writer leaves its new, empty segment in place: a new owner
            # may already have chained to it, and it holds no records. Its
            # identity is older than the new owner's, so it never becomes the
            # head of the chain.
            self._check_fence()
        except errors.Fenced:
            os.close(fd)
            raise
        self._segment = new
        os.close(old.fd)
        return new

    async def supersede(self, failure: errors.HeadraceError) -> None:
        """A newer writer of this process takes over: finish the write in flight
        (its callers are answered before the new writer measures the log) and
        fail every later append with ``failure``."""
        if self._failure is None:
            self._failure = failure
        await self._shutdown()

    async def close(self) -> None:
        if self._failure is None and not self._closing:
            self._closing = True
            await self._wait_idle()
            self._failure = errors.Closed(
                f"writer of pchannel {self.pchannel} (term {self.term}) is closed"
            )
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._closing = True
        await self._wait_idle()
        if self._io is not None:
            self._io.stop()
            self._io = None
        if self._segment.fd < 0:
            return
        self._unpublish()
        with contextlib.suppress(OSError):
            os.close(self._segment.fd)
        self._segment.fd = -1
        self._channel.notify()
        self._on_close(self)


def _as_bytes(records: Sequence[bytes | Stamped]) -> list[bytes | Stamped]:
    """``records`` as a list of bytes objects and stamped batches (any other
    buffer is copied: the caller may change it before the write)."""
    data = records if type(records) is list else list(records)
    for body in data:
        if type(body) is not bytes and type(body) is not Stamped:
            return [r if isinstance(r, Stamped) else bytes(r) for r in records]
    return data

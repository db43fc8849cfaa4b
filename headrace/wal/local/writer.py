"""The local WAL writer: group commit, segment rolling and fencing checks.

Concurrent ``append`` calls queue up; one flusher task takes everything
queued, writes it with one ``pwrite``, syncs once and then re-reads the term
file. Only if no higher term is stored are the callers acknowledged: a new
owner stores its term before measuring the log, so every acknowledged byte
lies below what it measured. Blocking I/O runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
from collections.abc import Callable, Sequence

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.contract import BackendWriter
from headrace.wal.local import files, segment
from headrace.wal.local.channel import Channel
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.segment import SegmentHeader, SegmentName


@dataclasses.dataclass(frozen=True, slots=True)
class WriterSettings:
    fsync: str
    """``batch``: sync every write before acknowledging it; ``interval``:
    appends wait for the next periodic sync, so many calls share one."""
    fsync_interval: float
    segment_bytes: int


@dataclasses.dataclass(slots=True)
class OpenSegment:
    """The segment a writer appends to: acknowledged length and next LSN."""

    name: SegmentName
    fd: int
    length: int
    next_lsn: int


BATCH_BYTES = 8 * 1024 * 1024
"""Group commit writes at most about this much at once (one call is never split)."""

_Pending = tuple[list[bytes], "asyncio.Future[list[MessageID]]"]


class LocalWriter(BackendWriter):
    def __init__(
        self,
        channel: Channel,
        term: int,
        current: OpenSegment,
        settings: WriterSettings,
        on_close: Callable[[LocalWriter], None],
    ) -> None:
        self.pchannel = channel.pchannel
        self.term = term
        self._channel = channel
        self._segment = current
        self._settings = settings
        self._on_close = on_close
        self._queue: list[_Pending] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: errors.HeadraceError | None = None
        self._closing = False
        self._last_sync = 0.0
        self._names = {current.name}
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
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        if self._closing:
            raise errors.Closed(f"writer of pchannel {self.pchannel} (term {self.term}) is closed")
        data = [bytes(record) for record in records]
        for body in data:
            if len(body) > segment.MAX_RECORD_BYTES:
                raise errors.MessageTooLarge(
                    f"record of {len(body)} bytes exceeds the local WAL limit of "
                    f"{segment.MAX_RECORD_BYTES} bytes; nothing was written"
                )
        if not data:
            return []
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[MessageID]] = loop.create_future()
        self._queue.append((data, future))
        self._wake.set()
        if self._task is None:
            self._task = loop.create_task(self._run(), name=f"wal-writer-{self.pchannel}")
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._queue:
                if self._closing:
                    return
                continue
            if self._settings.fsync == "interval":
                delay = self._last_sync + self._settings.fsync_interval - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            batch = self._take_batch()
            bodies = [body for data, _ in batch for body in data]
            try:
                first = await asyncio.to_thread(self._write, bodies)
            except Exception as exc:  # every caller must get an answer
                failure = (
                    exc
                    if isinstance(exc, errors.HeadraceError)
                    else errors.Unavailable(f"appending to pchannel {self.pchannel}: {exc}")
                )
                for _, future in batch:
                    if not future.done():
                        future.set_exception(failure)
                self._channel.notify()
                continue
            self._last_sync = loop.time()
            current = self._segment
            self._publish(current.name, current.length, current.next_lsn)
            self._channel.notify()
            lsn = first
            for data, future in batch:
                if not future.done():
                    future.set_result([LocalMessageID(lsn + i) for i in range(len(data))])
                lsn += len(data)

    def _take_batch(self) -> list[_Pending]:
        """Queued calls for one write: all of them, up to about BATCH_BYTES."""
        size, count = 0, 0
        for data, _ in self._queue:
            if count and size >= BATCH_BYTES:
                break
            size += sum(map(len, data))
            count += 1
        batch, self._queue = self._queue[:count], self._queue[count:]
        if self._queue:
            self._wake.set()
        return batch

    def _check_term(self) -> None:
        stored = self._channel.term()
        if stored > self.term:
            self._fail(
                errors.Fenced(
                    f"pchannel {self.pchannel}: writer of term {self.term} was fenced by "
                    f"term {stored}; this write was not acknowledged",
                    term=self.term,
                    current_term=stored,
                )
            )

    def _fail(self, failure: errors.HeadraceError) -> None:
        self._failure = failure
        self._unpublish()
        raise failure

    def _write(self, bodies: list[bytes]) -> int:
        """Write, sync and check the term; the first LSN (blocking)."""
        if self._failure is not None:
            raise self._failure.with_traceback(None)
        current = self._segment
        if current.length >= self._settings.segment_bytes:
            current = self._roll()
        frames = segment.encode_frames(current.next_lsn, bodies)
        path = os.path.join(self._channel.directory, current.name.filename)
        try:
            files.write_all(current.fd, frames, current.length)
            files.sync_data(current.fd)
        except OSError as exc:
            self._cut_back(current, path, exc)
        self._check_term()
        first = current.next_lsn
        current.length += len(frames)
        current.next_lsn += len(bodies)
        return first

    def _cut_back(self, current: OpenSegment, path: str, exc: OSError) -> None:
        """After a failed write: cut the file back to what was acknowledged."""
        failure = files.storage_error(exc, f"appending to {path}")
        self._check_term()
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
        name = SegmentName(old.next_lsn, self.term, 0)
        # Published before the file exists, so readers of this process never
        # read the new segment past what this writer acknowledged.
        self._publish(name, segment.HEADER_SIZE, old.next_lsn)
        while True:
            try:
                fd = files.create_segment(directory, SegmentHeader(name, old.name, old.length))
                break
            except FileExistsError:
                name = name._replace(seq=name.seq + 1)
                self._publish(name, segment.HEADER_SIZE, old.next_lsn)
            except OSError as exc:
                self._publish(old.name, old.length, old.next_lsn)
                raise files.storage_error(exc, f"creating a segment in {directory}") from None
        new = OpenSegment(name, fd, segment.HEADER_SIZE, old.next_lsn)
        try:
            # A fenced writer leaves its new, empty segment in place: a new owner
            # may already have chained to it, and it holds no records.
            self._check_term()
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
            if self._task is not None:
                self._wake.set()
                await self._task
            self._failure = errors.Closed(
                f"writer of pchannel {self.pchannel} (term {self.term}) is closed"
            )
        await self._shutdown()

    async def _shutdown(self) -> None:
        self._closing = True
        if self._task is not None:
            self._wake.set()
            await self._task
        if self._segment.fd < 0:
            return
        self._unpublish()
        with contextlib.suppress(OSError):
            os.close(self._segment.fd)
        self._segment.fd = -1
        self._channel.notify()
        self._on_close(self)

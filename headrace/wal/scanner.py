"""Scanners: read a WAL from a position, catching up from the backend, then tailing.

A scanner of a WAL this process owns starts in *catch-up* mode, reading the
backend, and switches to *tail* mode (the write-ahead buffer) as soon as the
buffer holds the successor of the last entry it consumed. Positions are
compared by timetick (timeticks strictly increase in log order), so the
switch has no gap and no duplicate, also when a record reaches the backend
reader before it reaches the buffer. If a tail reader's next entry is
evicted from the buffer it falls back to catch-up after the last entry it
consumed. Read-ahead is bounded: one backend batch, or a window into the
buffer, at a time.

A backend scanner (:func:`open_backend_scanner`) reads a WAL it does not own:
catch-up only, waiting at the backend's tail.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable
from typing import Literal, cast

from headrace import errors
from headrace.message import records
from headrace.message.codec import Skipped
from headrace.message.ids import MessageID
from headrace.message.records import BatchEntry, Decoded
from headrace.message.types import LogEntry
from headrace.wal.api import DeliverPolicy, ReadOptions
from headrace.wal.buffer import START, Position, WriteAheadBuffer
from headrace.wal.contract import Backend, BackendReader, StartKind, StartPosition
from headrace.wal.delivery import Delivery
from headrace.wal.interceptors.txn import DEFAULT_MAX_TXN_BYTES

DEFAULT_READ_BATCH = 256
_SWITCH_CHECK_S = 0.05
"""How long a catch-up read waits at the backend's tail before re-checking the buffer."""

Mode = Literal["catchup", "tail"]


class Scanner:
    """Async iterator of :class:`LogEntry`; also an async context manager."""

    def __init__(
        self,
        backend: Backend,
        pchannel: str,
        options: ReadOptions,
        buffer: WriteAheadBuffer | None,
        *,
        batch_size: int = DEFAULT_READ_BATCH,
        max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
        on_corrupt: Callable[[errors.CorruptData], None] | None = None,
    ) -> None:
        """``on_corrupt``: told when the backend finds a damaged record (the
        error is raised to the reader all the same)."""
        self._backend = backend
        self._on_corrupt = on_corrupt
        self._pchannel = pchannel
        self._opts = options
        self._buffer = buffer
        self._batch = max(1, batch_size)
        self._delivery = Delivery(options, max_txn_bytes)
        self._raw: deque[Decoded] = deque()
        """Read but not yet consumed (bounded by one read batch); records the
        delivery's header filter rejects are left undecoded (:class:`Skipped`)."""
        self._raw_accepted = False
        """Whether ``_raw``'s entries without a txn id all pass the delivery's filter."""
        self._ready: list[LogEntry] = []
        """Consumed and deliverable (one entry, or one committed transaction)."""
        self._ready_at = 0
        self._ready_floor = 0
        """Timetick consumed before the entry that made ``_ready`` deliverable."""
        self._reader: BackendReader | None = None
        self._closed = False
        self._mode: Mode = "catchup"
        self._cursor = 0
        self._skip: Skip | None = None
        """Messages of the first record read to drop (a start inside a batch)."""
        self._fallback: StartPosition | None = None
        """Where to read from if the start record turns out truncated, until a
        first record arrives (backends report truncation at open or at the
        first read)."""
        pos, self._start = self._initial_position()
        # The last consumed position, kept unpacked (it changes per entry).
        self._pos_known = pos is not None
        self._pos_id = pos.id if pos is not None else None
        self._pos_tt = pos.timetick if pos is not None else 0
        if buffer is not None and pos is not None:
            seq = buffer.seq_after(pos)
            if seq is not None:
                self._mode, self._cursor = "tail", seq

    def _initial_position(self) -> tuple[Position | None, StartPosition]:
        opts, buf = self._opts, self._buffer
        policy = opts.policy
        if policy is DeliverPolicy.ALL:
            return START, StartPosition.earliest()
        if policy is DeliverPolicy.LATEST:
            if buf is not None:
                pos = buf.last_position()
                return pos, _after(pos.id)
            return None, StartPosition.latest()
        if opts.start_id is None:
            raise errors.InvalidArgument(f"deliver policy {policy.name} needs a start id")
        if policy is DeliverPolicy.START_FROM:
            found = buf.locate_at(opts.start_id) if buf is not None else None
            return found, StartPosition.at(opts.start_id)
        found = buf.locate_after(opts.start_id) if buf is not None else None
        if found is None and opts.timetick_gt is not None:
            # A resume point (id, timetick) of an earlier reader is a position as is.
            found = Position(opts.start_id, opts.timetick_gt)
        return found, StartPosition.after(opts.start_id)

    # -- public API --------------------------------------------------------

    @property
    def mode(self) -> Mode:
        return self._mode

    @property
    def position(self) -> Position | None:
        """The last log entry consumed (delivered, filtered out, or held in a transaction).

        Once everything :meth:`next` returned is handled, a new reader with
        ``START_AFTER(position.id)`` and ``timetick_gt=position.timetick``
        continues exactly here, except for transactions open at this point
        (their earlier messages are behind the position). None while unknown
        (a start id not reached yet).
        """
        return Position(self._pos_id, self._pos_tt) if self._pos_known else None

    def resume_options(self) -> ReadOptions:
        """Options for a new scanner that continues right after what :meth:`next` returned.

        Exact, also with transactions held back at this point (the new
        scanner starts at the oldest one's BEGIN_TXN and skips, by timetick,
        what was already delivered). A transaction returned only in part is
        delivered again in full.
        """
        opts = self._opts
        if not self._pos_known:
            return opts
        floor = self._pos_tt
        starts = []
        if self._ready_at < len(self._ready):
            floor = self._ready_floor
            starts.append(self._ready[0].id)
        oldest = self._delivery.oldest_open()
        if oldest is not None:
            starts.append(oldest.id)
        floor = max(floor, 0 if opts.timetick_gt is None else opts.timetick_gt)
        if starts:
            policy, start_id = DeliverPolicy.START_FROM, min(starts)
        elif self._pos_id is not None:
            policy, start_id = DeliverPolicy.START_AFTER, self._pos_id
        else:
            policy, start_id = DeliverPolicy.ALL, None
        return dataclasses.replace(opts, policy=policy, start_id=start_id, timetick_gt=floor)

    async def next(self, timeout: float | None = None) -> LogEntry | None:
        """The next entry; None if ``timeout`` seconds pass first.

        Raises :class:`errors.Closed` once the scanner is closed, or when the
        WAL stopped serving and everything it wrote was delivered (resume on
        the new owner from :attr:`position`).
        """
        ready, at = self._ready, self._ready_at
        if at < len(ready) and not self._closed:
            self._ready_at = at + 1
            return ready[at]
        got = await self.next_many(1, timeout)
        return got[0] if got else None

    async def next_many(
        self,
        max_entries: int = DEFAULT_READ_BATCH,
        timeout: float | None = None,
    ) -> list[LogEntry]:
        """The next entries, at most ``max_entries``: what as many :meth:`next` calls
        would return, waiting only for the first; [] if ``timeout`` passes first.

        It returns what was already read once at least one entry is there
        (never waiting for more), so a caller can forward entries in batches.
        Errors as :meth:`next`.
        """
        out: list[LogEntry] = []
        await self._next(out, max_entries, timeout, units=False)
        return out

    async def next_units(
        self,
        max_entries: int = DEFAULT_READ_BATCH,
        timeout: float | None = None,
    ) -> list[LogEntry | BatchEntry]:
        """:meth:`next_many`, with record batches whose every message is
        delivered as they stand given as one :class:`BatchEntry` (counted as
        its messages against ``max_entries``; a batch larger than that comes
        alone). Messages of a batch the reader takes only in part (filters, a
        start inside it, transactions held back) come as entries."""
        out: list[LogEntry | BatchEntry] = []
        await self._next(out, max_entries, timeout, units=True)
        return out

    async def _next(
        self,
        out: list[LogEntry] | list[LogEntry | BatchEntry],
        max_entries: int,
        timeout: float | None,
        *,
        units: bool,
    ) -> None:
        if max_entries < 1:
            raise errors.InvalidArgument(f"max_entries must be at least 1, got {max_entries}")
        if self._closed:
            raise errors.Closed("the scanner was closed")
        self._take(out, max_entries, units)
        if out:
            return
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        waited = False
        while True:
            remaining = None if deadline is None else max(0.0, deadline - loop.time())
            if remaining == 0.0 and waited:
                return
            waited = not await self._step(remaining)
            self._take(out, max_entries, units)
            if out:
                return

    async def open(self) -> None:
        """Open the backend reader now if catching up (else on the first read)."""
        if self._mode == "catchup" and self._reader is None:
            start = record_start(self._start)
            opened = await _try_open(self._backend, self._pchannel, start.position)
            if isinstance(opened, errors.Truncated):
                if start.fallback is None:
                    raise await self._named_truncation(opened)
                await self._fall_back(start.fallback)
                return
            self._reader, self._skip, self._fallback = opened, start.skip, start.fallback

    async def _fall_back(self, fallback: StartPosition) -> None:
        """The start record is gone (truncated): open after it, as a start after a
        record always did; nothing of it is left to skip into."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()
        self._skip = self._fallback = None
        try:
            self._reader = await self._backend.open_reader(self._pchannel, fallback)
        except errors.Truncated as exc:
            raise await self._named_truncation(exc) from None

    async def close(self) -> None:
        self._closed = True
        self._ready.clear()
        self._ready_at = 0
        self._raw.clear()
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()

    def __aiter__(self) -> Scanner:
        return self

    async def __anext__(self) -> LogEntry:
        if self._closed:
            raise StopAsyncIteration
        entry = await self.next()
        assert entry is not None
        return entry

    async def __aenter__(self) -> Scanner:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- steps -------------------------------------------------------------

    async def _step(self, remaining: float | None) -> bool:
        """One unit of work; False if it only waited."""
        if self._mode == "tail":
            return await self._tail_step(remaining)
        buf = self._buffer
        if buf is not None and self._pos_known:
            seq = buf.seq_after(Position(self._pos_id, self._pos_tt))
            if seq is not None:
                await self._switch_to_tail(seq)
                return True
        return await self._catchup_step(remaining)

    async def _switch_to_tail(self, seq: int) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.close()
        self._mode, self._cursor = "tail", seq

    async def _tail_step(self, remaining: float | None) -> bool:
        buf = self._buffer
        assert buf is not None
        entries = buf.read(self._cursor, self._batch)
        if entries is None:
            self._mode = "catchup"
            self._start = _after(self._pos_id)
            return True
        if entries:
            self._cursor += len(entries)
            self._raw.extend(entries)
            self._raw_accepted = self._delivery.plain
            return True
        if buf.closed:
            raise errors.Closed("the WAL stopped serving; resume on the pchannel's new owner")
        await buf.wait(self._cursor, remaining)
        return False

    async def _catchup_step(self, remaining: float | None) -> bool:
        wait = remaining
        if self._buffer is not None:
            wait = _SWITCH_CHECK_S if remaining is None else min(remaining, _SWITCH_CHECK_S)
        await self.open()
        assert self._reader is not None
        try:
            block = await self._reader.next_block(self._batch, timeout=wait)
        except errors.Truncated as exc:
            if self._fallback is None:
                raise await self._named_truncation(exc) from None
            await self._fall_back(self._fallback)
            return True
        except errors.CorruptData as exc:
            if self._on_corrupt is not None:
                self._on_corrupt(exc)
            raise
        if not block.ids:
            return False
        self._fallback = None
        # A block the backend verified skips the messages' own CRC (it covers
        # the same bytes); records the filter rejects are not decoded in full.
        decoded = records.decode_block(
            block.data,
            block.bounds,
            block.ids,
            verify=not block.verified,
            keep=self._delivery.header_filter,
            units=True,
        )
        if self._skip is not None:
            decoded = self._past_start(decoded)
        self._raw.extend(decoded)
        self._raw_accepted = True
        return True

    def _past_start(self, decoded: list[Decoded]) -> list[Decoded]:
        """``decoded`` without the messages before the start (see :func:`record_start`)."""
        skip = self._skip
        assert skip is not None
        for i, item in enumerate(decoded):
            if type(item) is BatchEntry and skip.drops(item.id):
                if skip.drops(item.last_id):
                    continue
                # The start is inside this batch: take it apart, and go on there.
                expanded: list[Decoded] = []
                item.expand(self._delivery.header_filter, expanded)
                return self._past_start(expanded + decoded[i + 1 :])
            if not skip.drops(item.id):
                self._skip = None
                return decoded[i:]
        return []

    def _take(
        self, out: list[LogEntry] | list[LogEntry | BatchEntry], room: int, units: bool
    ) -> None:
        """Move up to ``room`` deliverable entries to ``out``, consuming read ones
        (``units``: batches delivered whole stay whole, see :meth:`next_units`).

        Leaves the scanner as ``len(out)`` calls of :meth:`next` would: the
        last delivered group (one entry or one transaction) in ``_ready``, the
        part of it handed out counted by ``_ready_at``.
        """
        ready, at = self._ready, self._ready_at
        if at < len(ready):
            part = ready[at : at + room]
            out += part
            self._ready_at = at + len(part)
            room -= len(part)
        if room > 0 and self._raw:
            self._consume(cast("list[LogEntry | BatchEntry]", out), room, units)

    def _whole(self, unit: BatchEntry, floor: int) -> bool:
        """Whether ``unit`` can be delivered as it stands: no transaction held
        or in it, nothing of it consumed yet, every message accepted."""
        header = unit.header
        return (
            not header.txn_id
            and not self._delivery.held
            and header.base_timetick > floor
            and unit.accepted_whole(self._delivery.header_filter)
        )

    def _pop(self, units: bool, floor: int, room: int, first: bool) -> Decoded | None:
        """The next read entry; a batch stays whole if it can be delivered whole
        (see :meth:`_whole`), else its messages come one by one. None: the
        next is a whole batch larger than ``room`` (it waits for the next
        call, unless it comes ``first``)."""
        raw = self._raw
        entry = raw.popleft()
        while type(entry) is BatchEntry:
            if units and self._whole(entry, floor):
                if room >= entry.count or first:
                    return entry
                raw.appendleft(entry)
                return None
            expanded: list[Decoded] = []
            entry.expand(self._delivery.header_filter, expanded)
            raw.extendleft(reversed(expanded))
            entry = raw.popleft()
        return entry

    def _consume(self, out: list[LogEntry | BatchEntry], room: int, units: bool) -> None:
        """Consume read entries until ``room`` entries went to ``out`` or none are left."""
        raw, delivery, feed = self._raw, self._delivery, self._delivery.feed
        # Entries without a txn id pass as they are while no transaction is
        # held back, if the delivery's filter already accepted them.
        fast = self._raw_accepted
        before = floor = self._pos_tt if self._pos_known else -1
        last_id: MessageID | None = None
        group: list[LogEntry] = []
        ready: list[LogEntry] | None = None
        taken = ready_floor = 0
        while raw and room > 0:
            entry = self._pop(units, floor, room, not out)
            if entry is None:
                break
            if type(entry) is BatchEntry:  # delivered whole
                out.append(entry)
                room -= entry.count
                before, floor = floor, entry.last_timetick
                last_id = entry.last_id
                ready, taken, ready_floor = None, 1, before
                continue
            if isinstance(entry, Skipped):
                if entry.timetick <= floor:
                    continue
                floor = entry.timetick
                last_id = entry.id
                delivery.skip(entry)
                continue
            assert isinstance(entry, LogEntry)
            msg = entry.message
            tt = msg.timetick
            if tt <= floor:
                continue
            before, floor = floor, tt
            last_id = entry.id
            if fast and not msg.txn_id and not delivery.held:
                out.append(entry)
                room -= 1
                ready, taken, ready_floor = None, 1, before
                continue
            feed(entry, group)
            if group:
                taken = len(group) if len(group) <= room else room
                out += group if taken == len(group) else group[:taken]
                room -= taken
                ready, ready_floor = group, before
                group = []
        if last_id is not None:
            self._pos_id, self._pos_tt, self._pos_known = last_id, floor, True
            if taken:
                self._note_ready(out[-1], ready, taken, ready_floor)

    def _note_ready(
        self, last: LogEntry | BatchEntry, group: list[LogEntry] | None, taken: int, floor: int
    ) -> None:
        """Remember the last delivered group (``group``, or ``last`` alone) and
        how much of it was handed out; a batch delivered whole leaves nothing."""
        if type(last) is BatchEntry:
            self._ready, self._ready_at = [], 0
        else:
            assert isinstance(last, LogEntry)
            self._ready = group if group is not None else [last]
            self._ready_at = taken
        self._ready_floor = floor

    async def _named_truncation(self, exc: errors.Truncated) -> errors.Truncated:
        earliest = exc.earliest
        if not earliest:
            first = await self._backend.earliest(self._pchannel)
            earliest = str(first) if first is not None else ""
        return errors.Truncated(
            f"pchannel {self._pchannel}: the requested position was truncated; "
            f"the earliest readable id is {earliest or 'unknown'}",
            earliest=earliest,
        )


def _after(mid: MessageID | None) -> StartPosition:
    return StartPosition.earliest() if mid is None else StartPosition.after(mid)


@dataclasses.dataclass(frozen=True, slots=True)
class Skip:
    """Messages a reader opened at a record drops before its real start."""

    bound: MessageID
    inclusive: bool

    def drops(self, mid: MessageID) -> bool:
        return mid <= self.bound if self.inclusive else mid < self.bound


@dataclasses.dataclass(frozen=True, slots=True)
class RecordStart:
    """Where a backend reader opens for a start position, in records (backends
    know record ids only), and what the scanner then drops."""

    position: StartPosition
    skip: Skip | None = None
    fallback: StartPosition | None = None
    """Where to open instead if ``position``'s record was truncated away."""


def record_start(start: StartPosition) -> RecordStart:
    """The backend start for ``start`` (pure).

    A message of a record batch has an id with an index, and the messages
    after it may be in the same record: a start at or after a message opens
    the backend at its record and drops what comes before. A start after a
    record id (index 0) cannot tell whether that record holds more messages,
    so it opens there too; if that record is gone (truncated) it opens after
    it instead, as it always did.
    """
    mid = start.id
    if mid is None:
        return RecordStart(start)
    record = mid.record_id()
    if start.kind is StartKind.AT:
        if mid.index == 0:
            return RecordStart(start)
        return RecordStart(StartPosition.at(record), Skip(mid, inclusive=False))
    fallback = StartPosition.after(record) if mid.index == 0 else None
    return RecordStart(StartPosition.at(record), Skip(mid, inclusive=True), fallback)


async def _try_open(
    backend: Backend, pchannel: str, start: StartPosition
) -> BackendReader | errors.Truncated:
    try:
        return await backend.open_reader(pchannel, start)
    except errors.Truncated as exc:
        return exc


async def open_backend_scanner(
    backend: Backend,
    pchannel: str,
    options: ReadOptions,
    *,
    batch_size: int = DEFAULT_READ_BATCH,
    max_txn_bytes: int = DEFAULT_MAX_TXN_BYTES,
) -> Scanner:
    """A scanner of a WAL this process does not own: backend reads only.

    The backend reader is opened before returning, so ``LATEST`` means
    records appended after this call.
    """
    scanner = Scanner(
        backend, pchannel, options, None, batch_size=batch_size, max_txn_bytes=max_txn_bytes
    )
    await scanner.open()
    return scanner

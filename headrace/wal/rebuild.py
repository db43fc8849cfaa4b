"""Rebuilding the dedup window when a WAL opens: which records to read, and reading them.

The WAL's own ticks and fences carry :data:`DEDUP_FROM`, the id of the oldest
pair in its writer's window then (or of its last record when the window was
empty): the persisted anchor of a rebuild. When the log's last record is such
a tick or fence, the rebuild reads from its anchor.

After a crash the last record may be data. The tail is then read backwards in
growing probes (each starting :meth:`MessageID.preceding` the last record)
until a probe holds a tick or fence with an anchor (the rebuild then reads
from that anchor), or as many keyed records as the window holds (older ones
would be forgotten anyway), or starts at the earliest record. So the records
read are bounded by the window and the records since the last tick, not by
the length of the log.

A read that returns nothing before the last record is reached (the backend
stalled past :data:`READ_TIMEOUT_S`) fails the open with ``Unavailable``,
which the caller retries: a WAL never serves with a window it could not
rebuild completely.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from headrace import errors
from headrace.message import batch, ids, records
from headrace.message.ids import MessageID
from headrace.message.types import Message
from headrace.wal.buffer import Position
from headrace.wal.contract import Backend, Record, StartPosition
from headrace.wal.interceptors.backpressure import is_opaque
from headrace.wal.interceptors.dedup import (
    DEDUP_FROM,
    DedupWindow,
    Key,
    Remembered,
    logged_batch_pair,
    logged_pair,
)
from headrace.wal.progress import OpaqueLog, OpaqueSpan, OpaqueSummary, inherited

READ_TIMEOUT_S = 5.0
"""One read of the rebuild may wait this long for records before the open fails."""
FIRST_PROBE = 256
"""Records the first probe back from the last record covers."""
PROBE_GROWTH = 4

Pair = tuple[Key, Remembered]


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    """What a read of a range of the log found."""

    pairs: tuple[Pair, ...]
    """The keyed messages, in log order."""
    anchor: MessageID | None
    """The anchor of the range's last tick or fence that has one."""
    from_earliest: bool = False
    """The range was read from the earliest record still in the log."""


@dataclasses.dataclass(frozen=True, slots=True)
class TailScan:
    """Every record from ``start`` (None: the earliest) to the last one, in log
    order, shown to ``observe``."""

    start: MessageID | None
    observe: Callable[[MessageID, Message], None]


def replay_from(
    start: MessageID | None, replay: Callable[[MessageID, Message], None]
) -> Callable[[MessageID, Message], None]:
    """``replay`` shown only the records at or after ``start``: the scan may
    read from further back for retention (:func:`~headrace.wal.progress.widened_start`)
    while the segments are rebuilt from their own start."""
    if start is None:
        return replay

    def shown(rid: MessageID, msg: Message) -> None:
        if rid >= start:
            replay(rid, msg)

    return shown


class History:
    """The opaque records an open's tail scan read (it reads them anyway), for
    retention: runs of consecutive opaque records become spans, and what lies
    before the first record read is unknown, so it counts as opaque history as
    young as that record (unless the scan read from the earliest record, or
    the previous owner's summary covers it: :func:`~headrace.wal.progress.inherited`)."""

    def __init__(self, start: MessageID | None, observe: Callable[[MessageID, Message], None]):
        self._start = start
        self._observe = observe
        self._first: Position | None = None
        self._run: OpaqueSpan | None = None
        self._seen = OpaqueLog(coalesce_s=0.0)

    def observe(self, rid: MessageID, msg: Message) -> None:
        if self._first is None:
            self._first = Position(rid, msg.timetick)
        if is_opaque(msg):
            run = self._run
            self._run = (
                OpaqueSpan(rid, rid, msg.timetick, 0)
                if run is None
                else OpaqueSpan(run.first, rid, msg.timetick, 0)
            )
        elif self._run is not None:
            self._seen.note(self._run)
            self._run = None
        self._observe(rid, msg)

    def spans(
        self, last: Position, earliest: MessageID | None, summary: OpaqueSummary | None = None
    ) -> list[OpaqueSpan]:
        """The spans of opaque history up to ``last``, the log's last record at
        open (``earliest``: the log's first record then). What lies below the
        scan's start is taken from ``summary`` (the previous owner's) when it
        covers it, else counted as unread."""
        if self._run is not None:
            self._seen.note(self._run)
            self._run = None
        first = self._first
        if first is None or first.id is None:
            return History.unread(last)
        start = self._start
        if start is None or (earliest is not None and first.id <= earliest):
            below: list[OpaqueSpan] = []
        else:
            seeded = inherited(summary, start)
            below = History.unread(first) if seeded is None else seeded
        return below + list(self._seen.spans)

    @staticmethod
    def unread(last: Position) -> list[OpaqueSpan]:
        """History up to ``last`` nobody read: opaque, as young as ``last``."""
        if last.id is None:
            return []
        return [OpaqueSpan(None, last.id, last.timetick, 0)]


def anchor_of(msg: Message) -> MessageID | None:
    """The rebuild anchor a record names, None if it names none (pure)."""
    if not msg.type.is_system:
        return None
    hint = msg.properties.get(DEDUP_FROM)
    if not hint:
        return None
    try:
        return ids.parse(hint)
    except errors.InvalidArgument:
        return None


def probe_start(last: MessageID, reach: int, previous: MessageID | None) -> MessageID | None:
    """Where the probe reaching ``reach`` records back from ``last`` starts;
    None: at the earliest record (the id space gives no bound, or the probe
    would not reach further than ``previous``, the last probe's start) (pure)."""
    start = last.preceding(reach)
    if start is None or (previous is not None and start >= previous):
        return None
    return start


def enough(span: Span, capacity: int) -> bool:
    """Whether the probes so far, up to the last record, hold the whole window (pure)."""
    return span.anchor is not None or span.from_earliest or len(span.pairs) >= capacity


async def rebuild(
    backend: Backend,
    pchannel: str,
    last: Record,
    last_msg: Message,
    window: DedupWindow,
    *,
    scan: TailScan | None = None,
) -> None:
    """Refill ``window`` from the log's tail ending at ``last``; show ``scan``
    its range in the same read."""
    if scan is not None:
        span = await read_span(backend, pchannel, scan.start, last.id, observe=scan.observe)
        pairs = span.pairs
        anchor = anchor_of(last_msg) or span.anchor
        whole = span.from_earliest or scan.start is None or len(pairs) >= window.capacity
        if whole or (anchor is not None and scan.start is not None and anchor >= scan.start):
            window.remember_many(list(pairs))
            return
        if anchor is not None:
            earlier = await read_span(backend, pchannel, anchor, last.id, before=scan.start)
            window.remember_many(list(earlier.pairs + pairs))
            return
    await _rebuild_window(backend, pchannel, last, last_msg, window)


async def _rebuild_window(
    backend: Backend, pchannel: str, last: Record, last_msg: Message, window: DedupWindow
) -> None:
    if window.capacity == 0:
        return
    anchor = anchor_of(last_msg)
    if anchor is not None:
        span = await read_span(backend, pchannel, anchor, last.id)
        window.remember_many(list(span.pairs))
        return
    pairs: tuple[Pair, ...] = ()
    found: MessageID | None = None
    bound: MessageID | None = None  # where the previous probe started
    reach = FIRST_PROBE
    while True:
        start = probe_start(last.id, reach, bound)
        # Each probe reads only what the previous one did not: [start, bound).
        span = await read_span(backend, pchannel, start, last.id, before=bound)
        if span.from_earliest:
            start = None  # the probe's start was truncated away: nothing is before it
        pairs = span.pairs + pairs
        found = found or span.anchor
        if enough(Span(pairs, found, span.from_earliest), window.capacity):
            break
        bound = start
        reach *= PROBE_GROWTH
    if found is not None and start is not None and found < start:
        earlier = await read_span(backend, pchannel, found, last.id, before=start)
        pairs = earlier.pairs + pairs
    window.remember_many(list(pairs))


async def read_span(
    backend: Backend,
    pchannel: str,
    start: MessageID | None,
    last: MessageID,
    *,
    before: MessageID | None = None,
    observe: Callable[[MessageID, Message], None] | None = None,
) -> Span:
    """The keyed messages from ``start`` (None: the earliest record) up to
    ``last`` inclusive, or up to ``before`` exclusive when given.

    A start truncated away reads from the earliest record instead (everything
    still there). Unavailable if a read times out before the end is reached.
    """
    try:
        return await _read(backend, pchannel, (start, last, before), observe)
    except errors.Truncated:
        if start is None:
            raise
        return await _read(backend, pchannel, (None, last, before), observe)


async def _read(
    backend: Backend,
    pchannel: str,
    bounds: tuple[MessageID | None, MessageID, MessageID | None],
    observe: Callable[[MessageID, Message], None] | None,
) -> Span:
    start, last, before = bounds
    # Backends know record ids: a start inside a batch reads the whole record.
    position = StartPosition.earliest() if start is None else StartPosition.at(start.record_id())
    pairs: list[Pair] = []
    anchor: MessageID | None = None
    read = 0
    reader = await backend.open_reader(pchannel, position)
    try:
        while True:
            got = await reader.next_batch(1024, timeout=READ_TIMEOUT_S)
            if not got:
                raise errors.Unavailable(
                    f"rebuilding the dedup window of {pchannel}: no record arrived within "
                    f"{READ_TIMEOUT_S:g} s after {read} read from {position.id or 'the start'} "
                    f"(the last record is {last}); the open fails so that it is retried "
                    "rather than serving with a partial window"
                )
            for record in got:
                if before is not None and record.id >= before:
                    return Span(tuple(pairs), anchor, start is None)
                read += 1
                data = record.data
                if batch.is_batch(data) and not _decode_batch(record.id, data, pairs, observe):
                    if record.id >= last:
                        return Span(tuple(pairs), anchor, start is None)
                    continue
                for mid, msg in records.entries(record.id, data):
                    if observe is not None:
                        observe(mid, msg)
                    if msg.properties:
                        pair = logged_pair(mid, msg)
                        if pair is not None:
                            pairs.append(pair)
                        anchor = anchor_of(msg) or anchor
                if record.id >= last:
                    return Span(tuple(pairs), anchor, start is None)
    finally:
        await reader.close()


def _decode_batch(
    rid: MessageID,
    data: bytes,
    pairs: list[Pair],
    observe: Callable[[MessageID, Message], None] | None,
) -> bool:
    """A record batch read back: its dedup pair from the header alone (added
    to ``pairs``); whether its messages must be decoded too: for ``observe``,
    for the rebuild anchor of the WAL's own ticks and fences (system batches),
    or for the per-message keys of a batch without a producer id."""
    header = batch.read_header(data)
    pair = logged_batch_pair(rid, header)
    if pair is not None:
        pairs.append(pair)
    return observe is not None or header.system or not header.producer_id

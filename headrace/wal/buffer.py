"""The write-ahead buffer: the recent tail of one WAL, in memory, for tail readers.

The framework WAL feeds every entry it makes durable (and every time tick it
does not persist) into the buffer, in log order. Entries are kept until the
buffer exceeds its byte bound; then the oldest are evicted. Readers hold a
sequence number (``seq``) as their cursor; a reader whose next entry was
evicted falls back to reading the backend (see :mod:`headrace.wal.scanner`).

Positions are ``(id, timetick)`` pairs. Time ticks that were not persisted
carry the id of the last persisted message, so ids alone do not order the
buffer; timeticks strictly increase in log order and do.

An entry is a message (:class:`LogEntry`) or a whole record batch
(:class:`~headrace.message.records.BatchEntry`, format 2), kept as appended:
the buffer's timetick of a batch is its last message's, and a position inside
a batch (a message of it) maps to the batch, whose earlier messages the reader
skips by timetick.

The byte bound covers what entries cost in memory, not only their encoded
size (:func:`entry_cost`), and an evicted entry is let go of soon after
(the buffer's lists are compacted once evicted entries hold a sixteenth of
the bound), so a buffer of N bytes keeps little more than N bytes alive.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
from collections.abc import Callable, Sequence

from headrace import errors
from headrace.message.ids import MessageID
from headrace.message.records import BatchEntry, message_id
from headrace.message.types import LogEntry

Item = LogEntry | BatchEntry
"""What the buffer holds: a message, or a record batch whole."""

ENTRY_OVERHEAD = 576
"""Bytes an entry costs beyond its encoded size, at most: its Python objects
(the entry, its id, its message or batch header, the bytes object's header)
and its cells in the buffer's columns. Measured with tracemalloc on CPython
3.11: 385 to 490 for a message or a time tick without properties, 480 to 510
for a record batch (its header a named tuple), about 530 for one appended to
this WAL (the producer's bytes and its stamp kept apart in a
:class:`~headrace.message.batch.Stamped`; ``tests/wal/test_buffer_memory.py``
checks the bound, with room for what other threads allocate meanwhile)."""
PROPERTY_OVERHEAD = 200
"""Bytes each property of a message entry costs beyond its encoded bytes, at
most: two ``str`` objects and a slot of the properties dict (the first one
also makes the dict). Measured: about 210 for the first, 90 to 115 for others."""
COMPACT_FRACTION = 16
"""The lists drop evicted entries once these hold ``1/COMPACT_FRACTION`` of
the bound (or, for many small ones, once they are more than half the list)."""


def entry_cost(item: Item, size: int) -> int:
    """What ``item`` of encoded ``size`` costs in memory, at most."""
    if type(item) is BatchEntry:
        return size + ENTRY_OVERHEAD
    assert isinstance(item, LogEntry)
    return size + ENTRY_OVERHEAD + PROPERTY_OVERHEAD * len(item.message.properties)


def end_of(item: Item) -> Position:
    """The position of an item's last message."""
    if type(item) is BatchEntry:
        return Position(item.last_id, item.last_timetick)
    assert isinstance(item, LogEntry)
    return Position(item.id, item.message.timetick)


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """A point in the log: the last entry consumed.

    ``id`` is None and ``timetick`` 0 before the first entry of an empty log.
    """

    id: MessageID | None
    timetick: int


START = Position(None, 0)


class WriteAheadBuffer:
    """Bounded in-memory tail of a WAL with cursor-based reads.

    ``max_bytes`` bounds the entries' cost in memory (:func:`entry_cost`);
    the newest entry stays even if it alone exceeds it.
    """

    def __init__(self, max_bytes: int, base: Position) -> None:
        self._max_bytes = max(1, max_bytes)
        self._base = base
        self._entries: list[Item] = []
        self._tts: list[int] = []
        self._sizes: list[int] = []
        self._persisted: list[bool] = []
        self._head = 0
        self._first_seq = 0
        self._bytes = 0
        self._evicted_bytes = 0
        """Cost of the evicted entries still in the lists (before ``_head``)."""
        self._closed = False
        self._signal: asyncio.Future[None] | None = None
        self.on_wait: Callable[[], None] | None = None
        """Called when a reader starts waiting for the next entry (the WAL's
        ticks then advance the timetick for it)."""

    # -- writer side -------------------------------------------------------

    def extend(self, entries: list[tuple[Item, int, bool]]) -> None:
        """Add ``(entry, encoded size, persisted)`` triples in log order."""
        self.extend_columns(
            [e for e, _, _ in entries],
            [end_of(e).timetick for e, _, _ in entries],
            [size for _, size, _ in entries],
            [persisted for _, _, persisted in entries],
        )

    def extend_columns(
        self,
        entries: Sequence[Item],
        timeticks: Sequence[int],
        sizes: Sequence[int],
        persisted: Sequence[bool],
    ) -> None:
        """:meth:`extend` by columns: entry ``i`` has ``timeticks[i]`` (its
        message's; a batch's last message's), encoded size ``sizes[i]`` and
        ``persisted[i]``."""
        count = len(entries)
        if not count == len(timeticks) == len(sizes) == len(persisted):
            raise errors.InvalidArgument("write-ahead buffer columns differ in length")
        if count == 1:
            # One producer's append: one entry, without the lists of costs.
            (entry,) = entries
            cost = entry_cost(entry, sizes[0])
            self._entries.append(entry)
            self._tts.append(timeticks[0])
            self._sizes.append(cost)
            self._persisted.append(persisted[0])
            self._bytes += cost
        else:
            costs = list(map(entry_cost, entries, sizes))
            self._entries += entries
            self._tts += timeticks
            self._sizes += costs
            self._persisted += persisted
            self._bytes += sum(costs)
        if self._bytes > self._max_bytes:
            self._evict()
        if self._signal is not None:
            self._wake()

    def reset(self, base: Position) -> None:
        """Forget every entry; readers at any cursor fall back to the backend.

        Used when the backend's state is no longer known to match the buffer
        (an append failed after possibly writing part of a batch).
        """
        self._first_seq = self.next_seq + 1
        self._entries.clear()
        self._tts.clear()
        self._sizes.clear()
        self._persisted.clear()
        self._head = 0
        self._bytes = 0
        self._evicted_bytes = 0
        self._base = base
        self._wake()

    def close(self) -> None:
        """No more entries will come; waiting readers wake up."""
        self._closed = True
        self._wake()

    def _evict(self) -> None:
        excess = self._bytes - self._max_bytes
        if excess <= 0:
            return
        head, last = self._head, len(self._entries) - 1
        sizes = self._sizes
        i, freed = head, 0
        while freed < excess and i < last:
            freed += sizes[i]
            i += 1
        if i > head:
            self._base = end_of(self._entries[i - 1])
            self._bytes -= freed
            self._evicted_bytes += freed
            self._first_seq += i - head
            self._head = i
        if self._compaction_due():
            del self._entries[: self._head]
            del self._tts[: self._head]
            del self._sizes[: self._head]
            del self._persisted[: self._head]
            self._head = 0
            self._evicted_bytes = 0

    def _compaction_due(self) -> bool:
        """Whether the evicted entries at the lists' front should go now: they
        hold a noticeable part of the bound, or are many (more than half the
        lists). Either way each compaction removes at least as much as it moves
        or a fixed share of the bound, so its cost per entry stays constant."""
        head = self._head
        if not head:
            return False
        return self._evicted_bytes * COMPACT_FRACTION >= self._max_bytes or (
            head > 1024 and head * 2 > len(self._entries)
        )

    def _wake(self) -> None:
        signal = self._signal
        if signal is not None:
            self._signal = None
            if not signal.done():
                signal.set_result(None)

    # -- reader side -------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def waiting(self) -> bool:
        """A reader waits for the next entry."""
        signal = self._signal
        return signal is not None and not signal.done()

    @property
    def first_seq(self) -> int:
        return self._first_seq

    @property
    def next_seq(self) -> int:
        return self._first_seq + len(self._entries) - self._head

    @property
    def base(self) -> Position:
        """The position just before the oldest retained entry."""
        return self._base

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def size_entries(self) -> int:
        return len(self._entries) - self._head

    def last_position(self) -> Position:
        if len(self._entries) == self._head:
            return self._base
        return end_of(self._entries[-1])

    def seq_after(self, pos: Position) -> int | None:
        """Cursor of the successor of ``pos``, or None if it is not retained.

        The successor is retained when ``pos`` is at or after the base, or
        when the base has ``pos``'s id at a later timetick: only ticks that
        went only to the buffer (they carry the last persisted id) were
        evicted after ``pos``, and a reader loses nothing by skipping them. A
        position beyond the last entry (a reader of the backend that saw a
        record before it reached the buffer) maps to ``next_seq``; the reader
        skips entries at or below its timetick.
        """
        base = self._base
        if pos.timetick < base.timetick and (pos.id is None or pos.id != base.id):
            return None
        i = bisect.bisect_right(self._tts, pos.timetick, lo=self._head)
        return self._first_seq + (i - self._head)

    def locate_at(self, mid: MessageID) -> Position | None:
        """Position just before the persisted entry ``mid``, if retained."""
        found = self._find_persisted(mid)
        if found is None:
            return None
        i, index = found
        if index:  # inside a batch: its previous message
            first_tt = self._first_tt(self._entries[i])
            return Position(message_id(mid.record_id(), index - 1), first_tt + index - 1)
        if i == self._head:
            return self._base
        return end_of(self._entries[i - 1])

    def locate_after(self, mid: MessageID) -> Position | None:
        """Position of the persisted entry ``mid`` (or the base), if retained."""
        if self._base.id is not None and self._base.id == mid:
            return self._base
        found = self._find_persisted(mid)
        if found is None:
            return None
        i, index = found
        return Position(mid, self._first_tt(self._entries[i]) + index)

    @staticmethod
    def _first_tt(item: Item) -> int:
        if type(item) is BatchEntry:
            return item.header.base_timetick
        assert isinstance(item, LogEntry)
        return item.message.timetick

    def _find_persisted(self, mid: MessageID) -> tuple[int, int] | None:
        """Where the persisted message ``mid`` is: its entry's index and its
        index in that entry (0 for a message entry), if retained."""
        entries = self._entries
        if len(entries) == self._head:
            return None
        if entries[self._head].id.backend != mid.backend:
            return None
        # The first entry at or after mid: mid itself (a message, or a batch's
        # first), or what follows it (unpersisted ticks carry the id of the last
        # persisted message); then mid can only be inside the batch just before.
        i = bisect.bisect_left(entries, mid, lo=self._head, key=_entry_id)
        if i < len(entries) and entries[i].id == mid and self._persisted[i]:
            return i, 0
        i -= 1
        item = entries[i] if i >= self._head else None
        if type(item) is BatchEntry and self._persisted[i]:
            index = item.position_of(mid)
            return None if index is None else (i, index)
        return None

    def read(self, seq: int, max_entries: int) -> list[Item] | None:
        """Entries from cursor ``seq`` on (at most ``max_entries``).

        None if ``seq`` was evicted; an empty list if nothing new yet.
        """
        if seq < self._first_seq:
            return None
        start = self._head + (seq - self._first_seq)
        return self._entries[start : start + max_entries]

    async def wait(self, seq: int, timeout: float | None) -> None:
        """Wait until an entry at ``seq`` exists, the buffer changes, or timeout."""
        if seq < self.next_seq or self._closed or seq < self._first_seq:
            return
        if self._signal is None:
            self._signal = asyncio.get_running_loop().create_future()
            if self.on_wait is not None:
                self.on_wait()
        await asyncio.wait({self._signal}, timeout=timeout)


def _entry_id(entry: Item) -> MessageID:
    return entry.id

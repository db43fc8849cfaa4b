"""The write-ahead buffer: eviction, cursors, positions, waiting."""

from __future__ import annotations

import asyncio

import pytest

from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.buffer import ENTRY_OVERHEAD, START, Position, WriteAheadBuffer
from headrace.wal.memory import MemoryMessageID as MID


def entry(seq: int, tt: int, kind: MessageType = MessageType.INSERT) -> LogEntry:
    vch = "" if kind is MessageType.TIME_TICK else "v"
    return LogEntry(MID(seq), Message(kind, vch, timetick=tt, term=1))


def cost(size: int) -> int:
    """What an entry of these tests (no properties) of encoded ``size`` counts."""
    return size + ENTRY_OVERHEAD


def fill(buf: WriteAheadBuffer, items: list[tuple[LogEntry, int, bool]]) -> None:
    buf.extend(items)


def test_read_by_cursor_and_eviction_by_bytes() -> None:
    buf = WriteAheadBuffer(3 * cost(100), START)
    fill(buf, [(entry(i, 10 + i), 100, True) for i in range(3)])
    assert buf.size_entries == 3 and buf.size_bytes == 3 * cost(100)
    assert buf.first_seq == 0 and buf.next_seq == 3
    read = buf.read(0, 10)
    assert read is not None and [e.id for e in read] == [MID(0), MID(1), MID(2)]
    fill(buf, [(entry(3, 13), 100, True)])
    assert buf.first_seq == 1 and buf.size_bytes == 3 * cost(100)
    assert buf.read(0, 10) is None, "an evicted cursor is reported"
    assert buf.base == Position(MID(0), 10)
    read = buf.read(2, 1)
    assert read is not None and [e.id for e in read] == [MID(2)]
    assert buf.read(4, 10) == []


def test_the_newest_entry_stays_even_if_larger_than_the_bound() -> None:
    buf = WriteAheadBuffer(10, START)
    fill(buf, [(entry(0, 1), 50, True), (entry(1, 2), 50, True)])
    assert buf.size_entries == 1 and buf.last_position() == Position(MID(1), 2)
    assert buf.base == Position(MID(0), 1)


def test_compaction_keeps_cursors_valid() -> None:
    buf = WriteAheadBuffer(10 * cost(8), START)
    for i in range(5000):
        fill(buf, [(entry(i, i + 1), 8, True)])
    assert buf.size_entries == 10 and buf.first_seq == 4990 and buf.next_seq == 5000
    read = buf.read(4995, 2)
    assert read is not None and [e.id for e in read] == [MID(4995), MID(4996)]
    assert buf.seq_after(Position(MID(4994), 4995)) == 4995


def test_seq_after_finds_the_successor_only_when_retained() -> None:
    buf = WriteAheadBuffer(1 << 20, Position(MID(4), 40))
    fill(buf, [(entry(5, 50), 10, True), (entry(5, 55, MessageType.TIME_TICK), 10, False)])
    fill(buf, [(entry(6, 60), 10, True)])
    assert buf.seq_after(Position(MID(3), 30)) is None
    assert buf.seq_after(Position(MID(4), 40)) == 0
    assert buf.seq_after(Position(MID(5), 50)) == 1
    assert buf.seq_after(Position(MID(5), 55)) == 2
    assert buf.seq_after(Position(MID(6), 60)) == 3
    assert buf.seq_after(Position(MID(7), 70)) == 3, "a reader ahead of the buffer waits at its end"
    empty_log = WriteAheadBuffer(1 << 20, START)
    assert empty_log.seq_after(START) == 0


def test_a_reader_at_the_last_persisted_record_skips_evicted_buffer_only_ticks() -> None:
    """Ticks that went only to the buffer carry the last persisted id; once they
    are evicted, a reader of the backend that reached that record still finds
    its successor in the buffer (it waits for no further persisted record)."""
    buf = WriteAheadBuffer(2 * cost(10), Position(MID(4), 40))
    tick = MessageType.TIME_TICK
    fill(buf, [(entry(5, 50), 10, True), (entry(5, 55, tick), 10, False)])
    fill(buf, [(entry(5, 60, tick), 10, False), (entry(6, 70), 10, True)])
    assert buf.base == Position(MID(5), 55) and buf.first_seq == 2
    assert buf.seq_after(Position(MID(5), 50)) == 2
    assert buf.seq_after(Position(MID(4), 40)) is None, "record 5 was evicted"
    fill(buf, [(entry(7, 80), 10, True)])
    assert buf.base == Position(MID(5), 60)
    assert buf.seq_after(Position(MID(5), 50)) == 3
    fill(buf, [(entry(8, 90), 10, True)])
    assert buf.seq_after(Position(MID(5), 50)) is None, "record 6 was evicted"


def test_locate_persisted_entries_for_start_positions() -> None:
    buf = WriteAheadBuffer(1 << 20, Position(MID(4), 40))
    fill(
        buf,
        [
            (entry(5, 50), 10, True),
            (entry(5, 55, MessageType.TIME_TICK), 10, False),
            (entry(6, 60), 10, True),
        ],
    )
    assert buf.locate_at(MID(5)) == Position(MID(4), 40)
    assert buf.locate_at(MID(6)) == Position(MID(5), 55)
    assert buf.locate_at(MID(3)) is None
    assert buf.locate_at(MID(9)) is None
    assert buf.locate_after(MID(4)) == Position(MID(4), 40)
    assert buf.locate_after(MID(5)) == Position(MID(5), 50), "ticks sharing the id follow"
    assert buf.locate_after(MID(6)) == Position(MID(6), 60)
    assert buf.locate_after(MID(2)) is None


def test_reset_sends_every_cursor_back_to_the_backend() -> None:
    buf = WriteAheadBuffer(1 << 20, START)
    fill(buf, [(entry(0, 1), 10, True), (entry(1, 2), 10, True)])
    cursor = buf.next_seq
    buf.reset(Position(MID(3), 9))
    assert buf.read(cursor, 10) is None
    assert buf.size_entries == 0 and buf.size_bytes == 0
    assert buf.last_position() == Position(MID(3), 9)
    assert buf.seq_after(Position(MID(1), 2)) is None
    assert buf.seq_after(Position(MID(3), 9)) == buf.next_seq
    fill(buf, [(entry(4, 10), 10, True)])
    read = buf.read(buf.first_seq, 10)
    assert read is not None and [e.id for e in read] == [MID(4)]


async def test_wait_wakes_on_new_entries_close_and_timeout() -> None:
    buf = WriteAheadBuffer(1 << 20, START)
    await asyncio.wait_for(buf.wait(0, timeout=0.01), 5)
    waiter = asyncio.create_task(buf.wait(0, timeout=None))
    await asyncio.sleep(0)
    assert not waiter.done()
    fill(buf, [(entry(0, 1), 10, True)])
    await asyncio.wait_for(waiter, 5)
    await asyncio.wait_for(buf.wait(0, timeout=None), 5)
    waiter = asyncio.create_task(buf.wait(1, timeout=None))
    await asyncio.sleep(0)
    buf.close()
    await asyncio.wait_for(waiter, 5)
    assert buf.closed


@pytest.mark.parametrize("bound", [1, 64, 10_000])
def test_eviction_keeps_log_order(bound: int) -> None:
    buf = WriteAheadBuffer(bound, START)
    for i in range(200):
        fill(buf, [(entry(i, i + 1), 16, True)])
    read = buf.read(buf.first_seq, 1000)
    assert read is not None
    ticks = [e.message.timetick for e in read]
    assert ticks == list(range(201 - len(ticks), 201))
    assert buf.base.timetick == 200 - len(ticks)

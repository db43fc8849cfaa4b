"""Record batches as units: the write-ahead buffer keeps a batch whole, and a
scanner's ``next_units`` hands a batch on whole when every message of it is
delivered as it stands, from the buffer and from the backend alike; in every
other case (filters that keep part of it, a start inside it, a transaction)
its messages come one by one, exactly as ``next_many`` gives them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from headrace.message import batch
from headrace.message.ids import MessageID
from headrace.message.records import BatchEntry, message_id
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal import registry
from headrace.wal.api import DeliverPolicy, ReadOptions
from headrace.wal.buffer import START, Position, WriteAheadBuffer
from headrace.wal.contract import Backend
from headrace.wal.memory import MemoryMessageID as MID
from headrace.wal.scanner import Scanner, open_backend_scanner

TERM = 1


def unit(rid: MessageID, base_tt: int, count: int, vchannel: str = "v1") -> BatchEntry:
    msgs = [Message(MessageType.INSERT, vchannel, b"m%d" % i) for i in range(count)]
    data = bytearray(batch.encode(msgs, batch.BatchInfo(vchannel)))
    batch.stamp(data, base_tt, TERM)
    return BatchEntry(rid, batch.verify(data), bytes(data))


def tick(rid: MessageID, tt: int) -> LogEntry:
    return LogEntry(rid, Message(MessageType.TIME_TICK, timetick=tt, term=TERM))


def test_the_buffer_keeps_a_batch_whole_and_finds_its_messages() -> None:
    buf = WriteAheadBuffer(10_000, Position(MID(4), 40))
    first = unit(MID(5), 50, 3)
    buf.extend([(first, 100, True), (tick(MID(5).with_index(2), 60), 10, False)])
    buf.extend([(unit(MID(6), 70, 2), 100, True)])
    assert buf.last_position() == Position(MID(6).with_index(1), 71)
    assert buf.locate_at(MID(5)) == Position(MID(4), 40)
    assert buf.locate_at(MID(5).with_index(1)) == Position(MID(5), 50)
    assert buf.locate_after(MID(5).with_index(1)) == Position(MID(5).with_index(1), 51)
    assert buf.locate_after(MID(5).with_index(2)) == Position(MID(5).with_index(2), 52)
    assert buf.locate_at(MID(6)) == Position(MID(5).with_index(2), 60)
    assert buf.locate_at(MID(5).with_index(3)) is None, "past the batch's last message"
    assert buf.locate_at(MID(7)) is None
    # A position inside a batch maps to the batch (the reader skips by timetick).
    assert buf.seq_after(Position(MID(5), 50)) == 0
    assert buf.seq_after(Position(MID(5).with_index(2), 52)) == 1
    assert buf.seq_after(Position(MID(5).with_index(2), 60)) == 2


def test_eviction_moves_the_base_past_a_whole_batch() -> None:
    buf = WriteAheadBuffer(150, START)
    buf.extend([(unit(MID(0), 10, 4), 100, True), (unit(MID(1), 20, 2), 100, True)])
    assert buf.base == Position(MID(0).with_index(3), 13)


async def scanner_on(buffer: WriteAheadBuffer, options: ReadOptions) -> Scanner:
    return Scanner(registry.create("memory"), "p", options, buffer)


def filled_buffer() -> WriteAheadBuffer:
    buf = WriteAheadBuffer(1_000_000, START)
    buf.extend(
        [
            (unit(MID(0), 10, 3, "v1"), 100, True),
            (tick(MID(0).with_index(2), 15), 10, False),
            (unit(MID(1), 20, 2, "v2"), 100, True),
        ]
    )
    return buf


async def test_tail_units_go_whole_and_entries_stay_the_same() -> None:
    scanner = await scanner_on(filled_buffer(), ReadOptions())
    got = await scanner.next_units(100, timeout=1)
    assert [type(g).__name__ for g in got] == ["BatchEntry", "LogEntry", "BatchEntry"]
    assert scanner.position == Position(MID(1).with_index(1), 21)
    plain = await scanner_on(filled_buffer(), ReadOptions())
    entries = await plain.next_many(100, timeout=1)
    expanded: list[LogEntry] = []
    for g in got:
        expanded += g.entries() if isinstance(g, BatchEntry) else [g]
    assert entries == expanded
    assert [e.message.timetick for e in entries] == [10, 11, 12, 15, 20, 21]


async def test_a_filter_keeps_the_batches_it_passes_whole() -> None:
    scanner = await scanner_on(filled_buffer(), ReadOptions(vchannels=frozenset({"v2"})))
    got = await scanner.next_units(100, timeout=1)
    assert [(type(g).__name__, g.id) for g in got] == [
        ("LogEntry", MID(0).with_index(2)),  # the tick: delivered to every reader
        ("BatchEntry", MID(1)),
    ]
    later = await scanner_on(filled_buffer(), ReadOptions(timetick_gt=10))
    got = await later.next_units(100, timeout=1)
    assert [g.id for g in got][:2] == [MID(0).with_index(1), MID(0).with_index(2)]
    assert all(isinstance(g, LogEntry) for g in got[:3]), "a batch taken in part comes apart"
    assert isinstance(got[-1], BatchEntry)


async def test_room_counts_messages_but_a_first_batch_always_goes() -> None:
    scanner = await scanner_on(filled_buffer(), ReadOptions())
    first = await scanner.next_units(2, timeout=1)
    assert [type(g).__name__ for g in first] == ["BatchEntry"], "alone, larger than the room"
    second = await scanner.next_units(2, timeout=1)
    assert [type(g).__name__ for g in second] == ["LogEntry"], "the tick; the batch waits"
    third = await scanner.next_units(2, timeout=1)
    assert [g.id for g in third] == [MID(1)]


async def test_a_start_inside_a_batch_in_the_buffer() -> None:
    buf = filled_buffer()
    opts = ReadOptions(policy=DeliverPolicy.START_AFTER, start_id=MID(0).with_index(1))
    scanner = await scanner_on(buf, opts)
    got = await scanner.next_units(100, timeout=1)
    assert [g.id for g in got] == [MID(0).with_index(2), MID(0).with_index(2), MID(1)]
    assert [type(g).__name__ for g in got] == ["LogEntry", "LogEntry", "BatchEntry"]


@pytest.fixture(params=["memory", "local"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    created = (
        registry.create("local", root=str(tmp_path))
        if request.param == "local"
        else registry.create("memory")
    )
    yield created
    await created.close()


async def write(backend: Backend, units: Sequence[BatchEntry]) -> list[MessageID]:
    writer = await backend.open_writer("p", TERM)
    try:
        return await writer.append([u.data for u in units])
    finally:
        await writer.close()


async def test_catchup_units_from_the_backend(backend: Backend) -> None:
    rids = await write(backend, [unit(MID(0), 10, 3, "v1"), unit(MID(0), 20, 2, "v2")])
    scanner = await open_backend_scanner(backend, "p", ReadOptions())
    try:
        got = await scanner.next_units(100, timeout=5)
        assert [(type(g).__name__, g.id) for g in got] == [
            ("BatchEntry", rids[0]),
            ("BatchEntry", rids[1]),
        ]
        assert scanner.position == Position(message_id(rids[1], 1), 21)
    finally:
        await scanner.close()
    opts = ReadOptions(policy=DeliverPolicy.START_FROM, start_id=message_id(rids[0], 2))
    scanner = await open_backend_scanner(backend, "p", opts)
    try:
        got = await scanner.next_units(100, timeout=5)
        assert [(type(g).__name__, g.id) for g in got] == [
            ("LogEntry", message_id(rids[0], 2)),
            ("BatchEntry", rids[1]),
        ]
    finally:
        await scanner.close()

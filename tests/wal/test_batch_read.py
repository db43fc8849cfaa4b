"""Reading logs that hold record batches (format 2), alone or beside format 1 records.

Every reader of stored records (scanners with their filters and start
positions, the open's last-record recovery, the dedup rebuild, the local dump)
sees the messages of a batch stored as record ``R`` as ids ``R``, ``R/1``, ...
with timeticks ``base``, ``base + 1``, ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from headrace import errors
from headrace.message import batch, codec, records
from headrace.message.ids import MessageID
from headrace.message.properties import PRODUCER_ID, PRODUCER_SEQ
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import AppendResult, DeliverPolicy, ReadOptions
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local.dump import iter_dump
from headrace.wal.memory import MemoryMessageID as MID
from headrace.wal.scanner import RecordStart, Skip, open_backend_scanner, record_start

QUIET = WALOptions(timetick_interval_ms=3_600_000)
TERM = 1


@pytest.fixture(params=["memory", "local"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    created = (
        registry.create("local", root=str(tmp_path))
        if request.param == "local"
        else registry.create("memory")
    )
    yield created
    await created.close()


def stamped_batch(msgs: Sequence[Message], base: int, info: batch.BatchInfo) -> bytes:
    data = bytearray(batch.encode(msgs, info))
    batch.stamp(data, base, TERM)
    return bytes(data)


def inserts(vchannel: str, count: int, tag: str) -> list[Message]:
    return [Message(MessageType.INSERT, vchannel, f"{tag}{i}".encode()) for i in range(count)]


async def write_mixed_log(backend: Backend) -> list[MessageID]:
    """Record 0: a format 1 message (tt 10); record 1: a batch of 3 on v1 (tt 20..22);
    record 2: a batch of 2 on v2 (tt 30, 31); record 3: a format 1 message (tt 40)."""
    writer = await backend.open_writer("p", TERM)
    try:
        return await writer.append(
            [
                codec.encode(Message(MessageType.INSERT, "v1", b"one", timetick=10, term=TERM)),
                stamped_batch(inserts("v1", 3, "a"), 20, batch.BatchInfo("v1")),
                stamped_batch(inserts("v2", 2, "b"), 30, batch.BatchInfo("v2")),
                codec.encode(Message(MessageType.DELETE, "v2", b"two", timetick=40, term=TERM)),
            ]
        )
    finally:
        await writer.close()


EXPECTED = [
    (0, 0, b"one", 10),
    (1, 0, b"a0", 20),
    (1, 1, b"a1", 21),
    (1, 2, b"a2", 22),
    (2, 0, b"b0", 30),
    (2, 1, b"b1", 31),
    (3, 0, b"two", 40),
]


def expected_ids(rids: list[MessageID]) -> list[MessageID]:
    return [records.message_id(rids[r], i) for r, i, _p, _t in EXPECTED]


async def read(backend: Backend, options: ReadOptions, count: int) -> list[LogEntry]:
    scanner = await open_backend_scanner(backend, "p", options)
    try:
        out: list[LogEntry] = []
        while len(out) < count:
            entry = await scanner.next(timeout=5)
            assert entry is not None, f"only {len(out)} of {count} arrived: {out}"
            out.append(entry)
        assert await scanner.next(timeout=0.1) is None
        return out
    finally:
        await scanner.close()


async def test_a_scanner_reads_every_message_of_both_formats(backend: Backend) -> None:
    rids = await write_mixed_log(backend)
    got = await read(backend, ReadOptions(), len(EXPECTED))
    assert [e.id for e in got] == expected_ids(rids)
    assert [(e.message.payload, e.message.timetick) for e in got] == [
        (p, t) for _r, _i, p, t in EXPECTED
    ]
    assert [str(e.id) for e in got][1:4] == [f"{rids[1]}", f"{rids[1]}/1", f"{rids[1]}/2"]


@pytest.mark.parametrize(
    ("policy", "start", "first"),
    [
        (DeliverPolicy.START_FROM, (1, 1), 2),
        (DeliverPolicy.START_AFTER, (1, 1), 3),
        (DeliverPolicy.START_AFTER, (1, 0), 2),  # index 0 of a batch: its record holds more
        (DeliverPolicy.START_AFTER, (1, 2), 4),
        (DeliverPolicy.START_AFTER, (0, 0), 1),  # a format 1 record
        (DeliverPolicy.START_FROM, (2, 0), 4),
    ],
)
async def test_starts_inside_a_batch(
    backend: Backend, policy: DeliverPolicy, start: tuple[int, int], first: int
) -> None:
    rids = await write_mixed_log(backend)
    start_id = records.message_id(rids[start[0]], start[1])
    got = await read(backend, ReadOptions(policy=policy, start_id=start_id), len(EXPECTED) - first)
    assert [e.id for e in got] == expected_ids(rids)[first:]


async def test_filters_skip_whole_batches_or_messages_inside(backend: Backend) -> None:
    rids = await write_mixed_log(backend)
    ids = expected_ids(rids)
    only_v2 = await read(backend, ReadOptions(vchannels=frozenset({"v2"})), 3)
    assert [e.id for e in only_v2] == ids[4:]
    deletes = await read(backend, ReadOptions(types=frozenset({MessageType.DELETE})), 1)
    assert [e.id for e in deletes] == ids[6:]
    later = await read(backend, ReadOptions(timetick_ge=21), 5)
    assert [e.id for e in later] == ids[2:]


async def test_a_wal_opens_on_a_log_ending_in_a_batch(backend: Backend) -> None:
    writer = await backend.open_writer("p", TERM)
    keyed = [
        Message(MessageType.INSERT, "v1", b"k%d" % i, {PRODUCER_ID: "prod", PRODUCER_SEQ: str(i)})
        for i in range(3)
    ]
    (rid,) = await writer.append([stamped_batch(keyed, 50, batch.BatchInfo("v1"))])
    await writer.close()
    wal = await WAL.open(backend, "p", TERM + 1, tso=LocalTSO(), options=QUIET)
    try:
        # The FENCE came after the batch's last message and its last timetick.
        assert wal.last_timetick > 52
        # The dedup window was rebuilt from the batch's messages: a repeat is answered
        # with the first result (the batch's message 1), not written again.
        retry = Message(MessageType.INSERT, "v1", b"k1", {PRODUCER_ID: "prod", PRODUCER_SEQ: "1"})
        (result,) = await wal.append_many([retry])
        assert isinstance(result, AppendResult)
        assert (result.id, result.timetick) == (rid.with_index(1), 51)
        fresh = await wal.append(Message(MessageType.INSERT, "v1", b"new"))
        assert fresh.timetick > wal.last_timetick - 1 > 52
    finally:
        await wal.close()


def test_record_start_is_pure_and_says_what_it_drops() -> None:
    at_inside = record_start(StartPosition.at(MID(4).with_index(2)))
    assert at_inside == RecordStart(StartPosition.at(MID(4)), Skip(MID(4).with_index(2), False))
    assert record_start(StartPosition.at(MID(4))) == RecordStart(StartPosition.at(MID(4)))
    after = record_start(StartPosition.after(MID(4)))
    assert after == RecordStart(
        StartPosition.at(MID(4)), Skip(MID(4), True), StartPosition.after(MID(4))
    )
    assert record_start(StartPosition.earliest()) == RecordStart(StartPosition.earliest())


async def test_a_start_after_a_truncated_record_reads_on(tmp_path: Path) -> None:
    backend = registry.create("memory")
    try:
        rids = await write_mixed_log(backend)
        await backend.truncate("p", rids[1])
        got = await read(
            backend, ReadOptions(policy=DeliverPolicy.START_AFTER, start_id=rids[0]), 6
        )
        assert [e.id for e in got] == expected_ids(rids)[1:]
        await backend.truncate("p", rids[2])
        with pytest.raises(errors.Truncated):
            await read(backend, ReadOptions(policy=DeliverPolicy.START_FROM, start_id=rids[0]), 1)
    finally:
        await backend.close()


async def test_a_damaged_batch_is_corrupt_data_for_the_reader() -> None:
    """A backend without checksums of its own (memory) leaves the check to the
    batch's CRC. (The local backend's frame CRC covers the bytes as the WAL
    appended them, which the node verified before appending.)"""
    backend = registry.create("memory")
    writer = await backend.open_writer("p", TERM)
    data = bytearray(stamped_batch(inserts("v1", 2, "x"), 5, batch.BatchInfo("v1")))
    data[-1] ^= 0xFF
    await writer.append([bytes(data)])
    await writer.close()
    scanner = await open_backend_scanner(backend, "p", ReadOptions())
    try:
        with pytest.raises(errors.CorruptData, match="batch CRC mismatch"):
            await scanner.next(timeout=5)
    finally:
        await scanner.close()
        await backend.close()


async def test_the_local_dump_shows_a_batch_as_one_record(tmp_path: Path) -> None:
    backend = registry.create("local", root=str(tmp_path))
    try:
        await write_mixed_log(backend)
    finally:
        await backend.close()
    rows = list(iter_dump(str(tmp_path), "p"))
    assert [(r.type, r.vchannel, r.timetick) for r in rows] == [
        ("INSERT", "v1", 10),
        ("BATCH[3]", "v1", 20),
        ("BATCH[2]", "v2", 30),
        ("DELETE", "v2", 40),
    ]

"""The scanner's bulk path: ``next_many`` returns what as many ``next`` calls
return, resuming from ``resume_options`` after it continues exactly, and the
local backend's verified blocks still catch corrupt records."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import ReadOptions
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.scanner import Scanner, open_backend_scanner

QUIET = WALOptions(timetick_interval_ms=3_600_000)
WAIT = 10.0

Op = tuple[str, str, int]
OPS = st.tuples(
    st.sampled_from(["plain", "plain", "begin", "body", "commit", "rollback", "ddl", "reopen"]),
    st.sampled_from(["a", "b", "c"]),
    st.integers(1, 4),
)
OPTIONS = st.builds(
    ReadOptions,
    vchannels=st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
    types=st.one_of(
        st.just([]),
        st.lists(
            st.sampled_from(
                [MessageType.INSERT, MessageType.DELETE, MessageType.BEGIN_TXN, MessageType.FENCE]
            ),
            min_size=1,
            max_size=3,
        ),
    ),
    timetick_gt=st.one_of(st.none(), st.just(0)),
)


async def write_log(backend: Backend, ops: list[Op]) -> None:
    """Plain appends, transactions, DDLs and handoffs (new terms) on pchannel ``p``."""
    term = 1
    wal = await WAL.open(backend, "p", term, tso=LocalTSO(), options=QUIET)
    txn: tuple[int, str] | None = None
    counter = 0
    for op, vchannel, n in ops:
        if op == "plain":
            counter += n
            kinds = [MessageType.INSERT, MessageType.DELETE]
            await wal.append_many(
                [Message(kinds[i % 2], vchannel, b"%d" % (counter + i)) for i in range(n)]
            )
        elif op == "begin" and txn is None:
            txn = ((await wal.append(Message(MessageType.BEGIN_TXN, vchannel))).txn_id, vchannel)
        elif op == "body" and txn is not None:
            await wal.append_many(
                [Message(MessageType.INSERT, txn[1], b"t%d" % i, txn_id=txn[0]) for i in range(n)]
            )
        elif op in ("commit", "rollback") and txn is not None:
            kind = MessageType.COMMIT_TXN if op == "commit" else MessageType.ROLLBACK_TXN
            await wal.append(Message(kind, txn[1], txn_id=txn[0]))
            txn = None
        elif op == "ddl":
            await wal.append(Message(MessageType.DROP_PARTITION, vchannel))
            if txn is not None and txn[1] == vchannel:
                txn = None
        elif op == "reopen":
            await wal.close()
            term += 1
            txn = None
            wal = await WAL.open(backend, "p", term, tso=LocalTSO(), options=QUIET)
    await wal.close()


async def read_one_by_one(scanner: Scanner) -> list[LogEntry]:
    out: list[LogEntry] = []
    while (entry := await scanner.next(timeout=0)) is not None:
        out.append(entry)
    return out


async def check_bulk_reads(
    backend: Backend, options: ReadOptions, sizes: list[int]
) -> list[LogEntry]:
    """Read with ``next_many`` in ``sizes``, then resume; what ``next`` reads, the log read."""
    reference = await open_backend_scanner(backend, "p", options, batch_size=5)
    full = await read_one_by_one(reference)
    await reference.close()

    bulk = await open_backend_scanner(backend, "p", options, batch_size=5)
    delivered: list[LogEntry] = []
    async with asyncio.timeout(WAIT):
        for size in sizes:
            got = await bulk.next_many(size, timeout=0)
            assert len(got) <= size
            assert got == full[len(delivered) : len(delivered) + len(got)]
            delivered += got
    resume = bulk.resume_options()
    await bulk.close()

    resumed_scanner = await open_backend_scanner(backend, "p", resume, batch_size=5)
    resumed = await read_one_by_one(resumed_scanner)
    await resumed_scanner.close()
    # A transaction returned in part is delivered again, in full.
    repeated = overlap(delivered, resumed)
    assert delivered + resumed[repeated:] == full
    return full


def overlap(delivered: list[LogEntry], resumed: list[LogEntry]) -> int:
    """How many entries a resumed scanner repeats: a transaction's part already returned."""
    for j in range(min(len(delivered), len(resumed)), 0, -1):
        if delivered[-j:] == resumed[:j] and all(e.message.txn_id for e in resumed[:j]):
            return j
    return 0


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    ops=st.lists(OPS, max_size=25),
    options=OPTIONS,
    sizes=st.lists(st.integers(1, 9), max_size=8),
)
def test_next_many_delivers_what_next_delivers_and_resumes_exactly(
    ops: list[Op], options: ReadOptions, sizes: list[int]
) -> None:
    async def run() -> None:
        backend = registry.create("memory")
        await write_log(backend, ops)
        await check_bulk_reads(backend, options, sizes)
        await backend.close()

    asyncio.run(run())


@pytest.mark.parametrize(
    "options",
    [
        ReadOptions(),
        ReadOptions(vchannels=["a"], types=[MessageType.INSERT, MessageType.BEGIN_TXN]),
        ReadOptions(types=[MessageType.DELETE], timetick_gt=0),
    ],
)
async def test_local_blocks_read_in_bulk_like_one_by_one(
    tmp_path: Path, options: ReadOptions
) -> None:
    backend = registry.create("local", root=str(tmp_path))
    ops: list[Op] = [
        ("plain", "a", 4),
        ("begin", "a", 1),
        ("body", "a", 3),
        ("plain", "b", 4),
        ("ddl", "b", 1),
        ("commit", "a", 1),
        ("begin", "b", 1),
        ("body", "b", 2),
        ("reopen", "a", 1),
        ("plain", "c", 4),
        ("begin", "c", 1),
        ("body", "c", 2),
        ("ddl", "c", 1),
        ("plain", "a", 3),
    ]
    await write_log(backend, ops)
    full = await check_bulk_reads(backend, options, [1, 2, 3, 5, 8, 1])
    assert len(full) >= 4
    assert await check_bulk_reads(backend, options, [100]) == full
    await backend.close()


async def test_local_reader_hands_out_verified_blocks(tmp_path: Path) -> None:
    backend = registry.create("local", root=str(tmp_path))
    await write_log(backend, [("plain", "a", 5)])
    reader = await backend.open_reader("p", StartPosition.earliest())
    block = await reader.next_block(timeout=WAIT)
    assert block.verified and len(block) == 7, "fence, five, final tick"
    await reader.close()
    await backend.close()


async def test_a_corrupt_record_stops_a_bulk_scan(tmp_path: Path) -> None:
    """Blocks skip the messages' own CRC; the frame CRC covers the same bytes."""
    backend = registry.create("local", root=str(tmp_path))
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await wal.append_many([Message(MessageType.INSERT, "a", b"payload-%d" % i) for i in range(5)])
    await wal.close()
    await backend.close()
    (path,) = sorted((tmp_path / "p").glob("*.seg"))
    data = bytearray(path.read_bytes())
    at = data.index(b"payload-3")
    data[at] ^= 0x01
    path.write_bytes(bytes(data))

    reopened = registry.create("local", root=str(tmp_path))
    scanner = await open_backend_scanner(reopened, "p", ReadOptions())
    got: list[LogEntry] = []
    with pytest.raises(errors.CorruptData, match="corrupt"):
        async with asyncio.timeout(WAIT):
            while True:
                got += await scanner.next_many(100)
    assert [e.message.payload for e in got] == [b"", b"payload-0", b"payload-1", b"payload-2"]
    await scanner.close()
    await reopened.close()


async def test_next_many_refuses_a_bad_size_and_a_closed_scanner() -> None:
    backend = registry.create("memory")
    await write_log(backend, [("plain", "a", 2)])
    scanner = await open_backend_scanner(backend, "p", ReadOptions())
    with pytest.raises(errors.InvalidArgument):
        await scanner.next_many(0)
    assert len(await scanner.next_many(10, timeout=WAIT)) == 4, "fence, two, final tick"
    assert await scanner.next_many(10, timeout=0.01) == []
    await scanner.close()
    with pytest.raises(errors.Closed):
        await scanner.next_many(10)
    await backend.close()

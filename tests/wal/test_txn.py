"""Transactions: commit, rollback, expiry, DDL abort, limits, and how readers see them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from headrace import errors
from headrace.message import codec
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import AppendResult, ReadOptions
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.delivery import Delivery
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.interceptors.txn import TxnInterceptor, TxnTable
from headrace.wal.memory import MemoryMessageID as MID
from headrace.wal.scanner import Scanner, open_backend_scanner

QUIET = WALOptions(timetick_interval_ms=3_600_000)
NO_TICKS = [t for t in MessageType if t is not MessageType.TIME_TICK and t is not MessageType.FENCE]


def begin(v: str = "v") -> Message:
    return Message(MessageType.BEGIN_TXN, v)


def body(txn: int, payload: bytes, v: str = "v") -> Message:
    return Message(MessageType.INSERT, v, payload, txn_id=txn)


def commit(txn: int, v: str = "v") -> Message:
    return Message(MessageType.COMMIT_TXN, v, txn_id=txn)


def rollback(txn: int, v: str = "v") -> Message:
    return Message(MessageType.ROLLBACK_TXN, v, txn_id=txn)


def plain(payload: bytes, v: str = "v") -> Message:
    return Message(MessageType.INSERT, v, payload)


async def collect(scanner: Scanner) -> list[LogEntry]:
    out = []
    while (entry := await scanner.next(timeout=0.05)) is not None:
        out.append(entry)
    return out


async def backend_log(backend: Backend) -> list[LogEntry]:
    reader = await backend.open_reader("p", StartPosition.earliest())
    out: list[LogEntry] = []
    while records := await reader.next_batch(1024, timeout=0):
        out += [LogEntry(r.id, codec.decode(r.data)) for r in records]
    await reader.close()
    return out


def kinds(entries: list[LogEntry]) -> list[tuple[str, bytes]]:
    return [(e.message.type.name, e.message.payload) for e in entries]


@pytest.fixture
async def wal() -> AsyncIterator[WAL]:
    opened = await WAL.open(registry.create("memory"), "p", 1, tso=LocalTSO(), options=QUIET)
    yield opened
    await opened.close()


async def test_committed_txn_is_delivered_together_at_its_commit(wal: WAL) -> None:
    scanner = wal.read(ReadOptions(types=NO_TICKS))
    b = await wal.append(begin())
    assert b.txn_id > 0
    await wal.append(body(b.txn_id, b"t1"))
    await wal.append(plain(b"outside"))
    await wal.append(body(b.txn_id, b"t2"))
    c = await wal.append(commit(b.txn_id))
    await wal.append(plain(b"after"))
    got = await collect(scanner)
    assert kinds(got) == [
        ("INSERT", b"outside"),
        ("BEGIN_TXN", b""),
        ("INSERT", b"t1"),
        ("INSERT", b"t2"),
        ("COMMIT_TXN", b""),
        ("INSERT", b"after"),
    ]
    assert all(e.message.txn_id == b.txn_id for e in got[1:5])
    assert got[4].id == c.id and c.txn_id == b.txn_id
    with pytest.raises(errors.TxnAborted):
        await wal.append(body(b.txn_id, b"late"))
    await scanner.close()
    await wal.close()


async def test_rolled_back_txn_is_never_delivered(wal: WAL) -> None:
    scanner = wal.read(ReadOptions(types=NO_TICKS))
    b = await wal.append(begin())
    await wal.append(body(b.txn_id, b"t1"))
    await wal.append(rollback(b.txn_id))
    await wal.append(plain(b"after"))
    assert kinds(await collect(scanner)) == [("INSERT", b"after")]
    with pytest.raises(errors.TxnAborted):
        await wal.append(commit(b.txn_id))
    await scanner.close()
    await wal.close()


async def test_idle_txn_expires_and_the_wal_logs_its_rollback() -> None:
    backend = registry.create("memory")
    options = WALOptions(timetick_interval_ms=5, txn_keepalive_s=0.02)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    scanner = wal.read(ReadOptions(types=NO_TICKS))
    b = await wal.append(begin())
    await wal.append(body(b.txn_id, b"t1"))
    for _ in range(400):
        if any(e.message.type is MessageType.ROLLBACK_TXN for e in await backend_log(backend)):
            break
        await asyncio.sleep(0.01)
    with pytest.raises(errors.TxnAborted):
        await wal.append(body(b.txn_id, b"t2"))
    with pytest.raises(errors.TxnAborted):
        await wal.append(commit(b.txn_id))
    rollbacks = [
        e for e in await backend_log(backend) if e.message.type is MessageType.ROLLBACK_TXN
    ]
    assert len(rollbacks) == 1 and rollbacks[0].message.txn_id == b.txn_id
    assert rollbacks[0].message.properties["reason"] == "expired"
    await wal.append(plain(b"after"))
    assert kinds(await collect(scanner)) == [("INSERT", b"after")]
    assert wal.stats()["open_txns"] == 0
    await scanner.close()
    await wal.close()


async def test_ddl_on_the_vchannel_aborts_its_open_txns(wal: WAL) -> None:
    scanner = wal.read(ReadOptions(types=NO_TICKS))
    on_v = await wal.append(begin("v"))
    on_w = await wal.append(begin("w"))
    await wal.append(body(on_v.txn_id, b"v1", "v"))
    await wal.append(body(on_w.txn_id, b"w1", "w"))
    await wal.append(Message(MessageType.DROP_COLLECTION, "v"))
    with pytest.raises(errors.TxnAborted):
        await wal.append(body(on_v.txn_id, b"v2", "v"))
    with pytest.raises(errors.TxnAborted):
        await wal.append(commit(on_v.txn_id, "v"))
    await wal.append(commit(on_w.txn_id, "w"))
    assert kinds(await collect(scanner)) == [
        ("DROP_COLLECTION", b""),
        ("BEGIN_TXN", b""),
        ("INSERT", b"w1"),
        ("COMMIT_TXN", b""),
    ]
    await scanner.close()
    await wal.close()


async def test_txn_rules_refuse_bad_messages(wal: WAL) -> None:
    b = await wal.append(begin("v"))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(body(b.txn_id, b"x", "w"))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(Message(MessageType.BEGIN_TXN, "v", txn_id=5))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(Message(MessageType.COMMIT_TXN, "v"))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(Message(MessageType.CREATE_PARTITION, "v", txn_id=b.txn_id))
    with pytest.raises(errors.TxnAborted):
        await wal.append(body(b.txn_id + 1000, b"x"))
    other = await wal.append(begin("v"))
    assert other.txn_id > b.txn_id
    await wal.close()


async def test_a_txn_larger_than_the_limit_is_refused() -> None:
    options = WALOptions(timetick_interval_ms=3_600_000, max_txn_bytes=400)
    wal = await WAL.open(registry.create("memory"), "p", 1, tso=LocalTSO(), options=options)
    b = await wal.append(begin())
    await wal.append(body(b.txn_id, b"x" * 100))
    with pytest.raises(errors.InvalidArgument, match="exceed"):
        await wal.append(body(b.txn_id, b"x" * 300))
    await wal.append(body(b.txn_id, b"y" * 10))
    await wal.append(commit(b.txn_id))
    await wal.close()


async def test_too_many_open_txns_is_retryable() -> None:
    options = WALOptions(timetick_interval_ms=3_600_000, max_open_txns=2)
    wal = await WAL.open(registry.create("memory"), "p", 1, tso=LocalTSO(), options=options)
    results = await wal.append_many([begin(), begin(), begin()])
    assert isinstance(results[0], AppendResult) and isinstance(results[1], AppendResult)
    assert isinstance(results[2], errors.Unavailable) and results[2].retryable
    await wal.close()


async def test_txns_die_when_the_wal_drains_and_with_the_term() -> None:
    backend = registry.create("memory")
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    b = await wal.append(begin())
    await wal.append(body(b.txn_id, b"t1"))
    await wal.close()
    log = await backend_log(backend)
    assert log[-1].message.type is MessageType.TIME_TICK
    assert log[-2].message.type is MessageType.ROLLBACK_TXN and log[-2].message.txn_id == b.txn_id
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    with pytest.raises(errors.TxnAborted):
        await wal2.append(commit(b.txn_id))
    scanner = wal2.read(ReadOptions(types=NO_TICKS))
    assert kinds(await collect(scanner)) == []
    await scanner.close()
    await wal2.close()


async def test_a_crashed_owners_open_txn_is_dropped_at_the_next_fence() -> None:
    backend = registry.create("memory")
    crashed = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    b = await crashed.append(begin())
    await crashed.append(body(b.txn_id, b"lost"))
    successor = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    await successor.append(plain(b"new"))
    scanner = await open_backend_scanner(backend, "p", ReadOptions(types=NO_TICKS))
    assert kinds(await collect(scanner)) == [("INSERT", b"new")]
    await scanner.close()
    await crashed.close()
    await successor.close()


def test_delivery_filters_apply_to_a_txn_as_a_whole() -> None:
    def e(seq: int, kind: MessageType, tt: int, txn: int = 7, v: str = "v") -> LogEntry:
        return LogEntry(MID(seq), Message(kind, v, timetick=tt, term=1, txn_id=txn))

    log = [
        e(1, MessageType.BEGIN_TXN, 10),
        e(2, MessageType.INSERT, 11),
        e(3, MessageType.DELETE, 12),
        e(4, MessageType.COMMIT_TXN, 20),
    ]

    def run(options: ReadOptions) -> list[int]:
        delivery = Delivery(options)
        out: list[LogEntry] = []
        for entry in log:
            delivery.feed(entry, out)
        return [x.id.sort_key()[0] for x in out]

    assert run(ReadOptions()) == [1, 2, 3, 4]
    assert run(ReadOptions(timetick_gt=15)) == [1, 2, 3, 4], "judged by the commit's timetick"
    assert run(ReadOptions(timetick_ge=21)) == []
    assert run(ReadOptions(types=[MessageType.DELETE])) == [3]
    assert run(ReadOptions(vchannels=["w"])) == []
    mid_txn = Delivery(ReadOptions())
    out: list[LogEntry] = []
    for entry in log[1:]:
        mid_txn.feed(entry, out)
    assert out == [], "a reader that starts inside a txn drops it"
    small = Delivery(ReadOptions(), max_txn_bytes=60)
    small.feed(log[0], out)
    with pytest.raises(errors.InvalidArgument):
        small.feed(log[1], out)


async def test_resume_options_keep_a_txn_open_at_the_resume_point(wal: WAL) -> None:
    first = wal.read(ReadOptions(types=NO_TICKS))
    b = await wal.append(begin())
    await wal.append(body(b.txn_id, b"t1"))
    await wal.append(plain(b"outside"))
    entry = await first.next(timeout=10)
    assert entry is not None and entry.message.payload == b"outside"
    resume = first.resume_options()
    await first.close()
    assert resume.start_id == b.id, "restarts at the open transaction's BEGIN_TXN"
    await wal.append(commit(b.txn_id))
    await wal.append(plain(b"after"))
    second = wal.read(resume)
    assert kinds(await collect(second)) == [
        ("BEGIN_TXN", b""),
        ("INSERT", b"t1"),
        ("COMMIT_TXN", b""),
        ("INSERT", b"after"),
    ]
    await second.close()


async def test_a_begin_refused_for_size_opens_nothing() -> None:
    options = WALOptions(timetick_interval_ms=3_600_000, max_message_bytes=64)
    wal = await WAL.open(registry.create("memory"), "p", 1, tso=LocalTSO(), options=options)
    fits_only_without_its_id = Message(MessageType.BEGIN_TXN, "v" * 25)
    with pytest.raises(errors.MessageTooLarge):
        await wal.append(fits_only_without_its_id)
    assert wal.stats()["open_txns"] == 0
    await wal.close()


async def test_an_unacknowledged_begin_is_rolled_back_in_the_log() -> None:
    table = TxnTable(keepalive_s=60, max_txn_bytes=1000, max_open=10)
    interceptor = TxnInterceptor(table, LocalTSO(), 1 << 20, clock=lambda: 0.0)

    async def failing_write(batch: list[AppendContext]) -> None:
        for ctx in batch:
            ctx.fail(errors.StorageFull("disk full"))

    ctx = AppendContext(begin(), 40)
    await interceptor([ctx], failing_write)
    assert isinstance(ctx.error, errors.StorageFull) and len(table) == 0
    rollbacks = interceptor.abandoned()
    assert [(m.type, m.txn_id) for m in rollbacks] == [
        (MessageType.ROLLBACK_TXN, ctx.message.txn_id)
    ]
    assert interceptor.abandoned() == []

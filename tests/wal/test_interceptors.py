"""The interceptor chain, vchannel locks, dedup (also across a handoff), stamping."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import AppendResult
from headrace.wal.contract import Backend, BackendWriter, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.chain import AppendContext, Handler, build_chain
from headrace.wal.interceptors.dedup import DedupInterceptor, DedupWindow, producer_key
from headrace.wal.interceptors.lock import RWLock, lock_plan
from headrace.wal.memory import MemoryMessageID as MID
from tests.wal.delegating import DelegatingBackend

QUIET = WALOptions(timetick_interval_ms=3_600_000)


def ctx(
    kind: MessageType = MessageType.INSERT, v: str = "v", payload: bytes = b""
) -> AppendContext:
    msg = Message(kind, v, payload)
    return AppendContext(msg, codec.encoded_size(msg))


def produced(payload: bytes, producer: str, seq: int, v: str = "v") -> Message:
    return Message(
        MessageType.INSERT, v, payload, {"producer_id": producer, "producer_seq": str(seq)}
    )


async def backend_log(backend: Backend) -> list[LogEntry]:
    reader = await backend.open_reader("p", StartPosition.earliest())
    out: list[LogEntry] = []
    while records := await reader.next_batch(1024, timeout=0):
        out += [LogEntry(r.id, codec.decode(r.data)) for r in records]
    await reader.close()
    return out


class Recorder:
    def __init__(self, name: str, calls: list[str], settle_first: bool = False) -> None:
        self.name = name
        self.calls = calls
        self.settle_first = settle_first

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        self.calls.append(f"{self.name}:{len(batch)}")
        if self.settle_first:
            batch[0].fail(errors.InvalidArgument("refused by " + self.name))
        await call_next([c for c in batch if not c.settled])
        self.calls.append(f"/{self.name}")


async def test_chain_runs_outermost_first() -> None:
    calls: list[str] = []

    async def innermost(batch: list[AppendContext]) -> None:
        calls.append(f"write:{len(batch)}")
        for c in batch:
            c.result = AppendResult(MID(0), 1, 1)

    chain = build_chain(
        [
            Recorder("lock", calls),
            Recorder("dedup", calls, settle_first=True),
            Recorder("txn", calls),
        ],
        innermost,
    )
    batch = [ctx(), ctx(), ctx()]
    await chain(batch)
    assert calls == ["lock:3", "dedup:3", "txn:2", "write:2", "/txn", "/dedup", "/lock"]
    assert isinstance(batch[0].error, errors.InvalidArgument) and batch[0].result is None
    assert all(c.result is not None for c in batch[1:])


def test_lock_plan_is_sorted_and_exclusive_for_ddl() -> None:
    batch = [
        ctx(v="b"),
        ctx(MessageType.CREATE_PARTITION, v="c"),
        ctx(v="a"),
        ctx(v="c"),
        ctx(MessageType.DROP_COLLECTION, v="b"),
    ]
    assert lock_plan(batch) == [("a", False), ("b", True), ("c", True)]


async def test_rwlock_shares_readers_and_queues_writers_fairly() -> None:
    lock = RWLock()
    order: list[str] = []
    await lock.acquire(False)
    await lock.acquire(False)

    async def take(name: str, exclusive: bool) -> None:
        await lock.acquire(exclusive)
        order.append(name)

    writer = asyncio.create_task(take("writer", True))
    late_reader = asyncio.create_task(take("late-reader", False))
    await asyncio.sleep(0)
    assert order == [], "a writer waits for readers; a later reader queues behind it"
    lock.release(False)
    lock.release(False)
    await asyncio.wait_for(writer, 5)
    await asyncio.sleep(0)
    assert order == ["writer"]
    lock.release(True)
    await asyncio.wait_for(late_reader, 5)
    assert order == ["writer", "late-reader"]
    lock.release(False)
    assert lock.idle


async def test_rwlock_cancelled_waiter_does_not_block_others() -> None:
    lock = RWLock()
    await lock.acquire(True)
    waiting = asyncio.create_task(lock.acquire(False))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    lock.release(True)
    await asyncio.wait_for(lock.acquire(True), 5)
    lock.release(True)
    assert lock.idle


class GateWriter(BackendWriter):
    def __init__(self, inner: BackendWriter) -> None:
        self.pchannel, self.term, self.inner = inner.pchannel, inner.term, inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[bytes]] = []

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        await self.gate.wait()
        self.batches.append(list(records))
        return await self.inner.append(records)

    async def close(self) -> None:
        await self.inner.close()


class GateBackend(DelegatingBackend):
    def __init__(self) -> None:
        super().__init__()
        self.writer: GateWriter | None = None

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        self.writer = GateWriter(await self.inner.open_writer(pchannel, term))
        return self.writer


async def test_ddl_waits_for_in_flight_appends_on_its_vchannel_only() -> None:
    backend = GateBackend()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    assert backend.writer is not None
    backend.writer.gate.clear()
    data = asyncio.create_task(wal.append(Message(MessageType.INSERT, "v", b"d")))
    await asyncio.sleep(0.01)
    ddl = asyncio.create_task(wal.append(Message(MessageType.DROP_COLLECTION, "v")))
    other = asyncio.create_task(wal.append(Message(MessageType.INSERT, "w", b"w")))
    await asyncio.sleep(0.01)
    backend.writer.gate.set()
    await asyncio.wait_for(asyncio.gather(data, ddl, other), 10)
    batches = [[codec.decode(r).type for r in b] for b in backend.writer.batches]
    flat = [t for b in batches for t in b]
    assert flat.index(MessageType.DROP_COLLECTION) > flat.index(MessageType.INSERT)
    assert [MessageType.DROP_COLLECTION] in batches, "the DDL was not batched with the data on v"
    await wal.close()


def test_producer_key_parsing() -> None:
    assert producer_key({}) is None
    assert producer_key({"other": "x"}) is None
    assert producer_key({"producer_id": "p", "producer_seq": "7"}) == ("p", 7)
    for bad in (
        {"producer_id": "p"},
        {"producer_seq": "1"},
        {"producer_id": "p", "producer_seq": "x"},
    ):
        with pytest.raises(errors.InvalidArgument):
            producer_key(bad)


def test_dedup_window_is_bounded_oldest_first() -> None:
    window = DedupWindow(2)
    for i in range(3):
        window.remember(("p", i), AppendResult(MID(i), i, 1))
    assert window.get(("p", 0)) is None
    assert window.get(("p", 2)) == AppendResult(MID(2), 2, 1)
    assert window.oldest_id() == MID(1) and len(window) == 2


def test_dedup_window_remembers_many_in_order_and_stays_bounded() -> None:
    window = DedupWindow(3)
    window.remember_many([(("p", i), AppendResult(MID(i), i, 1)) for i in range(5)])
    assert [window.get(("p", i)) is not None for i in range(5)] == [False, False, True, True, True]
    assert window.oldest_id() == MID(2) and len(window) == 3
    DedupWindow(0).remember_many([(("p", 1), AppendResult(MID(1), 1, 1))])


def dedup_ctx(producer: str, seq: int) -> AppendContext:
    msg = produced(b"x", producer, seq)
    return AppendContext(msg, codec.encoded_size(msg))


@pytest.mark.parametrize("succeeds", [True, False])
async def test_a_repeat_waits_for_the_write_in_flight_and_shares_its_outcome(
    succeeds: bool,
) -> None:
    interceptor = DedupInterceptor(DedupWindow(16))
    gate = asyncio.Event()
    written: list[list[int]] = []

    async def write(batch: list[AppendContext]) -> None:
        written.append([int(c.message.properties["producer_seq"]) for c in batch])
        await gate.wait()
        for i, c in enumerate(batch):
            if succeeds:
                c.result = AppendResult(MID(i), 10 + i, 1)
            else:
                c.fail(errors.Unavailable("disk went away"))

    first = [dedup_ctx("p", 1), dedup_ctx("p", 2)]
    repeat = [dedup_ctx("p", 2), dedup_ctx("p", 3)]
    writing = asyncio.create_task(interceptor(first, write))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(interceptor(repeat, write))
    await asyncio.sleep(0)
    gate.set()
    await asyncio.wait_for(asyncio.gather(writing, waiting), 10)
    assert written == [[1, 2], [3]], "the repeat of seq 2 was written a second time"
    if succeeds:
        assert repeat[0].result == first[1].result == AppendResult(MID(1), 11, 1)
        assert interceptor.window.get(("p", 2)) == first[1].result
    else:
        assert repeat[0].result is None and isinstance(repeat[0].error, errors.Unavailable)
        assert repeat[0].error.retryable
        assert interceptor.window.get(("p", 2)) is None


async def test_a_repeat_returns_the_original_result_without_writing() -> None:
    backend = registry.create("memory")
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    first = await wal.append(produced(b"a", "prod", 1))
    again = await wal.append(produced(b"a", "prod", 1))
    assert again == first
    together = await wal.append_many(
        [produced(b"b", "prod", 2), produced(b"b", "prod", 2), produced(b"c", "other", 2)]
    )
    assert together[0] == together[1] and together[0] != together[2]
    concurrent = await asyncio.gather(*(wal.append(produced(b"d", "prod", 3)) for _ in range(5)))
    assert len(set(concurrent)) == 1
    payloads = [e.message.payload for e in await backend_log(backend) if e.message.payload]
    assert payloads == [b"a", b"b", b"c", b"d"]
    await wal.close()


@pytest.mark.parametrize("kind", ["memory", "local"])
@pytest.mark.parametrize("graceful", [True, False])
async def test_dedup_holds_across_a_handoff(graceful: bool, kind: str, tmp_path: Path) -> None:
    backend = (
        registry.create("local", root=str(tmp_path))
        if kind == "local"
        else (registry.create("memory"))
    )
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    original = await wal1.append(produced(b"x", "prod", 1))
    for i in range(20):
        await wal1.append(Message(MessageType.INSERT, "v", b"filler%d" % i))
    if graceful:
        await wal1.close()
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    retried = await wal2.append(produced(b"x", "prod", 1))
    assert retried == original
    fresh = await wal2.append(produced(b"y", "prod", 2))
    assert fresh.term == 2
    copies = [e for e in await backend_log(backend) if e.message.payload == b"x"]
    assert len(copies) == 1
    await wal1.close()
    await wal2.close()
    await backend.close()


async def test_dedup_rebuild_reads_only_the_window_after_a_graceful_handoff() -> None:
    backend = registry.create("memory")
    options = WALOptions(timetick_interval_ms=3_600_000, dedup_window=2)
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    old = await wal1.append(produced(b"old", "prod", 1))
    kept = [await wal1.append(produced(b"k%d" % i, "prod", 2 + i)) for i in range(2)]
    await wal1.close()
    hint = (await backend_log(backend))[-1].message.properties["dedup_from"]
    assert hint == str(kept[0].id)
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=options)
    assert await wal2.append(produced(b"k1", "prod", 3)) == kept[1]
    forgotten = await wal2.append(produced(b"old", "prod", 1))
    assert forgotten != old, "pairs older than the window are not remembered"
    await wal2.close()

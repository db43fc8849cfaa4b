"""The framework WAL: append path, timeticks, fencing, drain, errors, and the benchmark."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from headrace import errors
from headrace.bench.wal import bench_wal
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.tso import LocalTSO, TimestampAllocator
from headrace.wal import registry
from headrace.wal.api import AppendResult, ReadOptions, WALState
from headrace.wal.contract import Backend, BackendWriter, StartPosition
from headrace.wal.framework import WAL, WALOptions
from tests.wal.delegating import DelegatingBackend

QUIET = WALOptions(timetick_interval_ms=3_600_000)
"""No sync ticks during a test (the first comes after an hour)."""


def insert(vchannel: str = "v1", payload: bytes = b"x", **props: str) -> Message:
    return Message(MessageType.INSERT, vchannel, payload, props)


async def backend_log(backend: Backend, pchannel: str = "p") -> list[LogEntry]:
    """Every record of the backend, decoded (reads the backend directly)."""
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    out: list[LogEntry] = []
    try:
        while records := await reader.next_batch(1024, timeout=0):
            out += [LogEntry(r.id, codec.decode(r.data)) for r in records]
    finally:
        await reader.close()
    return out


class StubTSO(TimestampAllocator):
    """A TSO that starts low and counts up: lower than any real timestamp."""

    def __init__(self, start: int = 1) -> None:
        self.next = start

    async def allocate(self, count: int = 1) -> int:
        first = self.next
        self.next += count
        return first


class HookedWriter(BackendWriter):
    """Delegates to a real writer; a test can hold appends or make them fail."""

    def __init__(self, inner: BackendWriter) -> None:
        self.pchannel = inner.pchannel
        self.term = inner.term
        self.inner = inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.entered = asyncio.Event()
        self.fail_before: errors.HeadraceError | None = None
        self.fail_after: errors.HeadraceError | None = None

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        self.entered.set()
        await self.gate.wait()
        if self.fail_before is not None:
            error, self.fail_before = self.fail_before, None
            raise error
        ids = await self.inner.append(records)
        if self.fail_after is not None:
            error, self.fail_after = self.fail_after, None
            raise error
        return ids

    async def close(self) -> None:
        await self.inner.close()


class HookedBackend(DelegatingBackend):
    """The memory backend with hookable writers."""

    def __init__(self) -> None:
        super().__init__()
        self.writers: list[HookedWriter] = []

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        writer = HookedWriter(await self.inner.open_writer(pchannel, term))
        self.writers.append(writer)
        return writer


@pytest.fixture(params=["memory", "local"])
async def backend(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Backend]:
    """The memory backend, and the local one on a temporary directory."""
    created = (
        registry.create(request.param, root=str(tmp_path))
        if request.param == "local"
        else (registry.create("memory"))
    )
    yield created
    await created.close()


async def test_concurrent_producers_keep_order_and_increasing_timeticks(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=WALOptions(max_batch_messages=16))

    async def producer(name: str, n: int) -> list[AppendResult]:
        results = []
        for i in range(0, n, 5):
            if i % 10 == 0:
                batch = [insert(name, f"{name}:{j}".encode()) for j in range(i, i + 5)]
                for r in await wal.append_many(batch):
                    assert isinstance(r, AppendResult)
                    results.append(r)
            else:
                for j in range(i, i + 5):
                    results.append(await wal.append(insert(name, f"{name}:{j}".encode())))
        return results

    names = [f"v{k}" for k in range(8)]
    all_results = await asyncio.gather(*(producer(n, 40) for n in names))
    await wal.close()

    log = await backend_log(backend)
    ticks = [e.message.timetick for e in log]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)
    by_id = {e.id: e.message for e in log}
    for name, results in zip(names, all_results, strict=True):
        ids = [r.id for r in results]
        assert ids == sorted(ids), "a producer's appends are logged in its order"
        payloads = [by_id[r.id].payload for r in results]
        assert payloads == [f"{name}:{j}".encode() for j in range(40)]
        for r in results:
            assert by_id[r.id].timetick == r.timetick and by_id[r.id].term == 1
    assert sum(1 for e in log if e.message.type is MessageType.INSERT) == 8 * 40


async def test_fence_is_first_and_above_previous_owner(backend: Backend) -> None:
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await wal1.append(insert())
    await wal1.close()
    before = await backend_log(backend)
    wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    log = await backend_log(backend)
    assert log[0].message.type is MessageType.FENCE and log[0].message.term == 1
    fence = log[len(before)]
    assert fence.message.type is MessageType.FENCE
    assert fence.message.term == 2 and fence.message.vchannel == ""
    assert fence.message.timetick > max(e.message.timetick for e in before)
    assert wal2.last_id == fence.id and wal2.last_timetick == fence.message.timetick
    await wal2.close()


async def test_timeticks_never_go_backwards_with_a_backwards_tso(backend: Backend) -> None:
    wal1 = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    first = await wal1.append(insert())
    await wal1.close()
    low = StubTSO(start=5)
    wal2 = await WAL.open(backend, "p", 2, tso=low, options=QUIET)
    results = [await wal2.append(insert()) for _ in range(3)]
    assert low.next < first.timetick, "the stub really is below the earlier timeticks"
    await wal2.close()
    ticks = [e.message.timetick for e in await backend_log(backend)]
    assert ticks == sorted(ticks) and len(set(ticks)) == len(ticks)
    assert results[0].timetick > first.timetick


async def test_sync_ticks_reach_tail_readers_but_not_the_backend(backend: Backend) -> None:
    wal = await WAL.open(
        backend, "p", 1, tso=LocalTSO(), options=WALOptions(timetick_interval_ms=2)
    )
    scanner = wal.read(ReadOptions())
    data = await wal.append(insert())
    ticks: list[LogEntry] = []
    while len(ticks) < 5:
        entry = await scanner.next(timeout=10)
        assert entry is not None
        if entry.message.type is MessageType.TIME_TICK and entry.message.timetick > data.timetick:
            ticks.append(entry)
    assert scanner.mode == "tail"
    log = await backend_log(backend)
    persisted = [e for e in log if e.message.timetick > data.timetick]
    assert len(persisted) <= 1, "only the first tick after the data is persisted"
    assert all(t.id == log[-1].id for t in ticks[1:]), "idle ticks carry the last persisted id"
    stamps = [t.message.timetick for t in ticks]
    assert stamps == sorted(stamps)
    await scanner.close()
    await wal.close()


async def test_invalid_and_oversized_messages_write_nothing(backend: Backend) -> None:
    options = WALOptions(max_message_bytes=512, timetick_interval_ms=3_600_000)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    before = len(await backend_log(backend))
    with pytest.raises(errors.MessageTooLarge):
        await wal.append(insert(payload=b"x" * 600))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(Message(MessageType.TIME_TICK))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(Message(MessageType.FENCE, "v1"))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(insert(vchannel=""))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(insert(vchannel="bad name!"))
    with pytest.raises(errors.InvalidArgument):
        await wal.append(insert(producer_id="p1", producer_seq="one"))
    assert len(await backend_log(backend)) == before

    mixed = [
        insert(payload=b"ok1"),
        insert(payload=b"x" * 600),
        insert(vchannel=""),
        insert(payload=b"ok2"),
    ]
    results = await wal.append_many(mixed)
    assert isinstance(results[0], AppendResult) and isinstance(results[3], AppendResult)
    assert isinstance(results[1], errors.MessageTooLarge)
    assert isinstance(results[2], errors.InvalidArgument)
    log = await backend_log(backend)
    assert [e.message.payload for e in log[before:]] == [b"ok1", b"ok2"]
    await wal.close()


async def test_drain_refuses_new_appends_and_finishes_in_flight() -> None:
    backend = HookedBackend()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    writer = backend.writers[0]
    writer.gate.clear()
    writer.entered.clear()
    in_flight = [asyncio.create_task(wal.append(insert(payload=b"%d" % i))) for i in range(5)]
    await asyncio.wait_for(writer.entered.wait(), 10)
    drain = asyncio.create_task(wal.drain())
    await asyncio.sleep(0)
    assert wal.state is WALState.DRAINING
    with pytest.raises(errors.NotOwner):
        await wal.append(insert())
    writer.gate.set()
    await asyncio.wait_for(drain, 10)
    results = [await t for t in in_flight]
    assert all(isinstance(r, AppendResult) for r in results)
    log = await backend_log(backend)
    assert log[-1].message.type is MessageType.TIME_TICK
    assert [e.message.payload for e in log if e.message.type is MessageType.INSERT] == [
        b"%d" % i for i in range(5)
    ]
    with pytest.raises(errors.NotOwner):
        await wal.append(insert())
    await wal.close()
    await wal.close()
    assert wal.state is WALState.CLOSED
    with pytest.raises(errors.NotOwner):
        await wal.append(insert())


async def test_stale_writer_cannot_append_after_newer_term_opened(backend: Backend) -> None:
    old = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await old.append(insert(payload=b"old"))
    new = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    with pytest.raises(errors.Fenced):
        await old.append(insert(payload=b"stale"))
    assert old.state is WALState.UNAVAILABLE
    with pytest.raises(errors.Fenced):
        await old.append(insert(payload=b"stale again"))
    results = await old.append_many([insert(payload=b"a"), insert(payload=b"b")])
    assert all(isinstance(r, errors.Fenced) for r in results)
    await new.append(insert(payload=b"new"))
    payloads = [e.message.payload for e in await backend_log(backend) if e.message.payload]
    assert payloads == [b"old", b"new"]
    await old.close()
    await new.close()
    with pytest.raises(errors.Fenced):
        await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)


async def test_pending_appends_fail_fenced_when_the_backend_fences() -> None:
    backend = HookedBackend()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    writer = backend.writers[0]
    writer.gate.clear()
    writer.entered.clear()
    first = asyncio.create_task(wal.append(insert()))
    await asyncio.wait_for(writer.entered.wait(), 10)
    queued = asyncio.create_task(wal.append(insert()))
    await asyncio.sleep(0)
    writer.fail_before = errors.Fenced("newer term", term=1, current_term=2)
    writer.gate.set()
    for task in (first, queued):
        with pytest.raises(errors.Fenced):
            await task
    assert wal.state is WALState.UNAVAILABLE
    await wal.close()


async def test_backend_errors_pass_through_and_the_wal_recovers() -> None:
    backend = HookedBackend()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    scanner = wal.read(ReadOptions(types=[MessageType.INSERT]))
    writer = backend.writers[0]
    writer.fail_before = errors.StorageFull("disk full")
    with pytest.raises(errors.StorageFull):
        await wal.append(insert(payload=b"refused"))
    assert wal.state is WALState.SERVING
    ok = await wal.append(insert(payload=b"a"))
    writer.fail_after = errors.Unavailable("lost the ack")
    with pytest.raises(errors.Unavailable):
        await wal.append(insert(payload=b"written-unacked"))
    later = await wal.append(insert(payload=b"b"))
    assert later.timetick > ok.timetick and later.id > ok.id
    seen = []
    for _ in range(3):
        entry = await scanner.next(timeout=10)
        assert entry is not None
        seen.append(entry.message.payload)
    assert seen == [b"a", b"written-unacked", b"b"], "readers see the log as the backend holds it"
    await scanner.close()
    await wal.close()


async def test_stats_and_properties(backend: Backend) -> None:
    wal = await WAL.open(backend, "p", 3, tso=LocalTSO(), options=QUIET)
    result = await wal.append(insert())
    stats = wal.stats()
    assert stats["last_id"] == str(result.id)
    assert stats["last_timetick"] == result.timetick == wal.last_timetick
    assert stats["term"] == 3 and stats["state"] == "SERVING"
    assert stats["appended_total"] == 2
    assert stats["buffer_entries"] == 2 and isinstance(stats["buffer_bytes"], int)
    assert wal.pchannel == "p" and wal.term == 3
    await wal.close()
    assert wal.stats()["state"] == "CLOSED"


async def test_local_backend_round_trip_across_terms(tmp_path: object) -> None:
    backend = registry.create("local", root=tmp_path)
    try:
        wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
        first = await wal.append_many([insert(payload=b"%d" % i) for i in range(10)])
        await wal.close()
        wal2 = await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
        again = await wal2.append(insert(payload=b"after"))
        scanner = wal2.read(ReadOptions(types=[MessageType.INSERT]))
        got = [await scanner.next(timeout=10) for _ in range(11)]
        assert [e.message.payload for e in got if e] == [b"%d" % i for i in range(10)] + [b"after"]
        assert got[-1] is not None and got[-1].id == again.id
        assert all(isinstance(r, AppendResult) for r in first)
        await scanner.close()
        await wal2.close()
    finally:
        await backend.close()


@pytest.mark.parametrize(
    "bad",
    [
        {"max_message_bytes": 10},
        {"timetick_interval_ms": 0},
        {"buffer_bytes": 0},
        {"max_batch_messages": 0},
        {"txn_keepalive_s": -1},
        {"dedup_window": -1},
        {"read_batch": 1.5},
        {"max_open_txns": True},
    ],
)
def test_bad_options_are_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(errors.InvalidArgument):
        WALOptions(**bad)


@pytest.mark.parametrize("version", [0, 3])
def test_a_message_format_this_release_cannot_write_is_refused(version: int) -> None:
    with pytest.raises(
        errors.InvalidArgument,
        match=rf"message_format: the cluster writes message format {version}, which this "
        r"release cannot write \(reads \{1, 2\}, writes \{1, 2\}\)",
    ):
        WALOptions(message_format=version)


async def test_open_fails_cleanly_when_fenced_before_the_fence_is_written() -> None:
    backend = HookedBackend()
    first = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=QUIET)
    await first.close()
    original_open = backend.open_writer

    async def open_then_lose(pchannel: str, term: int) -> BackendWriter:
        writer = await original_open(pchannel, term)
        assert isinstance(writer, HookedWriter)
        writer.fail_before = errors.Fenced("a newer owner took over", term=term, current_term=9)
        return writer

    backend.open_writer = open_then_lose  # type: ignore[method-assign]
    with pytest.raises(errors.Fenced):
        await WAL.open(backend, "p", 2, tso=LocalTSO(), options=QUIET)
    payloads = [e.message.type for e in await backend_log(backend)]
    assert payloads.count(MessageType.FENCE) == 1, "nothing of term 2 was written"


@pytest.mark.parametrize("kind", ["memory", "local"])
async def test_the_wal_benchmark_runs_end_to_end(kind: str, tmp_path: Path) -> None:
    result = await bench_wal(kind, 256, 100, 32, tmp_path, producers=2, rounds=1)
    for key in (
        "msgs_per_s",
        "baseline_msgs_per_s",
        "ratio",
        "p50_ms",
        "p99_ms",
        "scan_msgs_per_s",
        "ratio_backend",
    ):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["p99_ms"] >= result["p50_ms"]
    assert len(result["rounds"]) == 1
    (only,) = result["rounds"]
    assert abs(result["ratio_backend"] - only["backend"] / only["baseline"]) < 0.01
    assert result["ratio_backend"] == only["ratio_backend"]
    assert only["baseline_offloop"] > 0
    assert abs(result["ratio_offloop"] - only["baseline_offloop"] / only["baseline"]) < 0.01
    assert sorted(os.listdir(tmp_path)) == [], "the benchmark cleans up after itself"

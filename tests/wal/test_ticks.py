"""Periodic work of WALs: one timer loop per node, nothing for an idle pchannel.

An idle WAL (nothing persisted since its last tick, no tail reader waiting,
no chore pending) must cost nothing: it is not woken at all. A WAL that
needs a tick (data persisted, a reader waiting) or a chore (a transaction's
keepalive, a growing segment's lifetime) gets it on time.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from headrace import errors
from headrace.cluster import Keys
from headrace.message.types import LogEntry, Message, MessageType
from headrace.metastore.sqlite import SqliteMetastore
from headrace.tso import LocalTSO, MetastoreTSO
from headrace.wal.api import DeliverPolicy, ReadOptions
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.segments import SegmentPolicy
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.ticks import (
    BUFFER_ONLY,
    CHORE,
    PERSIST_AT_REST,
    RIDE_WITH_DATA,
    TICK_AFTER_DATA,
    TICK_FOR_READER,
    Client,
    Due,
    Needs,
    TickScheduler,
    next_due,
    tick_kind,
)
from tests.node.harness import until
from tests.wal.test_appender import TracingBackend
from tests.wal.test_framework import backend_log
from tests.wal.test_segments import ORDERS, Bed, insert

FAST = WALOptions(timetick_interval_ms=2)
WAIT = 10.0


def data(vchannel: str = "v") -> Message:
    return Message(MessageType.INSERT, vchannel, b"x")


def test_next_due_says_why_and_never_sooner_than_the_interval() -> None:
    idle = Needs(unticked=False, reader_waiting=False, chore_s=None)
    assert next_due(idle, 0.01) is None
    assert next_due(Needs(True, False, None), 0.01) == Due(0.01, TICK_AFTER_DATA)
    assert next_due(Needs(False, True, None), 0.01) == Due(0.01, TICK_FOR_READER)
    assert next_due(Needs(False, False, 0.0), 0.01) == Due(0.01, CHORE)
    assert next_due(Needs(False, False, 5.0), 0.01) == Due(5.0, CHORE)
    assert next_due(Needs(True, False, 5.0), 0.01) == Due(0.01, TICK_AFTER_DATA)


def test_tick_kind_rides_with_data_only_while_it_flows() -> None:
    assert tick_kind(Needs(True, False, None, flowing=True)) == RIDE_WITH_DATA
    assert tick_kind(Needs(True, True, None, flowing=True)) == RIDE_WITH_DATA
    assert tick_kind(Needs(True, False, None, flowing=False)) == PERSIST_AT_REST
    assert tick_kind(Needs(False, True, None, flowing=True)) == BUFFER_ONLY
    assert tick_kind(Needs(False, False, 0.0, flowing=True)) is None
    assert RIDE_WITH_DATA.rides and not PERSIST_AT_REST.rides and not BUFFER_ONLY.rides


async def test_an_idle_wal_is_not_woken() -> None:
    scheduler = TickScheduler("node")
    wal = await WAL.open(
        MemoryBackend(MemoryStore()), "p", 1, tso=LocalTSO(), options=FAST, scheduler=scheduler
    )
    try:
        tick = wal.last_timetick
        await asyncio.sleep(0.2)  # a hundred intervals
        assert scheduler.runs == 0
        assert wal.last_timetick == tick, "nobody needs the timetick of an idle WAL to advance"
    finally:
        await wal.close()
        await scheduler.close()


async def test_one_scheduler_wakes_only_the_wals_that_need_it() -> None:
    store = MemoryStore()
    scheduler = TickScheduler("node")
    wals = [
        await WAL.open(
            MemoryBackend(store), f"p{i}", 1, tso=LocalTSO(), options=FAST, scheduler=scheduler
        )
        for i in range(32)
    ]
    busy, idle = wals[0], wals[1:]
    ticks = [w.last_timetick for w in idle]
    try:
        written = await busy.append(data())
        await until(lambda: busy.last_timetick > written.timetick)  # its tick came
        await asyncio.sleep(0.1)
        assert [w.last_timetick for w in idle] == ticks
        assert 1 <= scheduler.runs <= 3, "one tick after the data, then nothing"
        assert scheduler.scheduled == 0
    finally:
        for wal in wals:
            await wal.close()
        await scheduler.close()


async def test_a_waiting_tail_reader_gets_ticks_and_they_stop_when_it_leaves() -> None:
    scheduler = TickScheduler("node")
    wal = await WAL.open(
        MemoryBackend(MemoryStore()), "p", 1, tso=LocalTSO(), options=FAST, scheduler=scheduler
    )
    try:
        scanner = wal.read(ReadOptions())
        fence = await scanner.next(timeout=WAIT)
        assert fence is not None and fence.message.type is MessageType.FENCE
        for _ in range(3):
            entry = await scanner.next(timeout=WAIT)
            assert entry is not None and entry.message.type is MessageType.TIME_TICK
        await scanner.close()
        await asyncio.sleep(0.05)
        runs, tick = scheduler.runs, wal.last_timetick
        await asyncio.sleep(0.1)
        assert (scheduler.runs, wal.last_timetick) == (runs, tick)
    finally:
        await wal.close()
        await scheduler.close()


async def test_an_open_transaction_is_expired_on_an_otherwise_idle_wal() -> None:
    options = WALOptions(timetick_interval_ms=2, txn_keepalive_s=0.05)
    wal = await WAL.open(MemoryBackend(MemoryStore()), "p", 1, tso=LocalTSO(), options=options)
    try:
        await wal.append(Message(MessageType.BEGIN_TXN, "v"))
        assert wal.stats()["open_txns"] == 1
        await until(lambda: wal.stats()["open_txns"] == 0)
    finally:
        await wal.close()


async def test_a_growing_segment_is_checked_at_its_check_interval_not_every_tick() -> None:
    bed = Bed()
    scheduler = TickScheduler("node")
    policy = SegmentPolicy(idle_s=3600, lifetime_s=3600, check_interval_s=0.1)
    options = WALOptions(timetick_interval_ms=2, segments=policy)
    wal = await WAL.open(
        MemoryBackend(bed.store),
        "pchannel-x",
        1,
        tso=bed.tso,
        options=options,
        collections=bed.hooks,
        scheduler=scheduler,
    )
    try:
        await wal.append(insert(ORDERS, 0, [1]))
        assert wal.stats()["growing_segments"] == 1
        await asyncio.sleep(0.05)
        runs = scheduler.runs
        await asyncio.sleep(0.5)  # 250 tick intervals, 5 check intervals
        assert 3 <= scheduler.runs - runs <= 8
        assert wal.stats()["growing_segments"] == 1
    finally:
        await wal.close()
        await scheduler.close()


class HeldScheduler(TickScheduler):
    """Takes a WAL's timetick sync but never wakes it: the test runs it (``run_due``)."""

    def __init__(self) -> None:
        super().__init__("held")
        self.held: list[Client] = []

    def add(self, client: Client) -> None:
        self.held.append(client)

    def wake(self, client: Client, due: Due) -> None:
        return None


def kinds(batches: list[list[Message]]) -> list[list[MessageType]]:
    return [[m.type for m in batch] for batch in batches]


async def test_a_tick_due_while_data_flows_takes_no_append_of_its_own() -> None:
    """While data flows, a due tick reaches the buffer at once and the log behind
    the next data, in the same backend append: no append (no fsync) of its own
    for data to wait behind. Once the data rests for a run, the tick is persisted
    on its own."""
    backend = TracingBackend()
    scheduler = HeldScheduler()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=FAST, scheduler=scheduler)
    writer = backend.writer
    assert writer is not None
    (sync,) = scheduler.held
    writer.batches.clear()
    reader = wal.read(ReadOptions(vchannels=["other"]))
    try:
        first = await wal.append(data())
        await sync.run_due()  # data flowed since the open
        assert kinds(writer.batches) == [[MessageType.INSERT]], "no tick-only append"
        fence = await reader.next(timeout=WAIT)
        tick = await reader.next(timeout=WAIT)
        assert fence is not None and fence.message.type is MessageType.FENCE
        assert tick is not None and tick.message.type is MessageType.TIME_TICK
        assert tick.message.timetick > first.timetick, "time advanced for every reader"
        assert tick.id == first.id, "a buffer-only tick carries the last persisted id"

        second = await wal.append(data())
        assert kinds(writer.batches)[-1] == [MessageType.INSERT, MessageType.TIME_TICK]
        logged = writer.batches[-1][1]
        assert logged.timetick > second.timetick > tick.message.timetick

        await sync.run_due()  # the log's tick follows the data: nothing is due
        assert len(writer.batches) == 2

        await wal.append(data())
        assert kinds(writer.batches)[-1] == [MessageType.INSERT], "no tick was asked for"
        await sync.run_due()  # the data flowed since the last run: buffer only
        assert len(writer.batches) == 3
        await sync.run_due()  # nothing since: the data rests, the tick is persisted
        assert kinds(writer.batches)[-1] == [MessageType.TIME_TICK]
        assert len(writer.batches) == 4
        seen = [await reader.next(timeout=WAIT) for _ in range(3)]
        stamps = [tick.message.timetick, *(e.message.timetick for e in seen if e is not None)]
        assert stamps == sorted(set(stamps)) and len(stamps) == 4
        assert stamps[1] == logged.timetick
    finally:
        await reader.close()
        await wal.close()


async def test_a_tick_riding_with_data_stays_behind_it_when_the_append_waits() -> None:
    """A tick due while an append is held: the buffer's tick and the log's tick
    both follow the held data and the data queued behind it, in one append."""
    backend = TracingBackend()
    scheduler = HeldScheduler()
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=FAST, scheduler=scheduler)
    writer = backend.writer
    assert writer is not None
    (sync,) = scheduler.held
    writer.batches.clear()
    try:
        writer.gate.clear()
        held = asyncio.create_task(wal.append(data()))
        await until(lambda: writer.active == 1)
        run = asyncio.create_task(sync.run_due())
        await asyncio.sleep(0.01)
        queued = asyncio.create_task(wal.append(data()))
        await asyncio.sleep(0.01)
        writer.gate.set()
        async with asyncio.timeout(WAIT):
            first, second = await held, await queued
            await run
        assert kinds(writer.batches) == [
            [MessageType.INSERT],
            [MessageType.INSERT, MessageType.TIME_TICK],
        ]
        assert writer.batches[1][1].timetick > second.timetick > first.timetick
    finally:
        await wal.close()


async def test_a_new_owner_never_goes_below_a_tick_readers_saw_while_data_flowed(
    tmp_path: Path,
) -> None:
    """Ticks that went only to the buffer while data flowed are not in the log;
    after a crash, the next owner (its own TSO on the cluster's key) still never
    writes a message at or below a tick a reader saw, and a reader resuming from
    that tick gets only what follows."""
    meta = await SqliteMetastore.open(str(tmp_path / "meta.db"))
    store = MemoryStore()
    key = Keys("ticks").tso
    old_tso, new_tso = MetastoreTSO(meta, key), MetastoreTSO(meta, key)
    old = await WAL.open(MemoryBackend(store), "p", 1, tso=old_tso, options=FAST)
    reader = old.read(ReadOptions(vchannels=["other"], types=[MessageType.TIME_TICK]))
    ticks: list[LogEntry] = []

    async def produce() -> None:
        while len(ticks) < 5:
            await old.append(data())
            await asyncio.sleep(0)

    producer = asyncio.create_task(produce())
    try:
        async with asyncio.timeout(WAIT):
            while len(ticks) < 5:
                entry = await reader.next(timeout=WAIT)
                assert entry is not None
                ticks.append(entry)
            await producer
        logged = {
            e.id
            for e in await backend_log(MemoryBackend(store))
            if e.message.type is MessageType.TIME_TICK
        }
        assert any(t.id not in logged for t in ticks), "some ticks went only to the buffer"
        last = ticks[-1]
        new = await WAL.open(MemoryBackend(store), "p", 2, tso=new_tso, options=FAST)
        try:
            assert new.last_timetick > last.message.timetick, "the new owner's fence"
            resumed = new.read(
                ReadOptions(
                    policy=DeliverPolicy.START_AFTER,
                    start_id=last.id,
                    timetick_gt=last.message.timetick,
                )
            )
            after: list[LogEntry] = []
            while not after or after[-1].message.type is not MessageType.FENCE:
                entry = await resumed.next(timeout=WAIT)
                assert entry is not None, "the new owner's fence follows"
                after.append(entry)
            await resumed.close()
            assert all(e.message.timetick > last.message.timetick for e in after), after
        finally:
            await new.close()
    finally:
        producer.cancel()
        await reader.close()
        with contextlib.suppress(errors.HeadraceError):
            await old.close()
        await old_tso.close()
        await new_tso.close()
        await meta.close()

"""Periodic work of WALs: one timer loop per node, nothing for an idle pchannel.

An idle WAL (nothing persisted since its last tick, no tail reader waiting,
no chore pending) must cost nothing: it is not woken at all. A WAL that
needs a tick (data persisted, a reader waiting) or a chore (a transaction's
keepalive, a growing segment's lifetime) gets it on time.
"""

from __future__ import annotations

import asyncio

from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.api import ReadOptions
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.segments import SegmentPolicy
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.ticks import (
    CHORE,
    TICK_AFTER_DATA,
    TICK_FOR_READER,
    Due,
    Needs,
    TickScheduler,
    next_due,
)
from tests.node.harness import until
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

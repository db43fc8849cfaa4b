"""The appender's group commit: the batch limit across producers, appends that
follow each other without overlapping, recovery after a failed append, and
answers for every caller when the WAL closes mid-append."""

from __future__ import annotations

import asyncio
import errno
from collections.abc import Sequence
from pathlib import Path

import pytest

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import AppendResult
from headrace.wal.contract import BackendWriter, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import files
from tests.wal.delegating import DelegatingBackend

WAIT = 10.0


class TracingWriter(BackendWriter):
    """Records every backend append; appends can be held at a gate or made to fail."""

    def __init__(self, inner: BackendWriter) -> None:
        self.pchannel, self.term, self.inner = inner.pchannel, inner.term, inner
        self.gate = asyncio.Event()
        self.gate.set()
        self.batches: list[list[Message]] = []
        self.active = 0
        self.overlapped = False
        self.fail_next: errors.HeadraceError | None = None

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        self.active += 1
        self.overlapped = self.overlapped or self.active > 1
        try:
            await self.gate.wait()
            if self.fail_next is not None:
                error, self.fail_next = self.fail_next, None
                raise error
            self.batches.append([codec.decode(r) for r in records])
            return await self.inner.append(records)
        finally:
            self.active -= 1

    async def close(self) -> None:
        await self.inner.close()


class TracingBackend(DelegatingBackend):
    def __init__(self) -> None:
        super().__init__()
        self.writer: TracingWriter | None = None

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        self.writer = TracingWriter(await self.inner.open_writer(pchannel, term))
        return self.writer


def data(tag: str, n: int) -> list[Message]:
    return [Message(MessageType.INSERT, "v", b"%s-%d" % (tag.encode(), i)) for i in range(n)]


def results(outcomes: Sequence[AppendResult | errors.HeadraceError]) -> list[AppendResult]:
    assert all(isinstance(r, AppendResult) for r in outcomes), outcomes
    return [r for r in outcomes if isinstance(r, AppendResult)]


async def open_wal(max_batch: int) -> tuple[WAL, TracingWriter]:
    backend = TracingBackend()
    options = WALOptions(timetick_interval_ms=3_600_000, max_batch_messages=max_batch)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    assert backend.writer is not None
    backend.writer.batches.clear()
    return wal, backend.writer


async def test_producers_share_appends_only_up_to_the_batch_limit() -> None:
    wal, writer = await open_wal(max_batch=5)
    writer.gate.clear()
    first = asyncio.create_task(wal.append_many(data("a", 4)))
    await asyncio.sleep(0.01)
    rest = [asyncio.create_task(wal.append_many(data(tag, 4))) for tag in "bcd"]
    more = asyncio.create_task(wal.append_many(data("e", 1)))
    await asyncio.sleep(0.01)
    writer.gate.set()
    async with asyncio.timeout(WAIT):
        outcomes = [results(await t) for t in (first, *rest, more)]
    sizes = [len(batch) for batch in writer.batches]
    assert max(sizes) <= 5, sizes
    assert sizes == [4, 4, 4, 5], "e joins d's append: 4 + 1 fit, 4 + 4 do not"
    ids = [r.id for rs in outcomes for r in rs]
    assert len(set(ids)) == len(ids)
    assert not writer.overlapped, "backend appends never overlap"
    await wal.close()


async def test_a_request_larger_than_the_limit_goes_alone() -> None:
    wal, writer = await open_wal(max_batch=3)
    outcomes = results(await wal.append_many(data("big", 7)))
    assert len(outcomes) == 7
    assert [len(batch) for batch in writer.batches] == [3, 3, 1]
    await wal.close()


async def test_the_next_append_starts_once_the_previous_one_ends() -> None:
    wal, writer = await open_wal(max_batch=4)
    tasks = [asyncio.create_task(wal.append_many(data(tag, 4))) for tag in "abcdef"]
    async with asyncio.timeout(WAIT):
        outcomes = [results(await t) for t in tasks]
    timeticks = [r.timetick for rs in outcomes for r in rs]
    logged = [m.timetick for batch in writer.batches for m in batch]
    assert logged == sorted(logged) and sorted(timeticks) == logged
    assert not writer.overlapped
    await wal.close()


async def test_one_producers_appends_leave_the_planning_loop_asleep() -> None:
    """An append that leaves nothing queued does not wake the planning loop (a
    loop turn per append that only one producer pays); what queues behind an
    append in flight is still planned and appended."""
    wal, writer = await open_wal(max_batch=8)
    appender = wal._appender
    results(await wal.append_many(data("a", 2)))
    asleep = appender._wakeup
    assert asleep is not None and not asleep.done()
    for tag in "bcd":
        results(await wal.append_many(data(tag, 2)))
    assert appender._wakeup is asleep and not asleep.done(), "no wake-up per append"
    writer.gate.clear()
    first = asyncio.create_task(wal.append_many(data("e", 2)))
    await asyncio.sleep(0.01)
    queued = [asyncio.create_task(wal.append_many(data(tag, 2))) for tag in "fg"]
    await asyncio.sleep(0.01)
    writer.gate.set()
    async with asyncio.timeout(WAIT):
        for task in (first, *queued):
            assert len(results(await task)) == 2
    assert [len(batch) for batch in writer.batches] == [2, 2, 2, 2, 2, 4]
    await wal.close()


async def test_a_failed_append_fails_its_callers_and_the_next_one_goes_on() -> None:
    wal, writer = await open_wal(max_batch=4)
    writer.gate.clear()
    writer.fail_next = errors.Unavailable("disk hiccup")
    failing = asyncio.create_task(wal.append_many(data("x", 4)))
    await asyncio.sleep(0.01)
    following = asyncio.create_task(wal.append_many(data("y", 4)))
    await asyncio.sleep(0.01)
    writer.gate.set()
    async with asyncio.timeout(WAIT):
        lost = await failing
        kept = results(await following)
    assert all(isinstance(r, errors.Unavailable) for r in lost)
    assert [m.payload for m in writer.batches[-1]] == [m.payload for m in data("y", 4)]
    assert wal.last_id == kept[-1].id
    assert wal.last_timetick == kept[-1].timetick
    await wal.close()


async def test_closing_mid_append_answers_every_caller() -> None:
    wal, writer = await open_wal(max_batch=4)
    writer.gate.clear()
    in_flight = asyncio.create_task(wal.append_many(data("x", 4)))
    await asyncio.sleep(0.01)
    waiting = asyncio.create_task(wal.append_many(data("y", 4)))
    queued = asyncio.create_task(wal.append_many(data("z", 4)))
    await asyncio.sleep(0.01)
    wal._appender.failure = errors.Fenced("a newer owner took over", term=1, current_term=2)
    await wal._appender.abort()
    async with asyncio.timeout(WAIT):
        answers = [await t for t in (in_flight, waiting, queued)]
    assert all(isinstance(r, errors.Closed) for r in answers[0])
    assert all(isinstance(r, errors.Fenced) for rs in answers[1:] for r in rs)
    writer.gate.set()
    await wal.close()


@pytest.mark.parametrize("producers", [1, 3])
async def test_local_backend_group_commit_keeps_every_message(
    tmp_path: Path, producers: int
) -> None:
    backend = registry.create("local", root=str(tmp_path))
    options = WALOptions(timetick_interval_ms=3_600_000, max_batch_messages=9)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)

    async def produce(tag: str) -> list[AppendResult]:
        out: list[AppendResult] = []
        for round_ in range(5):
            out += results(await wal.append_many(data(f"{tag}{round_}", 8)))
        return out

    async with asyncio.timeout(WAIT):
        outcomes = await asyncio.gather(*(produce(str(k)) for k in range(producers)))
    await wal.close()
    reader = await backend.open_reader("p", StartPosition.earliest())
    records = []
    async with asyncio.timeout(WAIT):
        while batch := await reader.next_batch(timeout=0.05):
            records += batch
    await reader.close()
    written = {r.id: codec.decode(r.data) for r in records}
    for rs in outcomes:
        assert all(written[r.id].timetick == r.timetick for r in rs)
    assert sum(map(len, outcomes)) == 40 * producers
    await backend.close()


async def test_a_failed_local_append_takes_back_results_settled_ahead(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = registry.create("local", root=str(tmp_path))
    wal = await WAL.open(
        backend, "p", 1, tso=LocalTSO(), options=WALOptions(timetick_interval_ms=3_600_000)
    )
    real_write = files.write_parts

    def disk_full(fd: int, parts: list[bytes], size: int, offset: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_parts", disk_full)
    lost = await wal.append_many(data("lost", 3))
    assert all(isinstance(r, errors.StorageFull) for r in lost), lost
    monkeypatch.setattr(files, "write_parts", real_write)
    kept = results(await wal.append_many(data("kept", 3)))
    await wal.close()
    reader = await backend.open_reader("p", StartPosition.earliest())
    records = []
    async with asyncio.timeout(WAIT):
        while batch := await reader.next_batch(timeout=0.05):
            records += batch
    await reader.close()
    payloads = {r.id: codec.decode(r.data).payload for r in records}
    assert [payloads[r.id] for r in kept] == [m.payload for m in data("kept", 3)]
    assert not any(p.startswith(b"lost") for p in payloads.values())
    await backend.close()


async def test_a_sync_tick_waiting_behind_an_append_rides_with_the_next_batch() -> None:
    """A tick planned while an append is in flight does not get an append (and
    an fsync) of its own: the producer released by that append adds its next
    batch to the tick's before it starts."""
    backend = TracingBackend()
    options = WALOptions(timetick_interval_ms=5, max_batch_messages=64)
    wal = await WAL.open(backend, "p", 1, tso=LocalTSO(), options=options)
    writer = backend.writer
    assert writer is not None
    writer.gate.clear()
    writer.batches.clear()

    async def producer() -> None:
        results(await wal.append_many(data("a", 8)))
        results(await wal.append_many(data("b", 8)))

    task = asyncio.create_task(producer())
    async with asyncio.timeout(WAIT):
        await asyncio.sleep(0.05)  # several tick intervals pass while "a" is held
        assert writer.active == 1
        writer.gate.set()
        await task
    kinds = [[m.type for m in batch] for batch in writer.batches]
    with_b = next(
        i for i, batch in enumerate(writer.batches) if b"b-0" in {m.payload for m in batch}
    )
    assert MessageType.TIME_TICK in kinds[with_b], kinds
    assert kinds[with_b - 1].count(MessageType.INSERT) == 8, "a went first, on its own"
    await wal.close()

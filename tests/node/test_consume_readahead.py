"""The read-ahead of a Consume stream (:mod:`headrace.node.readahead`): bounded
whatever the client does, stopped with its stream, and its errors end the
stream with their own status after the entries read before them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from headrace import errors
from headrace.guarded import cancel_and_settle, guarded_task
from headrace.message import batch
from headrace.message.types import Message, MessageType
from headrace.node import convert
from headrace.node.readahead import Bounds, ConsumeStats, ReadAhead, Source, room_for
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.tso import LocalTSO
from headrace.wal.api import ReadOptions
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.memory import MemoryBackend
from headrace.wal.scanner import Scanner
from tests.node.harness import HANG_GUARD, Cluster, error_details, until

P = "pchannel-000"


def test_room_is_what_is_left_of_one_response() -> None:
    bounds = Bounds(messages=10, bytes=1000, batches=True)
    assert room_for(bounds, 0, 0, 0) == 1, "the first read learns the size"
    assert room_for(bounds, 0, 0, 10) == 10
    assert room_for(bounds, 7, 70, 10) == 3
    assert room_for(bounds, 10, 100, 10) == 0, "the message bound reached"
    assert room_for(bounds, 12, 120, 10) == 0, "a whole batch may go past it"
    assert room_for(bounds, 1, 1000, 10) == 0, "the byte bound reached"
    assert room_for(bounds, 0, 0, 300) == 4, "what fits in the bytes left, and one more"
    assert room_for(bounds, 2, 900, 300) == 1


@pytest.fixture
async def wal() -> AsyncIterator[WAL]:
    backend = MemoryBackend()
    opened = await WAL.open(
        backend,
        "p",
        1,
        tso=LocalTSO(),
        options=WALOptions(timetick_interval_ms=3_600_000, message_format=2),
    )
    yield opened
    await opened.close()
    await backend.close()


async def settled(ahead: ReadAhead) -> None:
    """Wait until the read-ahead's task stops taking entries."""
    async with asyncio.timeout(HANG_GUARD):
        previous = -1
        while ahead.stats.pulled != previous:
            previous = ahead.stats.pulled
            await asyncio.sleep(0.05)


def read_ahead(scanner: Scanner, bounds: Bounds) -> tuple[ReadAhead, asyncio.Task[None]]:
    ahead = ReadAhead(Source(scanner, 0.05, lambda: None), bounds, ConsumeStats("p"))
    return ahead, guarded_task(ahead.run(), "read-ahead", ahead.failed, finishable=True)


@pytest.mark.parametrize(
    ("payload", "bounds"),
    [
        (100, Bounds(messages=16, bytes=1 << 20, batches=False)),
        (4096, Bounds(messages=1000, bytes=20_000, batches=False)),
    ],
    ids=["message-bound", "byte-bound"],
)
async def test_a_stalled_writer_stops_the_read_at_one_response(
    wal: WAL, payload: int, bounds: Bounds
) -> None:
    """Nobody takes responses (a client that stopped reading): the task holds
    at most one response's worth, and reads on only as responses go. (Messages
    of one size: a read's size estimate comes from the messages read last.)"""
    for _ in range(10):
        await wal.append_many([Message(MessageType.INSERT, "v", b"x" * payload)] * 100)
    inserts = ReadOptions(types=frozenset({MessageType.INSERT}))
    ahead, task = read_ahead(wal.read(inserts), bounds)
    try:
        await settled(ahead)
        per_message = payload + convert.MESSAGE_OVERHEAD
        assert 0 < ahead.held_messages <= bounds.messages
        assert ahead.held_bytes < bounds.bytes + per_message
        assert ahead.stats.pulled == ahead.held_messages
        taken = 0
        for _ in range(3):
            response, packed = await ahead.next_response()
            assert len(response.messages) == packed.messages > 0
            taken += packed.messages
            await settled(ahead)
            assert ahead.held_messages <= bounds.messages
            assert ahead.held_bytes < bounds.bytes + per_message
        assert ahead.stats.pulled == taken + ahead.held_messages
        assert ahead.stats.pulled < 1000, "the task read the whole log"
    finally:
        await cancel_and_settle([task], what="the test's read-ahead")


async def test_a_batch_larger_than_the_bound_is_held_alone(wal: WAL) -> None:
    msgs = [Message(MessageType.INSERT, "v", b"x" * 10)] * 40
    for _ in range(3):
        (outcome,) = await wal.append_batches([batch.encode(msgs, batch.BatchInfo("v"))])
        assert not isinstance(outcome, errors.HeadraceError)
    inserts = ReadOptions(types=frozenset({MessageType.INSERT}))
    ahead, task = read_ahead(wal.read(inserts), Bounds(messages=16, bytes=1 << 20, batches=True))
    try:
        await settled(ahead)
        assert ahead.held_messages == 40, "one whole batch, no more"
        response, packed = await ahead.next_response()
        assert [i.WhichOneof("item") for i in response.items] == ["batch"]
        assert packed.messages == 40
    finally:
        await cancel_and_settle([task], what="the test's read-ahead")


async def test_the_writer_raises_the_error_after_what_was_read_before(wal: WAL) -> None:
    await wal.append_many([Message(MessageType.INSERT, "v", b"x")] * 5)
    scanner = wal.read(ReadOptions(types=frozenset({MessageType.INSERT})))
    ahead, task = read_ahead(scanner, Bounds(messages=3, bytes=1 << 20, batches=False))
    try:
        await settled(ahead)
        held = ahead.held_messages
        assert held == 3
        await scanner.close()  # the task's next read fails: Closed
        got = 0
        with pytest.raises(errors.Closed):
            while True:
                _, packed = await ahead.next_response()
                got += packed.messages
        assert got == held
        async with asyncio.timeout(HANG_GUARD):
            await task
    finally:
        await cancel_and_settle([task], what="the test's read-ahead")


# -------------------------------------------------------------- through a node


@pytest.fixture
async def channel(cluster: Cluster) -> AsyncIterator[grpc.aio.Channel]:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    assert node.manager is not None
    await node.manager.get(P).append_many([Message(MessageType.INSERT, "v", b"m")] * 3)
    async with grpc.aio.insecure_channel(node.address) as ch:
        yield ch


def reader_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(f"consume-{P}-")]


async def test_a_cancelled_stream_stops_its_reader(
    cluster: Cluster, channel: grpc.aio.Channel
) -> None:
    request = pb.ConsumeRequest(pchannel=P, policy=pb.DELIVER_POLICY_LATEST)
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    assert isinstance(await call.read(), pb.ConsumeResponse)
    await until(lambda: len(reader_tasks()) == 1)
    call.cancel()
    service = cluster.nodes["node-a"].consumer_service
    assert service is not None
    await until(lambda: not service.streams and not reader_tasks())


async def test_a_stalled_client_that_goes_away_stops_the_reader(
    cluster: Cluster, channel: grpc.aio.Channel
) -> None:
    """The reader waits for room (the client reads nothing); cancelling the
    stream ends that wait too."""
    node = cluster.nodes["node-a"]
    assert node.manager is not None
    wal = node.manager.get(P)
    for _ in range(20):
        await wal.append_many([Message(MessageType.INSERT, "v", b"y" * 8192)] * 100)
    request = pb.ConsumeRequest(pchannel=P, max_batch_messages=16)
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    assert isinstance(await call.read(), pb.ConsumeResponse)
    service = node.consumer_service
    assert service is not None
    (stats,) = service.streams.values()
    await until(lambda: stats.pulled > 0)
    call.cancel()
    await until(lambda: not service.streams and not reader_tasks())


async def test_a_scanner_error_ends_the_stream_with_its_status_after_the_entries_before(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = Scanner.next_many
    read = 0

    async def failing(
        self: Scanner, max_entries: int = 1, timeout: float | None = None
    ) -> list[object]:
        nonlocal read
        if read == 3:
            raise errors.CorruptData("record 7 of the test is damaged")
        entries = await real(self, max_entries, timeout)
        read += len(entries)
        return entries

    monkeypatch.setattr(Scanner, "next_many", failing)
    request = pb.ConsumeRequest(pchannel=P, types=[MessageType.INSERT])
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    got: list[bytes] = []
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for response in call:
            got += [m.payload for m in response.messages]
    assert got == [b"m"] * 3
    assert caught.value.code() is grpc.StatusCode.DATA_LOSS
    details = error_details(caught.value)
    assert details["code"] == errors.ErrorCode.CORRUPT.value
    assert "record 7 of the test is damaged" in details["message"]


async def test_an_unexpected_reader_failure_ends_the_stream_as_internal(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(
        self: Scanner, max_entries: int = 1, timeout: float | None = None
    ) -> list[object]:
        raise RuntimeError("a bug in the scanner")

    monkeypatch.setattr(Scanner, "next_many", broken)
    request = pb.ConsumeRequest(pchannel=P, types=[MessageType.INSERT])
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        async for _ in call:
            pass
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    details = error_details(caught.value)
    assert details["code"] == errors.ErrorCode.INTERNAL.value
    assert "RuntimeError: a bug in the scanner" in details["message"]
    assert not reader_tasks()

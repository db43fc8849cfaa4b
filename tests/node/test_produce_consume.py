"""Producer and Consumer services of one node, spoken to with raw gRPC stubs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from headrace.cluster import NEW_CLUSTER_ROUTING, route
from headrace.errors import ErrorCode
from headrace.message.types import MessageType
from headrace.node.server import StreamingNode
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.wal.framework import WALOptions
from tests.node.harness import HANG_GUARD, Cluster, error_details, until

P = "pchannel-000"


@pytest.fixture
async def channel(cluster: Cluster) -> AsyncIterator[grpc.aio.Channel]:
    node = await cluster.start_node("node-a", wal_options=WALOptions(max_message_bytes=4096))
    await cluster.assign(P, "node-a", 1)
    async with grpc.aio.insecure_channel(node.address) as ch:
        yield ch


def message(vchannel: str, payload: bytes, mtype: int = MessageType.INSERT) -> pb.ProduceMessage:
    return pb.ProduceMessage(type=mtype, vchannel=vchannel, payload=payload)


async def produce(
    channel: grpc.aio.Channel, batches: Sequence[Sequence[pb.ProduceMessage]], term: int = 0
) -> list[pb.BatchResult]:
    call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
    await call.write(pb.ProduceRequest(open=pb.OpenProducer(pchannel=P, term=term)))
    opened = await call.read()
    assert isinstance(opened, pb.ProduceResponse) and opened.opened.term == 1
    for i, batch in enumerate(batches):
        await call.write(pb.ProduceRequest(batch=pb.ProduceBatch(batch_id=i + 1, messages=batch)))
    results = []
    for _ in batches:
        response = await call.read()
        assert isinstance(response, pb.ProduceResponse)
        results.append(response.batch)
    await call.done_writing()
    return results


async def consume(
    channel: grpc.aio.Channel, request: pb.ConsumeRequest, count: int
) -> list[pb.ConsumedMessage]:
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    header = await call.read()
    assert isinstance(header, pb.ConsumeResponse) and header.node_id == "node-a"
    out: list[pb.ConsumedMessage] = []
    while len(out) < count:
        response = await call.read()
        assert isinstance(response, pb.ConsumeResponse)
        out.extend(response.messages)
    call.cancel()
    return out


async def test_round_trip_with_vchannel_and_type_filters(channel: grpc.aio.Channel) -> None:
    batch = [message(f"v{i % 2}", f"m{i}".encode()) for i in range(10)]
    batch.append(message("v0", b"gone", MessageType.DELETE))
    (result,) = await produce(channel, [batch])
    assert result.batch_id == 1
    assert [r.HasField("error") for r in result.results] == [False] * 11
    ticks = [r.timetick for r in result.results]
    assert ticks == sorted(ticks) and len(set(ticks)) == 11
    assert all(r.term == 1 and r.id.startswith("memory:") for r in result.results)

    request = pb.ConsumeRequest(pchannel=P, vchannels=["v0"], types=[MessageType.INSERT])
    got = await consume(channel, request, 5)
    assert [m.payload for m in got] == [b"m0", b"m2", b"m4", b"m6", b"m8"]
    assert [m.id for m in got] == [result.results[i].id for i in range(0, 10, 2)]
    assert {m.vchannel for m in got} == {"v0"} and {m.term for m in got} == {1}


async def test_start_after_and_timetick_filter(channel: grpc.aio.Channel) -> None:
    (result,) = await produce(channel, [[message("v", f"{i}".encode()) for i in range(6)]])
    ids = [r.id for r in result.results]
    data = [MessageType.INSERT]
    after = pb.ConsumeRequest(
        pchannel=P, policy=pb.DELIVER_POLICY_START_AFTER, start_id=ids[2], types=data
    )
    assert [m.payload for m in await consume(channel, after, 3)] == [b"3", b"4", b"5"]
    start_from = pb.ConsumeRequest(
        pchannel=P, policy=pb.DELIVER_POLICY_START_FROM, start_id=ids[4], types=data
    )
    assert [m.payload for m in await consume(channel, start_from, 2)] == [b"4", b"5"]
    tick = pb.ConsumeRequest(pchannel=P, timetick_gt=result.results[3].timetick, types=data)
    assert [m.payload for m in await consume(channel, tick, 2)] == [b"4", b"5"]


async def test_bad_messages_fail_alone_with_typed_errors(channel: grpc.aio.Channel) -> None:
    batch = [
        message("v", b"first"),
        message("v", b"x" * 8192),
        message("not a vchannel!", b"bad name"),
        message("v", b"tick", MessageType.TIME_TICK),
        message("v", b"unknown", 999),
        message("v", b"last"),
    ]
    (result,) = await produce(channel, [batch])
    codes = [r.error.code if r.HasField("error") else "" for r in result.results]
    assert codes == [
        "",
        "TOO_LARGE",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "INVALID_ARGUMENT",
        "",
    ]
    assert not any(r.error.retryable for r in result.results)
    assert "exceeds the maximum" in result.results[1].error.message
    request = pb.ConsumeRequest(pchannel=P, types=[MessageType.INSERT])
    got = await consume(channel, request, 2)
    assert [m.payload for m in got] == [b"first", b"last"]


async def test_several_batches_on_one_stream_are_answered_in_order(
    channel: grpc.aio.Channel,
) -> None:
    batches = [[message("v", f"{b}-{i}".encode()) for i in range(50)] for b in range(8)]
    results = await produce(channel, batches)
    assert [r.batch_id for r in results] == list(range(1, 9))
    ticks = [m.timetick for r in results for m in r.results]
    assert ticks == sorted(ticks) and len(ticks) == 400


async def test_retried_producer_sequence_is_written_once(channel: grpc.aio.Channel) -> None:
    stamped = message("v", b"once")
    stamped.properties["producer_id"] = "p1"
    stamped.properties["producer_seq"] = "7"
    first, second = await produce(channel, [[stamped], [stamped]])
    assert first.results[0].id == second.results[0].id
    got = await consume(channel, pb.ConsumeRequest(pchannel=P, types=[MessageType.INSERT]), 1)
    assert got[0].properties["producer_seq"] == "7"
    follow = pb.ConsumeRequest(
        pchannel=P,
        policy=pb.DELIVER_POLICY_START_AFTER,
        start_id=got[0].id,
        types=[MessageType.INSERT],
    )
    call = rpc.consumer_stub(channel).Consume(follow, timeout=HANG_GUARD)
    assert isinstance(await call.read(), pb.ConsumeResponse)
    (after,) = await produce(channel, [[message("v", b"next")]])
    response = await call.read()
    assert isinstance(response, pb.ConsumeResponse)
    assert [m.payload for m in response.messages] == [b"next"]
    assert response.messages[0].id == after.results[0].id
    call.cancel()


async def test_malformed_consume_requests_get_invalid_argument(
    channel: grpc.aio.Channel,
) -> None:
    for request in (
        pb.ConsumeRequest(pchannel=P, policy=pb.DELIVER_POLICY_START_AFTER),
        pb.ConsumeRequest(pchannel=P, policy=pb.DELIVER_POLICY_START_FROM, start_id="nonsense"),
        pb.ConsumeRequest(pchannel=P, types=[999]),
    ):
        call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert error_details(info.value)["code"] == ErrorCode.INVALID_ARGUMENT.value


async def test_a_stream_must_start_with_open(channel: grpc.aio.Channel) -> None:
    call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
    await call.write(pb.ProduceRequest(batch=pb.ProduceBatch(batch_id=1)))
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_consumer_waits_at_the_tail(cluster: Cluster, channel: grpc.aio.Channel) -> None:
    request = pb.ConsumeRequest(pchannel=P, policy=pb.DELIVER_POLICY_LATEST, types=[2])
    call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
    assert isinstance(await call.read(), pb.ConsumeResponse)
    reader = asyncio.ensure_future(call.read())
    await produce(channel, [[message("v", b"tail")]])
    response = await reader
    assert isinstance(response, pb.ConsumeResponse)
    assert [m.payload for m in response.messages] == [b"tail"]
    call.cancel()
    node: StreamingNode = cluster.nodes["node-a"]
    service = node.consumer_service
    assert service is not None
    await until(lambda: not service.streams)


async def test_a_vchannel_of_another_pchannel_is_refused(
    cluster: Cluster, channel: grpc.aio.Channel
) -> None:
    pchannels = [P, "pchannel-001"]
    await cluster.configure(pchannels)
    node = cluster.nodes["node-a"]
    assert node.manager is not None
    directory = node.manager.directory
    await until(lambda: directory.config is not None)
    mine = next(f"v{i}" for i in range(100) if route(f"v{i}", pchannels, NEW_CLUSTER_ROUTING) == P)
    other = next(f"v{i}" for i in range(100) if route(f"v{i}", pchannels, NEW_CLUSTER_ROUTING) != P)
    (result,) = await produce(channel, [[message(mine, b"ok"), message(other, b"misrouted")]])
    assert not result.results[0].HasField("error")
    assert result.results[1].error.code == "INVALID_ARGUMENT"
    assert "pchannel-001" in result.results[1].error.message

"""A slow consumer makes the node wait, not buffer: reads stay a bounded amount ahead.

The bound: the response gRPC is sending plus one response's worth read ahead
(:mod:`headrace.node.readahead`)."""

from __future__ import annotations

import asyncio

import grpc

from headrace.message.types import Message, MessageType
from headrace.node.services import Limits
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from tests.node.harness import HANG_GUARD, Cluster

P = "pchannel-000"
TOTAL = 2000
PAYLOAD = 8192
BATCH = 16
AHEAD = 2 * BATCH
"""Messages a stream may hold beyond those sent: one response in gRPC's hands,
one response's worth read ahead."""


async def test_slow_consumer_keeps_the_node_a_bounded_amount_ahead(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a", limits=Limits(consume_batch_messages=BATCH))
    await cluster.assign(P, "node-a", 1)
    assert node.manager is not None and node.consumer_service is not None
    wal = node.manager.get(P)
    for _ in range(TOTAL // 200):
        await wal.append_many([Message(MessageType.INSERT, "v", b"x" * PAYLOAD)] * 200)

    # Without BDP probing the client's HTTP/2 window stays at its initial size,
    # so what the node may push ahead is small and does not depend on timing.
    options = [("grpc.http2.bdp_probe", 0)]
    async with grpc.aio.insecure_channel(node.address, options=options) as channel:
        request = pb.ConsumeRequest(pchannel=P, types=[MessageType.INSERT])
        call = rpc.consumer_stub(channel).Consume(request, timeout=HANG_GUARD)
        assert isinstance(await call.read(), pb.ConsumeResponse)
        first = await call.read()
        assert isinstance(first, pb.ConsumeResponse) and len(first.messages) == BATCH
        (stats,) = node.consumer_service.streams.values()
        async with asyncio.timeout(HANG_GUARD):
            previous = -1
            while stats.pulled != previous:
                previous = stats.pulled
                await asyncio.sleep(0.2)
        # The node stopped reading: it is blocked on the client's window.
        assert stats.max_ahead <= AHEAD
        assert stats.pulled - stats.sent <= AHEAD
        assert stats.pulled < TOTAL // 4

        # Reading on drains the whole log in order, still within the bound.
        seen = len(first.messages)
        while seen < TOTAL:
            response = await call.read()
            assert isinstance(response, pb.ConsumeResponse)
            assert len(response.messages) <= BATCH
            seen += len(response.messages)
        assert seen == TOTAL and stats.max_ahead <= AHEAD
        call.cancel()

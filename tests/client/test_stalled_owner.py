"""A consumer leaves an owner that never answers once a newer term is ASSIGNED.

The stalled owner here is a gRPC server whose Consume never sends anything
(the way a SIGSTOPped node behaves; tests/chaos/test_consumer_handoff.py does
it with real node processes): its stream neither delivers nor ends, so only
the assignment record can tell the consumer to move on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from headrace.client import Consumer, HeadraceClient
from headrace.cluster import Assignment, AssignmentState
from headrace.message.types import LogEntry
from headrace.proto import streaming_pb2_grpc as pb_grpc
from tests.node.harness import Cluster, until

P = "pchannel-000"


class _Stuck(pb_grpc.ConsumerServicer):  # type: ignore[misc]
    async def Consume(self, request: object, context: object) -> AsyncIterator[object]:
        await asyncio.Event().wait()
        yield None  # never reached: the stream never answers


@pytest.fixture
async def stuck_address() -> AsyncIterator[str]:
    server = grpc.aio.server()
    pb_grpc.add_ConsumerServicer_to_server(_Stuck(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def assign_stuck(cluster: Cluster, address: str, term: int) -> None:
    """Record the stuck server as the ASSIGNED owner of P under ``term``."""
    await cluster.write(
        Assignment(
            pchannel=P,
            state=AssignmentState.ASSIGNED,
            term=term,
            node="stuck",
            address=address,
            updated_at=time.time(),
        )
    )


def follow(consumer: Consumer, into: list[LogEntry]) -> asyncio.Task[None]:
    async def run() -> None:
        async for entry in consumer:
            into.append(entry)

    return asyncio.create_task(run())


async def test_consumer_opened_on_a_stuck_owner_moves_to_the_new_one(
    cluster: Cluster, stuck_address: str
) -> None:
    await cluster.configure([P])
    await cluster.start_node("node-a")
    await assign_stuck(cluster, stuck_address, 1)
    async with HeadraceClient(cluster.url, "test") as client:
        consumer = client.consume("a")
        got: list[LogEntry] = []
        reading = follow(consumer, got)
        await until(lambda: consumer.owner is not None and consumer.owner.node == "stuck")
        await cluster.assign(P, "node-a", 2)
        async with client.producer() as producer:
            for i in range(10):
                await producer.send("a", str(i).encode())
        await until(lambda: len(got) >= 10)
        assert [int(e.message.payload) for e in got] == list(range(10))
        assert consumer.owner is not None and consumer.owner.node == "node-a"
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await consumer.close()


async def test_consumer_resumes_past_a_stuck_owner_without_duplicates(
    cluster: Cluster, stuck_address: str
) -> None:
    await cluster.start_pair(P)
    async with HeadraceClient(cluster.url, "test") as client:
        async with client.producer() as producer:
            for i in range(10):
                await producer.send("a", str(i).encode())
        consumer = client.consume("a")
        got: list[LogEntry] = []
        reading = follow(consumer, got)
        await until(lambda: len(got) >= 10)
        # The pchannel passes to an owner that never answers, then on to node-b.
        await assign_stuck(cluster, stuck_address, 2)
        await until(lambda: consumer.owner is not None and consumer.owner.node == "stuck")
        await cluster.assign(P, "node-b", 3)
        async with client.producer() as producer:
            for i in range(10, 20):
                await producer.send("a", str(i).encode())
        await until(lambda: len(got) >= 20)
        await asyncio.sleep(0.2)  # room for a duplicate to show up
        assert [int(e.message.payload) for e in got] == list(range(20))
        assert {e.message.term for e in got} == {1, 3}
        assert consumer.owner is not None and consumer.owner.node == "node-b"
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        await consumer.close()


async def test_producer_sent_to_a_port_another_server_took_goes_on_to_the_new_owner(
    cluster: Cluster, stuck_address: str
) -> None:
    """The assignment still names an address whose node has gone and whose port
    another gRPC server now holds (it answers UNIMPLEMENTED to Produce): the
    producer looks the owner up again instead of failing the message."""
    await cluster.start_pair(P)
    async with HeadraceClient(cluster.url, "test") as client:
        await assign_stuck(cluster, stuck_address, 2)
        await until(lambda: (owner := client.view.owner(P)) is not None and owner.node == "stuck")
        async with client.producer() as producer:
            first = asyncio.create_task(producer.send("a", b"0"))
            await asyncio.sleep(0.3)  # it meets the stuck address at least once
            assert not first.done()
            await cluster.assign(P, "node-b", 3)
            result = await first
            second = await producer.send("a", b"1")
        assert (result.term, second.term) == (3, 3)

"""Producers and consumers carry on across a graceful move of their pchannel."""

from __future__ import annotations

import asyncio
import collections

from headrace.client import HeadraceClient, ProducerOptions
from headrace.cluster import AssignmentState
from headrace.message.types import LogEntry
from headrace.wal.api import AppendResult
from tests.node.harness import HANG_GUARD, Cluster, until

P = "pchannel-000"
VCHANNELS = ["a", "b", "c"]


async def produce_until(
    client: HeadraceClient, stop: asyncio.Event, acked: dict[str, list[int]]
) -> None:
    """Send numbered messages round-robin over VCHANNELS until ``stop``."""
    options = ProducerOptions(max_batch_messages=16, max_inflight_batches=4, deadline=HANG_GUARD)
    async with client.producer(options) as producer:
        seq = 0
        while not stop.is_set():
            sends = []
            for _ in range(8):
                vchannel = VCHANNELS[seq % 3]
                sends.append((vchannel, seq, producer.send(vchannel, str(seq).encode())))
                seq += 1
            outcomes = await asyncio.gather(*(s for _, _, s in sends))
            for (vchannel, number, _), result in zip(sends, outcomes, strict=True):
                assert isinstance(result, AppendResult)
                acked[vchannel].append(number)


async def collect(client: HeadraceClient, vchannel: str, count: int) -> list[LogEntry]:
    consumer = client.consume(vchannel)
    out: list[LogEntry] = []
    async with asyncio.timeout(HANG_GUARD):
        async for entry in consumer:
            out.append(entry)
            if len(out) == count:
                break
    await consumer.close()
    return out


async def test_graceful_move_loses_and_duplicates_nothing(cluster: Cluster) -> None:
    await cluster.start_pair(P)
    acked: dict[str, list[int]] = collections.defaultdict(list)
    stop = asyncio.Event()
    async with HeadraceClient(cluster.url, "test") as client:
        # A consumer that follows the move while it happens.
        live = client.consume("a")
        live_numbers: list[int] = []

        async def follow() -> None:
            async for entry in live:
                live_numbers.append(int(entry.message.payload))

        following = asyncio.create_task(follow())
        producing = asyncio.create_task(produce_until(client, stop, acked))
        await until(lambda: len(acked["a"]) >= 50 and bool(live_numbers))
        moved = await cluster.move(P, "node-b")
        assert moved.state is AssignmentState.ASSIGNED and moved.node == "node-b"
        before = len(acked["a"])
        await until(lambda: len(acked["a"]) >= before + 50)
        stop.set()
        await producing

        for vchannel in VCHANNELS:
            got = await collect(client, vchannel, len(acked[vchannel]))
            numbers = [int(e.message.payload) for e in got]
            assert numbers == acked[vchannel], f"{vchannel}: not exactly once in order"
            assert {e.message.term for e in got} == {1, 2}

        await until(lambda: len(live_numbers) >= len(acked["a"]))
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
        assert live_numbers == acked["a"]
        assert live.reconnects >= 1 and live.owner is not None and live.owner.node == "node-b"
        await live.close()


async def test_consumer_resumes_after_the_node_stops(cluster: Cluster) -> None:
    await cluster.start_pair(P)
    async with HeadraceClient(cluster.url, "test") as client:
        async with client.producer() as producer:
            for i in range(20):
                await producer.send("a", str(i).encode())
            consumer = client.consume("a")
            first = [int((await anext(consumer)).message.payload) for _ in range(10)]
            # The node goes away without a handoff; the pchannel is reassigned.
            await cluster.nodes.pop("node-a").stop()
            await cluster.assign(P, "node-b", 2)
            for i in range(20, 30):
                await producer.send("a", str(i).encode())
        rest: list[int] = []
        async with asyncio.timeout(HANG_GUARD):
            while len(first) + len(rest) < 30:
                rest.append(int((await anext(consumer)).message.payload))
        assert first + rest == list(range(30))
        assert consumer.owner is not None and consumer.owner.node == "node-b"
        await consumer.close()


async def test_producer_carries_on_when_its_node_stops(cluster: Cluster) -> None:
    await cluster.start_pair(P)
    acked: dict[str, list[int]] = collections.defaultdict(list)
    stop = asyncio.Event()
    async with HeadraceClient(cluster.url, "test") as client:
        producing = asyncio.create_task(produce_until(client, stop, acked))
        await until(lambda: len(acked["b"]) >= 30)
        # No handoff: the owner shuts down, then the pchannel is reassigned.
        await cluster.nodes.pop("node-a").stop()
        await cluster.assign(P, "node-b", 2)
        before = len(acked["b"])
        await until(lambda: len(acked["b"]) >= before + 30)
        stop.set()
        await producing
        for vchannel in VCHANNELS:
            got = await collect(client, vchannel, len(acked[vchannel]))
            assert [int(e.message.payload) for e in got] == acked[vchannel]

"""Producer and consumer of the client library against in-process nodes."""

from __future__ import annotations

import asyncio

import pytest

from headrace import errors
from headrace.client import Consumer, HeadraceClient, ProducerOptions, status
from headrace.cluster import NEW_CLUSTER_ROUTING, route
from headrace.message.types import Message, MessageType
from headrace.wal.api import AppendResult
from headrace.wal.framework import WALOptions
from tests.client.conftest import PCHANNELS
from tests.node.harness import HANG_GUARD, Cluster


async def take(consumer: Consumer, count: int) -> list[Message]:
    out = []
    async with asyncio.timeout(HANG_GUARD):
        async for entry in consumer:
            out.append(entry.message)
            if len(out) == count:
                break
    return out


async def test_send_and_consume_with_type_filter(served: Cluster, client: HeadraceClient) -> None:
    producer = client.producer()
    results = [await producer.send("orders", f"o{i}".encode()) for i in range(5)]
    await producer.send("orders", b"del", type=MessageType.DELETE, properties={"k": "v"})
    assert all(isinstance(r, AppendResult) and r.term == 1 for r in results)
    assert [r.timetick for r in results] == sorted(r.timetick for r in results)

    consumer = client.consume("orders")
    got = await take(consumer, 6)
    assert [m.payload for m in got] == [b"o0", b"o1", b"o2", b"o3", b"o4", b"del"]
    assert got[5].type is MessageType.DELETE and got[5].properties["k"] == "v"
    assert got[0].properties["producer_id"] == producer.producer_id
    assert consumer.last_id == results[4].id or consumer.last_id > results[4].id
    await consumer.close()

    deletes = client.consume("orders", types=[MessageType.DELETE])
    assert [m.payload for m in await take(deletes, 1)] == [b"del"]
    await deletes.close()
    await producer.close()


async def test_send_many_spreads_over_pchannels_and_keeps_order(
    served: Cluster, client: HeadraceClient
) -> None:
    vchannels = [f"coll-{i}" for i in range(6)]
    assert {client.route(v) for v in vchannels} == set(PCHANNELS)
    messages = [Message(MessageType.INSERT, vchannels[i % 6], f"{i}".encode()) for i in range(600)]
    async with client.producer(ProducerOptions(max_batch_messages=64)) as producer:
        results = await producer.send_many(messages)
    assert all(isinstance(r, AppendResult) for r in results)
    for vchannel in vchannels:
        consumer = client.consume(vchannel)
        got = await take(consumer, 100)
        assert [int(m.payload) for m in got] == [
            i for i in range(600) if i % 6 == int(vchannel[-1])
        ]
        assert {m.vchannel for m in got} == {vchannel}
        await consumer.close()


async def test_non_retryable_errors_surface_at_once(
    served: Cluster, client: HeadraceClient
) -> None:
    producer = client.producer()
    too_big = b"x" * (9 * 1024 * 1024)
    results = await producer.send_many(
        [
            Message(MessageType.INSERT, "orders", b"ok"),
            Message(MessageType.INSERT, "orders", too_big),
            Message(MessageType.INSERT, "bad name!", b"?"),
            Message(MessageType.INSERT, "orders", b"ok2"),
        ]
    )
    assert isinstance(results[0], AppendResult) and isinstance(results[3], AppendResult)
    assert isinstance(results[1], errors.MessageTooLarge)
    assert isinstance(results[2], errors.InvalidArgument)
    with pytest.raises(errors.MessageTooLarge):
        await producer.send("orders", too_big)
    with pytest.raises(errors.InvalidArgument):
        await producer.send("orders", b"", type=MessageType.TIME_TICK)
    await producer.close()


async def test_small_inflight_budget_still_delivers_everything(
    served: Cluster, client: HeadraceClient
) -> None:
    options = ProducerOptions(max_inflight_bytes=8 * 1024, max_batch_messages=4)
    async with client.producer(options) as producer:
        sends = [producer.send("orders", bytes(1024)) for _ in range(200)]
        results = await asyncio.gather(*sends)
        assert producer.budget.used == 0
    ticks = [r.timetick for r in results]
    assert len(set(ticks)) == 200


@pytest.mark.parametrize("vchannels", [1, 3, 60])
async def test_one_call_larger_than_the_inflight_budget_is_delivered(
    served: Cluster, client: HeadraceClient, vchannels: int
) -> None:
    """A call's items are pushed to their lanes before the call waits for the
    budget, which only their answers free: a single ``send_many`` of more bytes
    than the budget completes, whether its messages share a vchannel or not."""
    options = ProducerOptions(max_inflight_bytes=8 * 1024, max_batch_messages=4)
    messages = [
        Message(MessageType.INSERT, f"orders-{i % vchannels}", b"%d" % i + bytes(1024))
        for i in range(60)
    ]
    async with client.producer(options) as producer:
        async with asyncio.timeout(HANG_GUARD):
            outcomes = await producer.send_many(messages)
        assert producer.budget.used == 0
    assert len(outcomes) == 60
    assert all(isinstance(o, AppendResult) for o in outcomes), outcomes


async def test_start_positions(served: Cluster, client: HeadraceClient) -> None:
    async with client.producer() as producer:
        first = [await producer.send("v", f"{i}".encode()) for i in range(4)]
        latest = client.consume("v", start="latest")
        from_id = client.consume("v", start=first[2].id)
        assert [m.payload for m in await take(from_id, 2)] == [b"2", b"3"]
        assert await latest.next(timeout=0.2) is None
        await producer.send("v", b"4")
        assert [m.payload for m in await take(latest, 1)] == [b"4"]
    await latest.close()
    await from_id.close()
    with pytest.raises(errors.InvalidArgument):
        client.consume("v", start="middle")  # type: ignore[arg-type]


async def test_truncated_start_names_the_earliest(cluster: Cluster, client: HeadraceClient) -> None:
    await cluster.configure(PCHANNELS)
    # A tail buffer of a few KiB: old entries are read from the backend.
    node = await cluster.start_node("node-a", wal_options=WALOptions(buffer_bytes=4096))
    pchannel = route("v", PCHANNELS, NEW_CLUSTER_ROUTING)
    await cluster.assign(pchannel, "node-a", 1)
    async with client.producer() as producer:
        results = [await producer.send("v", bytes(1024)) for i in range(12)]
    assert node.manager is not None
    await node.manager.backend.truncate(pchannel, results[3].id)
    consumer = client.consume("v", start=results[0].id)
    with pytest.raises(errors.Truncated) as info:
        await consumer.next(timeout=HANG_GUARD)
    assert info.value.earliest == str(results[3].id)
    await consumer.close()


async def test_wait_ready_and_status(served: Cluster, client: HeadraceClient) -> None:
    owner = await client.wait_ready(PCHANNELS[0], timeout=HANG_GUARD)
    assert owner.node == "node-a" and owner.term == 1
    assert owner.address == served.nodes["node-a"].address
    with pytest.raises(errors.Unavailable):
        await client.wait_ready("pchannel-999", timeout=0.2)
    summary = await status(served.url, "test")
    assert summary["configured"] is True
    nodes = summary["nodes"]
    assert isinstance(nodes, list) and [n["node_id"] for n in nodes] == ["node-a"]
    pchannels = summary["pchannels"]
    assert isinstance(pchannels, list)
    assert [(p["pchannel"], p["owner"], p["term"], p["state"]) for p in pchannels] == [
        (PCHANNELS[0], "node-a", 1, "ASSIGNED"),
        (PCHANNELS[1], "node-a", 1, "ASSIGNED"),
    ]


async def test_unreachable_metastore_is_unavailable(tmp_path: object) -> None:
    # A client only opens: a missing SQLite file is NotFound (nothing is created).
    with pytest.raises(errors.NotFound):
        await HeadraceClient("sqlite:///proc/no/such/dir/meta.db").connect()
    with pytest.raises(errors.Unavailable):
        await HeadraceClient("etcd://127.0.0.1:1").connect()
    with pytest.raises(errors.Unavailable):
        await status("etcd://127.0.0.1:1", timeout=5.0)


async def test_closing_the_client_ends_waiting_consumers_and_producers(cluster: Cluster) -> None:
    """With no owner to wait for, a consumer and a producer wait on the cluster
    view; closing the client ends both with Closed, not a hang or a retry loop."""
    await cluster.configure(PCHANNELS)
    client = await HeadraceClient(cluster.url, "test").connect()
    consumer = client.consume("orders")
    producer = client.producer(ProducerOptions(deadline=HANG_GUARD * 3))
    waiting = asyncio.create_task(consumer.next(HANG_GUARD * 3))
    sending = asyncio.create_task(producer.send("orders", b"x"))
    await asyncio.sleep(0.2)
    assert not waiting.done() and not sending.done()
    await client.close()
    async with asyncio.timeout(HANG_GUARD):
        outcomes = await asyncio.gather(waiting, sending, return_exceptions=True)
    for outcome in outcomes:
        assert isinstance(outcome, errors.Closed) and not outcome.retryable, outcome
    await consumer.close()
    await producer.close()

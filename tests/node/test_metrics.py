"""What a Prometheus scrape of a node returns after a produce and consume run."""

from __future__ import annotations

import asyncio

import pytest

from headrace import errors
from headrace.client import HeadraceClient
from headrace.message.types import MessageType
from headrace.metrics import parse_listen
from headrace.node.metrics import lag_seconds
from headrace.proto import streaming_pb2 as pb
from headrace.tso import compose
from tests.node.harness import Cluster, scrape, until

P = "pchannel-000"


async def test_a_scrape_after_producing_and_consuming(cluster: Cluster) -> None:
    await cluster.configure([P])
    node = await cluster.start_node("node-a", metrics_listen="127.0.0.1:0")
    await cluster.assign(P, "node-a", 1)
    assert node.metrics_server is not None
    address = node.metrics_server.address
    async with HeadraceClient(cluster.url, "test") as client:
        async with client.producer() as producer:
            for i in range(50):
                await producer.send("v", f"m{i}".encode())
        consumer = client.consume("v")
        got = 0
        async for _entry in consumer:
            got += 1
            if got == 50:
                break
        await consumer.close()
    on_p = (("pchannel", P),)
    samples = await asyncio.to_thread(scrape, address)
    assert samples[("headrace_append_messages_total", on_p)] == 50
    assert samples[("headrace_append_bytes_total", on_p)] > 50 * len("m00")
    assert samples[("headrace_append_duration_seconds_count", on_p)] >= 1
    assert samples[("headrace_append_request_messages_sum", on_p)] == 50
    assert samples[("headrace_consume_messages_total", on_p)] >= 50
    assert samples[("headrace_consume_lag_seconds_count", on_p)] >= 1
    assert samples[("headrace_wal_term", on_p)] == 1
    assert samples[("headrace_wal_state", (("pchannel", P), ("state", "SERVING")))] == 1
    assert samples[("headrace_wal_state", (("pchannel", P), ("state", "CLOSED")))] == 0
    assert samples[("headrace_wal_appended_messages_total", on_p)] >= 50
    assert samples[("headrace_wal_opens_total", (("outcome", "served"),))] == 1
    assert not any("vchannel" in dict(labels) for _name, labels in samples)

    await cluster.assign(P, "node-a", 2)  # the WAL is released and opened again
    await until(lambda: node.manager is not None and node.manager.held[P].term == 2)
    samples = await asyncio.to_thread(scrape, address)
    assert samples[("headrace_wal_opens_total", (("outcome", "served"),))] == 2
    assert samples[("headrace_wal_releases_total", (("drained", "false"),))] == 1
    assert samples[("headrace_wal_term", on_p)] == 2


async def test_failed_messages_are_counted_by_code(cluster: Cluster) -> None:
    await cluster.configure([P])
    node = await cluster.start_node("node-a", metrics_listen="127.0.0.1:0")
    await cluster.assign(P, "node-a", 1)
    assert node.metrics_server is not None and node.producer_service is not None
    good = pb.ProduceMessage(type=int(MessageType.INSERT), vchannel="v", payload=b"ok")
    unknown = pb.ProduceMessage(type=9999, vchannel="v", payload=b"?")
    bad_name = pb.ProduceMessage(type=int(MessageType.INSERT), vchannel="", payload=b"?")
    batch = pb.ProduceBatch(batch_id=1, messages=[good, unknown, good, bad_name])
    await node.producer_service.append(P, [batch])
    samples = await asyncio.to_thread(scrape, node.metrics_server.address)
    on_p = (("pchannel", P),)
    assert samples[("headrace_append_messages_total", on_p)] == 2
    assert samples[("headrace_append_request_messages_sum", on_p)] == 4
    code = (("code", "INVALID_ARGUMENT"), ("pchannel", P))
    assert samples[("headrace_append_failed_messages_total", code)] == 2


async def test_a_node_without_metrics_serves_none(cluster: Cluster) -> None:
    await cluster.configure([P])
    node = await cluster.start_node("node-a")
    assert node.metrics is None and node.metrics_server is None


def test_listen_addresses_and_lag() -> None:
    assert parse_listen("0.0.0.0:9400") == ("0.0.0.0", 9400)
    assert parse_listen(":9400") == ("0.0.0.0", 9400)
    for bad in ("9400", "host:", "host:port", "h:70000"):
        with pytest.raises(errors.InvalidArgument, match="not host:port"):
            parse_listen(bad)
    assert lag_seconds(compose(1_000, 5), compose(3_500, 1)) == 2.5
    assert lag_seconds(compose(3_500, 1), compose(1_000, 5)) == 0.0

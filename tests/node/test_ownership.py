"""How a node follows assignment records, answers for pchannels it does not
serve, and manages its WALs, session and health."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headrace import errors
from headrace.client.manager import ManagerClient
from headrace.cluster import Assignment, AssignmentState
from headrace.node.assignments import Action, decide
from headrace.node.server import NodeConfig, StreamingNode, advertised_address
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.wal.api import WALState
from tests.node.harness import HANG_GUARD, Cluster, error_details, record, until

P = "pchannel-000"
A = AssignmentState


@pytest.mark.parametrize(
    ("rec", "held", "action"),
    [
        (None, None, Action.NONE),
        (None, 3, Action.CLOSE),
        (record(A.ASSIGNING, "me", 4), None, Action.OPEN),
        (record(A.ASSIGNING, "me", 4), 4, Action.OPEN),
        (record(A.ASSIGNING, "me", 4), 5, Action.NONE),
        (record(A.ASSIGNING, "other", 4), 3, Action.CLOSE),
        (record(A.ASSIGNING, "other", 4), None, Action.NONE),
        (record(A.ASSIGNED, "me", 4), 4, Action.NONE),
        (record(A.ASSIGNED, "me", 4), None, Action.NONE),
        (record(A.ASSIGNED, "me", 5), 4, Action.CLOSE),
        (record(A.ASSIGNED, "other", 5), 4, Action.CLOSE),
        (record(A.UNASSIGNING, "me", 4), 4, Action.RELEASE),
        (record(A.UNASSIGNING, "me", 4), None, Action.RELEASE),
        (record(A.UNASSIGNED, "me", 4), 4, Action.CLOSE),
        (record(A.UNASSIGNED, "me", 3), 4, Action.NONE),
        (record(A.UNAVAILABLE, "", 4), 4, Action.CLOSE),
    ],
)
def test_decide(rec: Assignment | None, held: int | None, action: Action) -> None:
    assert decide(rec, "me", held) is action


def test_advertised_address() -> None:
    assert advertised_address("0.0.0.0:0", 4321, "127.0.0.1") == "127.0.0.1:4321"
    assert advertised_address("127.0.0.2:7000", 7000, "127.0.0.1") == "127.0.0.2:7000"
    with pytest.raises(errors.InvalidArgument):
        NodeConfig(node_id="n", metastore_url="sqlite:///x.db", listen="nowhere")
    with pytest.raises(errors.InvalidArgument):
        NodeConfig(node_id="a/b", metastore_url="sqlite:///x.db")


async def test_node_registers_and_reports_health(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    kv = await cluster.metastore.get(cluster.keys.node("node-a"))
    assert kv is not None and kv.lease != 0
    assert json.loads(kv.value)["address"] == node.address
    assert node.address.startswith("127.0.0.1:") and not node.address.endswith(":0")
    async with grpc.aio.insecure_channel(node.address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "headrace.v1.Producer"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
    await node.stop()
    assert await cluster.metastore.get(cluster.keys.node("node-a")) is None
    del cluster.nodes["node-a"]


async def test_wrong_node_answers_not_owner_naming_the_owner(cluster: Cluster) -> None:
    owner = await cluster.start_node("node-a")
    other = await cluster.start_node("node-b")
    await cluster.assign(P, "node-a", 3)
    # node-b learns of the record through its watch.
    directory = other.manager.directory if other.manager else None
    assert directory is not None

    def knows_owner() -> bool:
        known = directory.assignments.get(P)
        return known is not None and known.state is A.ASSIGNED

    await until(knows_owner)
    async with grpc.aio.insecure_channel(other.address) as channel:
        call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
        await call.write(pb.ProduceRequest(open=pb.OpenProducer(pchannel=P)))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        details = error_details(info.value)
        assert details["code"] == "NOT_OWNER" and details["retryable"] is True
        assert details["owner"] == "node-a" and details["term"] == 3
        assert details["owner_address"] == owner.address

        consume = rpc.consumer_stub(channel).Consume(pb.ConsumeRequest(pchannel=P))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await consume.read()
        assert info.value.code() is grpc.StatusCode.FAILED_PRECONDITION


async def test_manager_open_with_an_old_term_is_fenced(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 5)
    manager = ManagerClient(node.address)
    try:
        listed = await manager.list_wals()
        assert listed.node_id == "node-a"
        status = listed.find(P)
        assert status is not None and (status.term, status.state) == (5, "SERVING")
        assert status.last_id.startswith("memory:") and status.last_timetick > 0
        assert "buffer_bytes" in status.stats
        with pytest.raises(errors.Fenced) as info:
            await manager.open_wal(P, 4)
        assert (info.value.term, info.value.current_term) == (4, 5)
        with pytest.raises(errors.Fenced):
            await manager.open_wal(P, 1)
        with pytest.raises(errors.NotOwner):  # no record names this node
            await manager.open_wal("pchannel-009", 2)
        assert (await manager.list_wals()).find("pchannel-009") is None
    finally:
        await manager.close()


async def test_unassigning_drains_then_marks_unassigned(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    assert node.manager is not None
    wal = node.manager.get(P)
    released = await cluster.unassign(P, target="node-b")
    assert released.state is AssignmentState.UNASSIGNED and released.term == 1
    assert wal.state is WALState.CLOSED and P not in node.manager.held


async def test_a_newer_record_for_another_node_closes_the_local_wal(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    await cluster.start_node("node-b")
    await cluster.assign(P, "node-b", 2)
    assert node.manager is not None
    manager = node.manager
    await until(lambda: P not in manager.held)
    with pytest.raises(errors.NotOwner) as info:
        node.manager.get(P)
    assert info.value.owner == "node-b" and info.value.term == 2


async def test_lost_session_closes_wals_and_registers_again(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a", session_ttl=1.0)
    await cluster.assign(P, "node-a", 1)
    before = await cluster.metastore.get(cluster.keys.node("node-a"))
    assert before is not None
    await cluster.metastore.revoke_lease(before.lease)
    assert node.manager is not None
    async with asyncio.timeout(HANG_GUARD):
        while True:
            after = await cluster.metastore.get(cluster.keys.node("node-a"))
            if after is not None and after.lease != before.lease and node.registered.is_set():
                break
            await asyncio.sleep(0.02)
    assert P not in node.manager.held
    record_now = await cluster.record(P)
    assert record_now is not None and record_now.state is AssignmentState.ASSIGNED
    await cluster.assign(P, "node-a", 2)
    assert node.manager.get(P).term == 2


async def test_graceful_stop_drains_and_revokes(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    assert node.manager is not None
    wal = node.manager.get(P)
    await node.stop()
    del cluster.nodes["node-a"]
    assert wal.state is WALState.CLOSED
    assert await cluster.metastore.get(cluster.keys.node("node-a")) is None


async def test_unreachable_metastore_fails_start_cleanly(cluster: Cluster) -> None:
    config = NodeConfig(
        node_id="node-x", metastore_url="sqlite:///proc/no/such/dir/meta.db", wal_backend="memory"
    )
    with pytest.raises(errors.Unavailable):
        await StreamingNode(config).start()

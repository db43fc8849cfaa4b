"""A node and the cluster's message format: it advertises what it reads and
writes, writes the cluster's format, records it in the pchannel's log formats
before writing, and refuses to open a WAL it could not write or read."""

from __future__ import annotations

import pytest

from headrace import errors
from headrace.cluster import Assignment, AssignmentState, ClusterFormat, LogFormats, NodeInfo
from headrace.message.formats import FormatSupport
from tests.node.harness import Cluster, until

OLD = FormatSupport.of({1}, {1})
NEW = FormatSupport.of({1, 2}, {1})
"""A release that already reads format 2 (injected: this release knows only 1)."""

P = "pchannel-000"


async def registered(cluster: Cluster, node_id: str) -> NodeInfo:
    kv = await cluster.metastore.get(cluster.keys.node(node_id))
    assert kv is not None
    return NodeInfo.from_json(kv.value)


async def test_a_node_advertises_its_formats_and_writes_the_clusters(cluster: Cluster) -> None:
    await cluster.configure([P])
    await cluster.start_node("node-a", formats=NEW)
    info = await registered(cluster, "node-a")
    assert (info.reads, info.writes) == ((1, 2), (1,))
    await cluster.assign(P, "node-a", 1)
    records = cluster.store.channels[P].records
    assert records, "opening the WAL writes a FENCE"
    assert {record[2] for record in records} == {1}
    # The log held format 1 already (no record: written before formats were recorded).
    assert await cluster.metastore.get(cluster.keys.log_format(P)) is None


async def wal_refusal(cluster: Cluster, node_id: str) -> str:
    """The error the node reports for the pchannel it may not open."""
    manager = cluster.nodes[node_id].manager
    found: list[str] = []

    def refused() -> bool:
        try:
            manager.get(P)
        except errors.Unavailable as exc:
            found.append(exc.message)
            return True
        except errors.NotOwner:
            return False
        return False

    await until(refused)
    return found[-1]


@pytest.mark.parametrize(
    ("cluster_format", "written", "expected"),
    [
        (2, None, "the cluster writes message format 2, which this release cannot write"),
        (1, (1, 2), "its log holds message format {2}, which a node that reads {1}"),
    ],
)
async def test_a_node_refuses_a_wal_it_cannot_write_or_read(
    cluster: Cluster, cluster_format: int, written: tuple[int, ...] | None, expected: str
) -> None:
    await cluster.configure([P])
    await cluster.metastore.put(
        cluster.keys.format, ClusterFormat(version=cluster_format).to_json()
    )
    if written is not None:
        await cluster.metastore.put(
            cluster.keys.log_format(P), LogFormats(written=written).to_json()
        )
    await cluster.start_node("node-a", formats=OLD)
    await cluster.write(
        Assignment(pchannel=P, state=AssignmentState.ASSIGNING, term=1, node="node-a")
    )
    message = await wal_refusal(cluster, "node-a")
    assert f"node node-a refuses to open the WAL of {P} for writing: {expected}" in message
    assert P not in cluster.store.channels or not cluster.store.channels[P].records
    record = await cluster.record(P)
    assert record is not None and record.state is AssignmentState.ASSIGNING
    assert cluster.nodes["node-a"].fatal is None, "a refusal does not stop the node"


async def test_a_malformed_formats_record_is_no_damage_of_the_log(cluster: Cluster) -> None:
    await cluster.configure([P])
    await cluster.metastore.put(cluster.keys.log_format(P), b"{not json")
    await cluster.start_node("node-a")
    await cluster.write(
        Assignment(pchannel=P, state=AssignmentState.ASSIGNING, term=1, node="node-a")
    )
    message = await wal_refusal(cluster, "node-a")
    assert "malformed LogFormats record" in message
    assert P not in cluster.nodes["node-a"].manager.held, "not held as a damaged WAL"

"""Issue #12: after a change of owner, a pchannel of collection data only is
truncated below its checkpoint by the new owner, which takes what the old
owner knew of the opaque records from its retention record."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.message.ids import MessageID
from headrace.node.server import NodeConfig, StreamingNode
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import LocalBackend, files
from headrace.wal.progress import RetentionOptions
from headrace.wal.retention import RetentionRecord, retention_key
from tests.node.harness import Cluster, make_cluster, until
from tests.node.test_retention_node import (
    DEFAULT_RETENTION,
    P,
    checkpoint,
    insert_many,
    moved,
    orders,
)

KEEPING = dataclasses.replace(DEFAULT_RETENTION, margin_s=3600)
"""The old owner truncates nothing (its margin holds everything back), so
what the new owner truncates is its own doing."""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


async def local_node(
    cluster: Cluster, node_id: str, options: RetentionOptions, root: Path
) -> StreamingNode:
    config = NodeConfig(
        node_id=node_id,
        metastore_url=cluster.url,
        cluster=cluster.keys.cluster,
        wal_backend="local",
        wal_options=WALOptions(timetick_interval_ms=20, retention=options),
        session_ttl=3.0,
        shutdown_grace=0.5,
    )
    node = StreamingNode(config, backend=LocalBackend(str(root), segment_bytes=2048))
    await node.start()
    cluster.nodes[node_id] = node
    return node


def held(node: StreamingNode) -> WAL:
    assert node.manager is not None
    wal = node.manager.held[P]
    assert isinstance(wal, WAL)
    return wal


async def record(cluster: Cluster) -> RetentionRecord | None:
    kv = await cluster.metastore.get(retention_key(cluster.keys, P))
    return None if kv is None else RetentionRecord.from_json(kv.value)


async def wait_record(cluster: Cluster, node_id: str, covers: MessageID) -> RetentionRecord:
    """The retention record of ``node_id`` once its summary covers ``covers``."""
    async with asyncio.timeout(20):
        while True:
            found = await record(cluster)
            summary = None if found is None or found.node != node_id else found.opaque_summary()
            if found is not None and summary is not None and summary.known_until >= covers:
                return found
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("change", ["handoff", "restart"])
async def test_the_new_owner_truncates_a_collection_only_pchannel(
    cluster: Cluster, tmp_path: Path, change: str
) -> None:
    """``handoff``: a graceful move to node-b; ``restart``: node-a stops and
    the pchannel is assigned to node-b."""
    root = tmp_path / "wal"
    await cluster.configure([P])
    collection = await orders(cluster)
    node_a = await local_node(cluster, "node-a", KEEPING, root)
    await local_node(cluster, "node-b", DEFAULT_RETENTION, root)
    await cluster.assign(P, "node-a", 1)
    results = await insert_many(held(node_a), collection, 60)
    target = results[40]
    await checkpoint(cluster, target)
    old = await wait_record(cluster, "node-a", results[-1].id)
    assert old.complete and not old.opaque_last  # it wrote everything: no opaque record
    directory = str(root / P)
    before = files.list_segments(directory)
    assert len(before) > 5
    reader = LocalBackend(str(root), segment_bytes=2048)
    first = await reader.earliest(P)

    if change == "handoff":
        await cluster.move(P, "node-b")
    else:
        await node_a.stop()
        await cluster.assign(P, "node-b", 2)
    node_b = cluster.nodes["node-b"]
    assert node_b.housekeeper is not None
    housekeeper = node_b.housekeeper

    def truncated() -> bool:
        decision = housekeeper.decisions.get(P)
        return decision is not None and decision.below is not None

    await until(truncated)
    assert "the checkpoint" in housekeeper.decisions[P].reason
    await moved(reader, first)
    await until(lambda: before[0] not in files.list_segments(directory))
    earliest = await reader.earliest(P)
    assert earliest is not None and first is not None
    assert first < earliest <= target.id
    new = await wait_record(cluster, "node-b", target.id)
    assert new.term == 2 and new.complete  # it inherited a complete summary

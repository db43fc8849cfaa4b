"""A full disk under a node, injected at the file layer (always runs).

Producers get STORAGE_FULL, naming the file, within their deadline (not a
timeout or NOT_OWNER); the node keeps the pchannel; a message sent while the
disk is full is written exactly once after space is freed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.client import HeadraceClient
from headrace.client.lane import expiry_error, worth_a_warning
from headrace.client.producer import ProducerOptions
from headrace.message.types import MessageType
from headrace.node.server import NodeConfig, StreamingNode
from headrace.wal.framework import WALOptions
from headrace.wal.local import LocalBackend, space
from tests.node.harness import HANG_GUARD, Cluster, make_cluster

P = "pchannel-000"
RESERVE = 1 << 20


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


@pytest.fixture
def disk(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """The free bytes the WAL sees; set ``free`` to fill or free the disk."""
    state = {"free": 1 << 30}
    monkeypatch.setattr(space, "free_space", lambda directory: (state["free"], 1 << 34))
    monkeypatch.setattr(space, "READ_EVERY_S", 0.0)
    yield state


async def start(cluster: Cluster, root: Path) -> StreamingNode:
    await cluster.configure([P])
    config = NodeConfig(
        node_id="node-a",
        metastore_url=cluster.url,
        cluster=cluster.keys.cluster,
        wal_options=WALOptions(timetick_interval_ms=20),
        session_ttl=3.0,
        shutdown_grace=0.5,
    )
    node = StreamingNode(config, backend=LocalBackend(str(root), reserve_bytes=RESERVE))
    await node.start()
    cluster.nodes[config.node_id] = node
    await cluster.assign(P, "node-a", 1)
    return node


async def test_storage_full_reaches_the_producer_and_recovery_is_exactly_once(
    cluster: Cluster, tmp_path: Path, disk: dict[str, int]
) -> None:
    node = await start(cluster, tmp_path / "wal")
    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        quick = client.producer(ProducerOptions(deadline=2.0))
        first = await quick.send("v", b"before")
        disk["free"] = RESERVE + 10
        started = time.monotonic()
        with pytest.raises(errors.StorageFull) as full:
            await quick.send("v", b"refused")
        assert time.monotonic() - started < HANG_GUARD
        assert full.value.retryable
        assert str(tmp_path / "wal" / P) in full.value.message
        await quick.close()
        assert node.manager.get(P).state.value == "SERVING"

        patient = client.producer(ProducerOptions(deadline=HANG_GUARD))
        pending = asyncio.create_task(patient.send("v", b"while full"))
        await asyncio.sleep(0.5)
        assert not pending.done()
        disk["free"] = 1 << 30
        late = await asyncio.wait_for(pending, HANG_GUARD)
        after = await patient.send("v", b"after")
        await patient.close()
        assert first.id < late.id < after.id

        got = []
        async with client.consume("v", start="earliest") as consumer:
            while len(got) < 3:
                entry = await consumer.next(timeout=HANG_GUARD)
                assert entry is not None
                if entry.message.type is MessageType.INSERT:
                    got.append(entry.message.payload)
            extra = await consumer.next(timeout=0.5)
            assert extra is None or extra.message.type is not MessageType.INSERT
    assert got == [b"before", b"while full", b"after"]


def test_the_expiry_error_is_what_the_owner_answered() -> None:
    full = errors.StorageFull("disk full")
    timeout = errors.Unavailable("did not answer in time")
    moved = errors.NotOwner("node lost its session")
    assert expiry_error(None, timeout, cut_by_deadline=True) is timeout
    assert expiry_error(full, timeout, cut_by_deadline=True) is full
    assert expiry_error(full, moved, cut_by_deadline=False) is full
    assert expiry_error(moved, full, cut_by_deadline=False) is full
    assert expiry_error(moved, timeout, cut_by_deadline=False) is timeout


def test_retries_warn_once_per_kind_of_trouble_not_for_owner_changes() -> None:
    full = errors.StorageFull("disk full")
    assert worth_a_warning(None, full)
    assert not worth_a_warning(full, errors.StorageFull("still full"))
    assert worth_a_warning(full, errors.Unavailable("node unreachable"))
    assert not worth_a_warning(None, errors.NotOwner("moved"))
    assert not worth_a_warning(full, errors.Fenced("newer term"))

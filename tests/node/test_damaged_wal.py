"""A damaged local log stops only its own pchannel, at the damaged record.

The node holds it in state CORRUPT (ListWALs names the file and offset),
consumers get every record before the damage and then CORRUPT, producers get
CORRUPT at once, the node's other pchannel keeps serving, and the node does
not spin retrying the open.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.client import HeadraceClient
from headrace.client.manager import ManagerClient
from headrace.cluster import NEW_CLUSTER_ROUTING, route
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.node.server import NodeConfig, StreamingNode
from headrace.node.walmanager import DamageRetry
from headrace.table.records import CheckpointRecord
from headrace.tso import LocalTSO
from headrace.wal.damaged import DamagedWAL
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import LocalBackend, files
from headrace.wal.local.repair import repair
from headrace.wal.local.segment import FRAME, HEADER_SIZE
from tests.node.harness import HANG_GUARD, Cluster, make_cluster, until

PCHANNELS = ["pchannel-000", "pchannel-001"]
BAD, GOOD = PCHANNELS
OPTIONS = WALOptions(timetick_interval_ms=20)


def vchannel_of(pchannel: str) -> str:
    return next(
        v
        for v in (f"v{i}" for i in range(100))
        if route(v, PCHANNELS, NEW_CLUSTER_ROUTING) == pchannel
    )


def frames(path: Path) -> list[tuple[int, bytes]]:
    """Offset and body of every frame of a segment file."""
    data = path.read_bytes()
    out, pos = [], HEADER_SIZE
    while pos + FRAME.size <= len(data):
        length = FRAME.unpack_from(data, pos)[0]
        out.append((pos, data[pos + FRAME.size : pos + FRAME.size + length]))
        pos += FRAME.size + length
    return out


async def write_log(root: Path, vchannel: str, count: int) -> None:
    backend = LocalBackend(str(root))
    wal = await WAL.open(backend, BAD, 1, tso=LocalTSO(), options=OPTIONS)
    for i in range(count):
        await wal.append(Message(MessageType.INSERT, vchannel, b"m%d" % i))
    await wal.close()
    await backend.close()


def damage_middle(root: Path) -> tuple[Path, int, list[bytes]]:
    """Flip a byte in the body of the middle INSERT record of the first segment;
    its file, offset and the payloads of the INSERTs before it."""
    name = files.list_segments(str(root / BAD))[0]
    path = root / BAD / name.filename
    inserts = [
        (offset, codec.decode(body))
        for offset, body in frames(path)
        if codec.decode(body).type is MessageType.INSERT
    ]
    offset, _ = inserts[len(inserts) // 2]
    data = bytearray(path.read_bytes())
    data[offset + FRAME.size + 1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path, offset, [msg.payload for _, msg in inserts[: len(inserts) // 2]]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


async def start_local_node(cluster: Cluster, root: Path) -> StreamingNode:
    config = NodeConfig(
        node_id="node-a",
        metastore_url=cluster.url,
        cluster=cluster.keys.cluster,
        wal_backend="local",
        wal_options=OPTIONS,
        session_ttl=3.0,
        shutdown_grace=0.5,
    )
    node = StreamingNode(config, backend=LocalBackend(str(root)))
    await node.start()
    cluster.nodes[config.node_id] = node
    return node


async def inserts_until_corrupt(
    client: HeadraceClient, vchannel: str
) -> tuple[list[bytes], errors.CorruptData]:
    """The INSERT payloads of ``vchannel`` read from the start until the read
    fails with CorruptData, and that error (the test fails if it never does)."""
    got: list[bytes] = []
    async with client.consume(vchannel, start="earliest") as consumer:
        with pytest.raises(errors.CorruptData) as corrupt:
            async with asyncio.timeout(HANG_GUARD):
                while True:
                    entry = await consumer.next(timeout=HANG_GUARD)
                    assert entry is not None
                    if entry.message.type is MessageType.INSERT:
                        got.append(entry.message.payload)
    return got, corrupt.value


async def test_a_damaged_log_stops_only_its_pchannel_at_the_damage(
    cluster: Cluster, tmp_path: Path
) -> None:
    root = tmp_path / "wal"
    bad_vchannel, good_vchannel = vchannel_of(BAD), vchannel_of(GOOD)
    await write_log(root, bad_vchannel, 20)
    path, offset, before = damage_middle(root)
    assert len(before) == 10

    await cluster.configure(PCHANNELS)
    node = await start_local_node(cluster, root)
    await cluster.assign(GOOD, "node-a", 1)
    await cluster.assign(BAD, "node-a", 2)

    manager = ManagerClient(node.address)
    try:
        listed = {w.pchannel: w for w in (await manager.list_wals()).wals}
    finally:
        await manager.close()
    assert listed[GOOD].state == "SERVING"
    assert listed[BAD].state == "CORRUPT"
    assert listed[BAD].stats["corrupt_file"] == str(path)
    assert listed[BAD].stats["corrupt_offset"] == str(offset)
    assert f"byte offset {offset}" in listed[BAD].stats["error"]

    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        producer = client.producer()
        good = await producer.send(good_vchannel, b"still served")
        assert good.term == 1
        started = time.monotonic()
        with pytest.raises(errors.CorruptData) as refused:
            await producer.send(bad_vchannel, b"refused")
        assert time.monotonic() - started < HANG_GUARD
        assert str(path) in refused.value.message
        await producer.close()

        got, corrupt = await inserts_until_corrupt(client, bad_vchannel)
        assert got == before
        assert str(path) in corrupt.message
        assert f"byte offset {offset}" in corrupt.message

    # No hot retry loop: one failed open, no new segments.
    segments = files.list_segments(str(root / BAD))
    await asyncio.sleep(1.0)
    assert files.list_segments(str(root / BAD)) == segments
    assert node.manager.get(BAD).state.value == "CORRUPT"


async def test_after_repair_beside_the_node_it_serves_again_with_the_prefix(
    cluster: Cluster, tmp_path: Path
) -> None:
    root = tmp_path / "wal"
    bad_vchannel = vchannel_of(BAD)
    await write_log(root, bad_vchannel, 12)
    path, offset, before = damage_middle(root)
    await cluster.configure(PCHANNELS)
    node = await start_local_node(cluster, root)
    await cluster.assign(BAD, "node-a", 1)
    assert node.manager.get(BAD).state.value == "CORRUPT"

    report = repair(str(root), BAD)  # the CORRUPT pchannel holds no writer
    assert report.damage is not None and report.damage.offset == offset
    node.manager.damage_retry = DamageRetry(base_s=0.05, cap_s=0.05)

    def serving() -> bool:
        held = node.manager.held.get(BAD)
        return held is not None and held.state.value == "SERVING"

    await until(serving)
    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        producer = client.producer()
        await producer.send(bad_vchannel, b"after repair")
        await producer.close()
        got: list[bytes] = []
        async with client.consume(bad_vchannel, start="earliest") as consumer:
            async with asyncio.timeout(HANG_GUARD):
                while not got or got[-1] != b"after repair":
                    entry = await consumer.next(timeout=HANG_GUARD)
                    assert entry is not None
                    if entry.message.type is MessageType.INSERT:
                        got.append(entry.message.payload)
    assert got == [*before, b"after repair"]
    assert report.damage.path == str(path) and report.moved


async def test_damage_a_consumer_finds_makes_the_pchannel_corrupt(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Damage outside what opening reads: the WAL serves until a consumer
    reaches it; then the pchannel turns CORRUPT (its writer released, so
    repair can run beside the node)."""
    root = tmp_path / "wal"
    bad_vchannel = vchannel_of(BAD)
    await write_log(root, bad_vchannel, 12)
    backend = LocalBackend(str(root))
    wal = await WAL.open(backend, BAD, 2, tso=LocalTSO(), options=OPTIONS)
    last = await wal.append(Message(MessageType.INSERT, bad_vchannel, b"term 2"))
    await wal.close()
    await backend.close()
    path, offset, before = damage_middle(root)
    # Flushed up to its last record: opening reads from there (a WAL rebuilds
    # its growing segments from the checkpoint), not through the damage.
    checkpoint = CheckpointRecord(pchannel=BAD, position=str(last.id), term=2)
    await cluster.metastore.put(cluster.keys.checkpoint(BAD), checkpoint.to_json())

    await cluster.configure(PCHANNELS)
    node = await start_local_node(cluster, root)
    await cluster.assign(BAD, "node-a", 3)
    assert node.manager.get(BAD).state.value == "SERVING"

    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        got, _ = await inserts_until_corrupt(client, bad_vchannel)
        assert got == before

        def corrupt_without_writer() -> bool:
            held = node.manager.held.get(BAD)
            return isinstance(held, DamagedWAL)

        await until(corrupt_without_writer)
        manager = ManagerClient(node.address)
        try:
            listed = {w.pchannel: w for w in (await manager.list_wals()).wals}
        finally:
            await manager.close()
        assert listed[BAD].state == "CORRUPT"
        assert listed[BAD].stats["corrupt_file"] == str(path)
        assert listed[BAD].stats["corrupt_offset"] == str(offset)
        producer = client.producer()
        with pytest.raises(errors.CorruptData):
            await producer.send(bad_vchannel, b"refused")
        await producer.close()
    report = repair(str(root), BAD)
    assert report.damage is not None and report.damage.offset == offset


async def test_a_damaged_segment_header_stops_the_pchannel_after_the_earlier_segments(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A damaged header of a later segment acts like a damaged record at its
    offset 0: consumers get the records of the earlier segments, then CORRUPT."""
    root = tmp_path / "wal"
    bad_vchannel = vchannel_of(BAD)
    await write_log(root, bad_vchannel, 5)
    backend = LocalBackend(str(root))
    wal = await WAL.open(backend, BAD, 2, tso=LocalTSO(), options=OPTIONS)
    await wal.append(Message(MessageType.INSERT, bad_vchannel, b"term 2"))
    await wal.close()
    await backend.close()
    first, second = (root / BAD / n.filename for n in files.list_segments(str(root / BAD)))
    data = bytearray(second.read_bytes())
    data[20] ^= 0xFF  # inside the header: its CRC fails
    second.write_bytes(bytes(data))

    await cluster.configure(PCHANNELS)
    node = await start_local_node(cluster, root)
    await cluster.assign(BAD, "node-a", 3)
    assert node.manager.get(BAD).state.value == "CORRUPT"
    stats = node.manager.get(BAD).stats()
    assert (stats["corrupt_file"], stats["corrupt_offset"]) == (str(second), 0)

    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        got, corrupt = await inserts_until_corrupt(client, bad_vchannel)
    assert got == [b"m%d" % i for i in range(5)]
    assert str(second) in corrupt.message
    assert first.exists()

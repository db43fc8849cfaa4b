"""Collections through real streaming nodes: segments stamped, bad batches
refused before anything is written, flush requests turned into seals and a
SealRecord under the owner's term, growing segments carried over a handoff."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from headrace import errors
from headrace.client import HeadraceClient
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.node.collections import NodeCollections
from headrace.table import CheckpointRecord, messages
from headrace.table.collections import Collection, CollectionSpec, CollectionStore
from headrace.table.messages import COLLECTION, SEGMENT
from headrace.table.payloads import encode_rows
from headrace.table.records import SealRecord, seal_key
from headrace.wal.api import AppendResult
from headrace.wal.memory import MemoryBackend
from spark_apps.shard import fold
from tests.node.harness import Cluster, make_cluster
from tests.wal.test_framework import backend_log

P = "pch-0"
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])


def rows(pks: Sequence[int]) -> pa.Table:
    return pa.table(
        {"pk": pa.array(pks, pa.int64()), "name": [f"n{p}" for p in pks]}, schema=SCHEMA
    )


def insert(collection: Collection, shard: int, pks: Sequence[int]) -> Message:
    """An insert as a client sends it: no segment."""
    return Message(
        MessageType.INSERT,
        collection.vchannels[shard],
        encode_rows(rows(pks)),
        {COLLECTION: collection.name},
    )


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path, name="coll"):
        await c.start_pair(P)
        yield c


async def send(cluster: Cluster, batch: list[Message]) -> list[AppendResult | errors.HeadraceError]:
    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        producer = client.producer()
        try:
            return list(await producer.send_many(batch))
        finally:
            await producer.close()


async def the_log(cluster: Cluster) -> list[LogEntry]:
    return [
        e
        for e in await backend_log(MemoryBackend(cluster.store), P)
        if not e.message.type.is_system
    ]


async def seal_record(cluster: Cluster) -> SealRecord | None:
    kv = await cluster.metastore.get(seal_key(cluster.keys, P))
    return None if kv is None else SealRecord.from_json(kv.value)


def acked(outcome: AppendResult | errors.HeadraceError) -> AppendResult:
    assert isinstance(outcome, AppendResult), outcome
    return outcome


def segment_at(entries: list[LogEntry], position: MessageID) -> int:
    (entry,) = [e for e in entries if e.id == position]
    return int(entry.message.properties[SEGMENT])


async def test_segments_seals_and_a_handoff_through_real_nodes(cluster: Cluster) -> None:
    orders = await CollectionStore(cluster.metastore, cluster.keys).create(
        CollectionSpec("orders", SCHEMA, "pk", shards=2)
    )
    # inserts get the growing segment of their shard
    first = [
        acked(o) for o in await send(cluster, [insert(orders, 0, [1, 2]), insert(orders, 1, [3])])
    ]
    entries = await the_log(cluster)
    segments = [segment_at(entries, r.id) for r in first]
    assert segments[0] != segments[1]

    # a bad batch is refused naming the field; nothing of it is in the log
    bad = Message(
        MessageType.INSERT,
        "orders-0",
        encode_rows(pa.table({"pk": pa.array([9], pa.int64()), "name": pa.array([1])})),
        {COLLECTION: "orders"},
    )
    good, refused = await send(cluster, [insert(orders, 0, [4]), bad])
    assert isinstance(refused, errors.InvalidArgument)
    assert "field 'name' has type int64, expected string" in refused.message
    assert segment_at(await the_log(cluster), acked(good).id) == segments[0]
    assert len(await the_log(cluster)) == 3

    # a flush request becomes the seals, and the owner records the last one
    (sealed,) = await send(cluster, [messages.flush_request(orders, "orders-1")])
    entries = await the_log(cluster)
    seals = [e for e in entries if e.message.type is MessageType.FLUSH]
    assert [int(e.message.properties[SEGMENT]) for e in seals] == segments
    assert acked(sealed).id == seals[-1].id
    record = await seal_record(cluster)
    assert record is not None
    assert (record.position_id(), record.node, record.term) == (seals[-1].id, "node-a", 1)

    # the flush of (beginning, seal] commits: its checkpoint is where the next owner starts
    await cluster.metastore.put(
        cluster.keys.checkpoint(P),
        CheckpointRecord(pchannel=P, position=str(seals[-1].id), term=1, node="node-a").to_json(),
    )
    growing = acked((await send(cluster, [insert(orders, 0, [5, 6])]))[0])
    await cluster.move(P, "node-b")

    # the new owner goes on filling the growing segment, then seals it
    more = acked((await send(cluster, [insert(orders, 0, [7])]))[0])
    (done,) = await send(cluster, [messages.flush_request(orders, "orders-0")])
    entries = await the_log(cluster)
    assert segment_at(entries, more.id) == segment_at(entries, growing.id)
    assert segment_at(entries, more.id) not in segments
    record = await seal_record(cluster)
    assert record is not None
    assert (record.position_id(), record.node, record.term) == (acked(done).id, "node-b", 2)

    # the next flush range (checkpoint, last seal] folds on every shard
    in_range = [e for e in entries if seals[-1].id < e.id <= record.position_id()]
    folded = {
        v: fold(orders, v, [e for e in in_range if e.message.vchannel == v])
        for v in orders.vchannels
    }
    (segment,) = folded["orders-0"].segments
    assert segment.rows.column("pk").to_pylist() == [5, 6, 7]
    assert folded["orders-1"].segments == ()


async def test_a_deposed_owner_cannot_record_a_seal(cluster: Cluster) -> None:
    orders = await CollectionStore(cluster.metastore, cluster.keys).create(
        CollectionSpec("orders", SCHEMA, "pk", shards=1)
    )
    inserted, sealed = await send(
        cluster, [insert(orders, 0, [1]), messages.flush_request(orders, "orders-0")]
    )
    position = acked(sealed).id
    await cluster.move(P, "node-b")
    old = NodeCollections(cluster.metastore, cluster.keys, "node-a")
    with pytest.raises(errors.Fenced, match="under term 1"):
        await old.record_seal(P, 1, position, 0)
    before = await seal_record(cluster)
    assert before is not None and before.position_id() == position
    new = NodeCollections(cluster.metastore, cluster.keys, "node-b")
    await new.record_seal(P, 2, acked(inserted).id, 0)  # an older position
    assert await seal_record(cluster) == before  # a seal record never moves backwards


async def test_unknown_collection_and_foreign_vchannel_are_refused(cluster: Cluster) -> None:
    orders = await CollectionStore(cluster.metastore, cluster.keys).create(
        CollectionSpec("orders", SCHEMA, "pk", shards=1)
    )
    ghost = Message(MessageType.INSERT, "ghost-0", encode_rows(rows([1])), {COLLECTION: "ghost"})
    stray = Message(MessageType.INSERT, "other-0", encode_rows(rows([1])), {COLLECTION: "orders"})
    unknown, foreign, ok = await send(cluster, [ghost, stray, insert(orders, 0, [2])])
    assert isinstance(unknown, errors.NotFound) and "ghost" in unknown.message
    assert (
        isinstance(foreign, errors.InvalidArgument) and "not one of its shards" in foreign.message
    )
    assert [e.id for e in await the_log(cluster)] == [acked(ok).id]


async def test_a_malformed_checkpoint_record_is_unavailable_not_a_damaged_log(
    cluster: Cluster,
) -> None:
    hooks = NodeCollections(cluster.metastore, cluster.keys, "node-a")
    assert await hooks.checkpoint(P) is None
    for junk in (b"{not json", CheckpointRecord(pchannel=P, position="nowhere").to_json()):
        await cluster.metastore.put(cluster.keys.checkpoint(P), junk)
        with pytest.raises(errors.Unavailable, match=r"checkpoint record .* is malformed"):
            await hooks.checkpoint(P)

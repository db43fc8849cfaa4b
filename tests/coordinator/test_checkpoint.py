"""Lease-owned writers: segment meta before checkpoint, fenced by the record."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.cluster import Assignment, Keys, NodeInfo
from headrace.coordinator import state
from headrace.coordinator.checkpoint import (
    CheckpointWriter,
    ReplayFilter,
    load_recovery,
)
from headrace.message.ids import MessageID
from headrace.metastore.contract import Compare, Metastore, Put
from headrace.metastore.sqlite import SqliteMetastore
from headrace.table.records import SegmentRecord
from headrace.wal.contract import StartPosition
from headrace.wal.memory import MemoryBackend, MemoryMessageID

pytestmark = pytest.mark.timeout(30)
CLUSTER = "ckpt"
KEYS = Keys(CLUSTER)
P = "pch-00"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Metastore]:
    metastore = await SqliteMetastore.open(str(tmp_path / "meta.db"))
    yield metastore
    await metastore.close()


async def transition(store: Metastore, following: Assignment) -> None:
    """Write the next record as the coordinator or node would (CAS)."""
    key = KEYS.pchannel(P)
    kv = await store.get(key)
    previous = None if kv is None else Assignment.model_validate_json(kv.value)
    state.check_transition(previous, following)
    revision = 0 if kv is None else kv.mod_revision
    result = await store.txn(
        [Compare.mod_revision_is(key, revision)], [Put(key, following.to_json())]
    )
    assert result.succeeded


async def current(store: Metastore) -> Assignment:
    kv = await store.get(KEYS.pchannel(P))
    assert kv is not None
    return Assignment.model_validate_json(kv.value)


def node(name: str) -> NodeInfo:
    return NodeInfo(node_id=name, address="127.0.0.1:1")


async def own(store: Metastore, name: str) -> Assignment:
    """Fail over / assign P to ``name`` and let it acknowledge."""
    kv = await store.get(KEYS.pchannel(P))
    previous = None if kv is None else Assignment.model_validate_json(kv.value)
    assigning = state.assign(P, previous, node(name), 0.0)
    await transition(store, assigning)
    served = state.acknowledge(assigning, 0.0)
    await transition(store, served)
    return served


async def test_crash_between_segment_meta_and_checkpoint_loses_and_duplicates_nothing(
    store: Metastore,
) -> None:
    wal = MemoryBackend()
    first = await own(store, "node-a")
    wal_a = await wal.open_writer(P, first.term)
    # Twelve messages alternating between two vchannels.
    data = [f"v{1 + i % 2}:{i}".encode() for i in range(12)]
    ids = await wal_a.append(data)
    owner_a = CheckpointWriter(store, CLUSTER, P, "node-a", first.term)

    # Flush 1, completed: segments of both vchannels, then the checkpoint.
    await owner_a.write_segment_meta(1, SegmentRecord.covering("v1", ids[0], ids[2], rows=2))
    await owner_a.write_segment_meta(2, SegmentRecord.covering("v2", ids[1], ids[3], rows=2))
    await owner_a.write_checkpoint(ids[3], timetick=100)
    # Flush 2: the v1 segment meta is written, then node-a "crashes" before
    # the v2 segment and before moving the checkpoint.
    await owner_a.write_segment_meta(3, SegmentRecord.covering("v1", ids[4], ids[8], rows=3))

    # Crash failover: node-b takes over under a higher term.
    second = await own(store, "node-b")
    assert second.term == first.term + 1
    wal_b = await wal.open_writer(P, second.term)
    with pytest.raises(errors.Fenced):
        await wal_a.append([b"v1:late"])
    with pytest.raises(errors.Fenced):
        await owner_a.write_checkpoint(ids[9])
    with pytest.raises(errors.Fenced):
        await owner_a.write_segment_meta(4, SegmentRecord.covering("v2", ids[5], ids[9]))
    assert owner_a.fenced

    # node-b recovers: replays from the old checkpoint, skipping what segments hold.
    recovery = await load_recovery(store, CLUSTER, P)
    assert recovery.checkpoint is not None
    assert recovery.checkpoint.position_id() == ids[3]
    assert (recovery.checkpoint.node, recovery.checkpoint.term) == ("node-a", first.term)
    assert [s.segment_id for s in recovery.segments] == [1, 2, 3]
    replay = recovery.replay_filter()
    reader = await wal.open_reader(P, StartPosition.after(recovery.checkpoint.position_id()))
    replayed = await reader.next_batch(100, timeout=1.0)
    await reader.close()
    kept: list[MessageID] = []
    for record in replayed:
        vchannel = record.data.decode().split(":")[0]
        if not replay.is_duplicate(vchannel, record.id):
            kept.append(record.id)
    assert kept == [ids[5], ids[7], ids[9], ids[10], ids[11]]
    # Every message after the checkpoint is in exactly one place.
    in_segments = [ids[4], ids[6], ids[8]]
    assert sorted(kept + in_segments) == ids[4:]

    owner_b = CheckpointWriter(store, CLUSTER, P, "node-b", second.term)
    await owner_b.write_segment_meta(4, SegmentRecord.covering("v2", ids[5], ids[11], rows=4))
    await owner_b.write_segment_meta(5, SegmentRecord.covering("v1", ids[10], ids[10], rows=1))
    await owner_b.write_checkpoint(ids[11], timetick=200)
    final = await load_recovery(store, CLUSTER, P)
    assert final.checkpoint is not None and final.checkpoint.term == second.term
    assert final.checkpoint.position_id() == ids[11]
    await wal_b.close()


async def test_owner_writes_through_its_transitions_and_is_fenced_after(
    store: Metastore,
) -> None:
    kv_missing = CheckpointWriter(store, CLUSTER, P, "node-a", 1)
    with pytest.raises(errors.Fenced):
        await kv_missing.write_checkpoint(MemoryMessageID(1))
    assigning = state.assign(P, None, node("node-a"), 0.0)
    await transition(store, assigning)
    writer = CheckpointWriter(store, CLUSTER, P, "node-a", assigning.term)
    await writer.write_checkpoint(MemoryMessageID(1))  # while opening (recovery)
    served = state.acknowledge(assigning, 0.0)
    await transition(store, served)
    await writer.write_checkpoint(MemoryMessageID(2))
    draining = state.start_move(served, "node-b", 0.0)
    await transition(store, draining)
    await writer.write_checkpoint(MemoryMessageID(3))  # final flush while draining
    await transition(store, state.acknowledge(draining, 0.0))
    with pytest.raises(errors.Fenced) as caught:
        await writer.write_checkpoint(MemoryMessageID(4))
    assert caught.value.term == assigning.term and caught.value.retryable
    recovery = await load_recovery(store, CLUSTER, P)
    assert recovery.checkpoint is not None
    assert recovery.checkpoint.position_id() == MemoryMessageID(3)
    # A writer naming the wrong node or an older term never writes.
    await own(store, "node-b")
    for wrong in (
        CheckpointWriter(store, CLUSTER, P, "node-a", 2),
        CheckpointWriter(store, CLUSTER, P, "node-b", 1),
    ):
        with pytest.raises(errors.Fenced):
            await wrong.write_segment_meta(
                9, SegmentRecord.covering("v", MemoryMessageID(5), MemoryMessageID(6))
            )
    assert (await load_recovery(store, CLUSTER, P)).segments == ()
    assert (await current(store)).node == "node-b"


async def test_checkpoint_never_moves_back_and_bad_input_is_refused(store: Metastore) -> None:
    served = await own(store, "node-a")
    writer = CheckpointWriter(store, CLUSTER, P, "node-a", served.term)
    await writer.write_checkpoint(MemoryMessageID(10))
    await writer.write_checkpoint(MemoryMessageID(10))
    with pytest.raises(errors.InvalidArgument, match="move back"):
        await writer.write_checkpoint(MemoryMessageID(9))
    with pytest.raises(errors.InvalidArgument):
        SegmentRecord.covering("v", MemoryMessageID(5), MemoryMessageID(4))
    other = SegmentRecord.covering("v", MemoryMessageID(1), MemoryMessageID(2), pchannel="pch-77")
    with pytest.raises(errors.InvalidArgument):
        await writer.write_segment_meta(1, other)
    with pytest.raises(errors.InvalidArgument):
        CheckpointWriter(store, CLUSTER, P, "node-a", 0)
    assert not writer.fenced


def test_replay_filter_uses_the_highest_end_per_vchannel() -> None:
    segments = [
        SegmentRecord.covering("v1", MemoryMessageID(0), MemoryMessageID(4)),
        SegmentRecord.covering("v1", MemoryMessageID(5), MemoryMessageID(9)),
        SegmentRecord.covering("v2", MemoryMessageID(0), MemoryMessageID(2)),
    ]
    replay = ReplayFilter(segments)
    assert replay.flushed_up_to("v1") == MemoryMessageID(9)
    assert replay.is_duplicate("v1", MemoryMessageID(9))
    assert not replay.is_duplicate("v1", MemoryMessageID(10))
    assert replay.is_duplicate("v2", MemoryMessageID(2))
    assert not replay.is_duplicate("v2", MemoryMessageID(3))
    assert not replay.is_duplicate("v3", MemoryMessageID(0))

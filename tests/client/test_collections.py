"""Collections through the client: create/describe/list/drop, routed inserts and
deletes, flush requests and the wait for checkpoints, against in-process nodes.

The node does not stamp segments yet, so these tests read the raw messages the
client wrote and check their properties and payloads.
"""

from __future__ import annotations

import asyncio
import collections
import subprocess
import sys
import zlib

import pyarrow as pa
import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.flushing import (
    Behind,
    FlushProgress,
    WaitOptions,
    caught_up,
    merge_targets,
    progress,
    timeout_message,
    wait_flushed,
)
from headrace.client.routing import fitted, shards_of, split_by_shard, split_keys_by_shard
from headrace.client.sync import SyncClient
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.table import messages
from headrace.table.collections import Collection, CollectionSpec, Dropped
from headrace.table.payloads import decode
from headrace.table.records import CheckpointRecord
from headrace.wal.api import AppendResult
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.memory.message_id import MemoryMessageID
from tests.client.conftest import PCHANNELS
from tests.node.harness import HANG_GUARD, Cluster

SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
        pa.field("name", pa.string()),
    ]
)
DATA_TYPES = [MessageType.INSERT, MessageType.DELETE, MessageType.FLUSH]
DDL_TYPES = [MessageType.CREATE_COLLECTION, MessageType.DROP_COLLECTION]


def rows(keys: range | list[int], name_size: int = 4) -> pa.Table:
    keys = list(keys)
    return pa.table(
        {
            "pk": pa.array(keys, pa.int64()),
            "vector": pa.array([[float(k)] * 4 for k in keys], pa.list_(pa.float32())),
            "name": pa.array([f"{k:0{name_size}d}" for k in keys]),
        },
        schema=SCHEMA,
    )


async def read_all(
    client: HeadraceClient, vchannel: str, types: list[MessageType], idle: float = 0.5
) -> list[Message]:
    """Every message of ``vchannel`` of ``types`` until none comes for ``idle`` seconds."""
    out = []
    async with client.consume(vchannel, types=types) as consumer:
        while (entry := await consumer.next(idle)) is not None:
            out.append(entry.message)
    return out


# -- routing (pure) --------------------------------------------------------------


def fmix64(key: int) -> int:
    """MurmurHash3's fmix64, written out in Python as the reference."""
    mask = (1 << 64) - 1
    k = key & mask
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & mask
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & mask
    return k ^ (k >> 33)


def test_int64_keys_route_by_murmur3_fmix64() -> None:
    keys = [0, 1, 2, 7, -1, -(2**63), 2**63 - 1, 123456789012345]
    for shards in (1, 2, 3, 4, 16, 256):
        got = shards_of(pa.array(keys, pa.int64()), shards).to_pylist()
        assert got == [fmix64(k) % shards for k in keys]
    # Pinned: moving keys between shards would break every existing collection.
    assert shards_of(pa.array([1, 2, 3, -1], pa.int64()), 4).to_pylist() == [
        fmix64(1) % 4,
        fmix64(2) % 4,
        fmix64(3) % 4,
        fmix64(-1) % 4,
    ]
    assert fmix64(1) == 0xB456BCFC34C2CB2C


def test_string_keys_route_by_crc32_and_the_same_in_a_new_process() -> None:
    keys = ["", "a", "order-17", "ü✓"]
    got = shards_of(pa.array(keys), 8).to_pylist()
    assert got == [zlib.crc32(k.encode()) % 8 for k in keys]
    # Python's hash() of a str changes per process; the route must not.
    code = (
        "import pyarrow as pa; from headrace.client.routing import shards_of; "
        f"print(shards_of(pa.array({keys!r}), 8).to_pylist())"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(got)


def test_routing_spreads_keys_evenly_and_refuses_nulls_and_other_types() -> None:
    for keys in (pa.array(range(40_000), pa.int64()), pa.array([f"k{i}" for i in range(40_000)])):
        counts = collections.Counter(shards_of(keys, 4).to_pylist())
        assert set(counts) == {0, 1, 2, 3}
        assert all(9_000 < n < 11_000 for n in counts.values()), counts
    with pytest.raises(errors.InvalidArgument, match="null"):
        shards_of(pa.array([1, None], pa.int64()), 4)
    with pytest.raises(errors.InvalidArgument, match="int64 or string"):
        shards_of(pa.array([1.5]), 4)


def test_inserts_and_deletes_of_a_key_take_the_same_shard_in_input_order() -> None:
    table = rows([5, 3, 9, 3, 100, -7, 42, 5])
    by_rows = split_by_shard(table, "pk", 3)
    by_keys = split_keys_by_shard(table.column("pk").combine_chunks(), 3)
    assert {s: t.column("pk").to_pylist() for s, t in by_rows.items()} == {
        s: a.to_pylist() for s, a in by_keys.items()
    }
    for shard, part in by_rows.items():
        keys = part.column("pk").to_pylist()
        assert keys == [k for k in table.column("pk").to_pylist() if fmix64(k) % 3 == shard]
        assert part.column("name").to_pylist() == [f"{k:04d}" for k in keys]


def test_fitted_cuts_rows_into_payloads_under_the_limit_in_order() -> None:
    orders = Collection(CollectionSpec("orders", SCHEMA, shards=1), collection_id=1)
    table = rows(range(3000), name_size=200)

    def build(part: pa.Table) -> Message:
        return messages.insert_request(orders, "orders-0", part)

    limit = 64 * 1024
    cut = list(fitted(table, limit, build))
    assert len(cut) > table.nbytes // limit
    assert all(len(m.payload) <= limit for m in cut)
    got = pa.concat_tables(decode(m.payload, "insert") for m in cut)
    assert got.equals(table)
    # One row larger than the limit goes alone, to be refused by the node.
    huge = rows([1, 2], name_size=100_000)
    alone = list(fitted(huge, 1000, build))
    assert [decode(m.payload, "insert").num_rows for m in alone] == [1, 1]


# -- waiting for a flush (pure) ----------------------------------------------------


def checkpoint(pchannel: str, position: str) -> CheckpointRecord:
    return CheckpointRecord(pchannel=pchannel, position=position)


def test_a_pchannel_is_caught_up_once_its_checkpoint_reaches_the_request() -> None:
    target = LocalMessageID(42)
    assert not caught_up(None, target)
    assert not caught_up(checkpoint("p", "local:41"), target)
    assert caught_up(checkpoint("p", "local:42"), target)
    assert caught_up(checkpoint("p", "local:900"), target)
    with pytest.raises(errors.CorruptData, match="another backend"):
        caught_up(checkpoint("p", "memory:99"), target)


def test_progress_names_each_pchannel_behind_and_why() -> None:
    targets = {"p-1": LocalMessageID(10), "p-0": LocalMessageID(5), "p-2": LocalMessageID(7)}
    state = progress(
        targets, {"p-0": checkpoint("p-0", "local:5"), "p-2": checkpoint("p-2", "local:3")}
    )
    assert not state.done
    assert [b.pchannel for b in state.behind] == ["p-1", "p-2"]
    assert state.reason() == (
        "p-1 checkpoint no checkpoint yet, needs local:10; p-2 checkpoint at local:3, needs local:7"
    )
    message = timeout_message("orders", 2.5, state)
    assert "flush of orders not committed within 2.5s (deadline exceeded)" in message
    assert "p-1" in message and "p-2 checkpoint at local:3" in message and "p-0" not in message
    assert progress(targets, {p: checkpoint(p, "local:10") for p in targets}) == FlushProgress(())
    assert Behind("p", LocalMessageID(1), None).describe() == (
        "p checkpoint no checkpoint yet, needs local:1"
    )


def test_merged_targets_keep_the_latest_request_of_each_pchannel() -> None:
    """Flushes of several collections sharing pchannels: a checkpoint at the
    merged target covers every one of them."""
    first = {"p-0": LocalMessageID(9), "p-1": LocalMessageID(4)}
    second = {"p-1": LocalMessageID(12), "p-2": LocalMessageID(3)}
    third = {"p-0": LocalMessageID(2)}
    merged = merge_targets([first, second, third])
    assert merged == {"p-0": LocalMessageID(9), "p-1": LocalMessageID(12), "p-2": LocalMessageID(3)}
    assert merge_targets([]) == {}
    covered = {p: checkpoint(p, str(t)) for p, t in merged.items()}
    for targets in (first, second, third):
        assert progress(targets, covered).done


# -- through a node ------------------------------------------------------------------


async def test_create_describe_list_are_idempotent_and_announce_each_shard(
    served: Cluster, client: HeadraceClient
) -> None:
    created = await client.create_collection("orders", SCHEMA, "pk", shards=4)
    again = await client.create_collection("orders", SCHEMA, primary_key="pk", shards=4)
    assert again == created
    assert created.vchannels == ("orders-0", "orders-1", "orders-2", "orders-3")
    assert await client.describe_collection("orders") == created
    await client.create_collection("users", SCHEMA, shards=1)
    assert [c.name for c in await client.list_collections()] == ["orders", "users"]
    with pytest.raises(errors.Conflict, match="shards 2 vs 4"):
        await client.create_collection("orders", SCHEMA, shards=2)
    with pytest.raises(errors.NotFound, match="no collection 'nope'"):
        await client.describe_collection("nope")
    with pytest.raises(errors.InvalidArgument, match="primary key"):
        await client.create_collection("bad", SCHEMA, primary_key="vector")
    with pytest.raises(errors.InvalidArgument, match="pyarrow Schema"):
        await client.create_collection("bad", {"pk": "int64"}, shards=1)  # type: ignore[arg-type]
    for vchannel in created.vchannels:
        ddl = await read_all(client, vchannel, DDL_TYPES)
        # Two calls, two announcements of the same id (a no-op for readers).
        assert [m.type for m in ddl] == [MessageType.CREATE_COLLECTION] * 2
        assert {m.properties[messages.COLLECTION_ID] for m in ddl} == {str(created.collection_id)}
        assert {m.properties[messages.COLLECTION] for m in ddl} == {"orders"}


async def test_inserts_and_deletes_are_routed_by_key_and_stamped_by_the_node(
    served: Cluster, client: HeadraceClient
) -> None:
    orders = await client.create_collection("orders", SCHEMA, shards=4)
    table = rows(range(2000))
    async with client.producer() as producer:
        inserted = await producer.insert("orders", table)
        # A RecordBatch, fields in another order, works too.
        batch = rows([5000, 5001]).select(["name", "vector", "pk"]).to_batches()[0]
        await producer.insert(orders, batch)
        deleted = await producer.delete("orders", [3, 17, 5000, 1999])
    assert inserted.rows == 2000 and len(inserted.results) == 4
    assert deleted.rows == 4
    seen: dict[int, str] = {}
    deletes: dict[int, str] = {}
    for shard, vchannel in enumerate(orders.vchannels):
        got = await read_all(client, vchannel, DATA_TYPES)
        for message in got:
            assert message.properties[messages.COLLECTION] == "orders"
            # The client sends no segment; the node stamps the inserts' segments.
            assert (messages.SEGMENT in message.properties) == (message.type is MessageType.INSERT)
            keys = decode(message.payload, message.type.name).column("pk").to_pylist()
            assert all(fmix64(k) % 4 == shard for k in keys)
            target = seen if message.type is MessageType.INSERT else deletes
            for key in keys:
                assert key not in target
                target[key] = vchannel
        inserts = [m for m in got if m.type is MessageType.INSERT]
        assert inserts and decode(inserts[0].payload, "insert").schema == SCHEMA
    assert sorted(seen) == [*range(2000), 5000, 5001]
    # Each shard got a quarter, roughly.
    assert all(400 < n < 600 for n in collections.Counter(seen.values()).values())
    assert deletes == {k: seen[k] for k in (3, 17, 5000, 1999)}


async def test_a_batch_that_does_not_fit_the_schema_is_refused_and_nothing_is_sent(
    served: Cluster, client: HeadraceClient
) -> None:
    orders = await client.create_collection("orders", SCHEMA, shards=2)
    wrong_type = rows(range(10)).set_column(2, "name", pa.array(range(10), pa.int64()))
    null_key = rows(range(3)).set_column(0, "pk", pa.array([1, None, 2], pa.int64()))
    extra = rows(range(3)).append_column("price", pa.array([1.0, 2.0, 3.0]))
    async with client.producer() as producer:
        with pytest.raises(errors.InvalidArgument, match="field 'name' has type int64"):
            await producer.insert("orders", wrong_type)
        with pytest.raises(errors.InvalidArgument, match="primary key field 'pk' holds 1 null"):
            await producer.insert("orders", null_key)
        with pytest.raises(errors.InvalidArgument, match="unexpected field 'price'"):
            await producer.insert("orders", extra)
        with pytest.raises(errors.InvalidArgument, match="not int64"):
            await producer.delete("orders", ["a", "b"])
        with pytest.raises(errors.InvalidArgument, match="pyarrow Table or RecordBatch"):
            await producer.insert("orders", [{"pk": 1}])  # type: ignore[arg-type]
        with pytest.raises(errors.NotFound, match="no collection 'other'"):
            await producer.insert("other", rows(range(3)))
        await producer.insert("orders", rows([7]))
        nothing = await producer.insert("orders", rows([]))
        no_keys = await producer.delete("orders", [])
    assert (nothing.rows, nothing.results, no_keys.rows, no_keys.results) == (0, (), 0, ())
    for vchannel in orders.vchannels:
        got = await read_all(client, vchannel, DATA_TYPES)
        assert [decode(m.payload, "insert").column("pk").to_pylist() for m in got] == (
            [[7]] if vchannel == ok_vchannel(orders, 7) else []
        )


def ok_vchannel(collection: Collection, key: int) -> str:
    return collection.vchannels[fmix64(key) % collection.spec.shards]


async def test_a_large_insert_is_cut_into_messages_under_max_rows_bytes(
    served: Cluster, client: HeadraceClient
) -> None:
    orders = await client.create_collection("orders", SCHEMA, shards=2)
    table = rows(range(4000), name_size=100)
    options = ProducerOptions(max_rows_bytes=32 * 1024)
    async with client.producer(options) as producer:
        result = await producer.insert("orders", table)
        removed = await producer.delete("orders", list(range(0, 4000, 2)))
    assert len(result.results) > table.nbytes // (32 * 1024)
    assert removed.rows == 2000
    got_rows = []
    got_keys = []
    for vchannel in orders.vchannels:
        for message in await read_all(client, vchannel, DATA_TYPES):
            assert len(message.payload) <= 32 * 1024
            part = decode(message.payload, message.type.name)
            (got_rows if message.type is MessageType.INSERT else got_keys).append(part)
    assert pa.concat_tables(got_rows).sort_by("pk").equals(table)
    assert sorted(pa.concat_tables(got_keys).column("pk").to_pylist()) == list(range(0, 4000, 2))


async def test_flush_requests_reach_every_shard_and_wait_for_the_checkpoints(
    served: Cluster, client: HeadraceClient
) -> None:
    # 8 shards over the two pchannels (four each).
    orders = await client.create_collection("orders", SCHEMA, shards=8)
    outcome = await client.flush("orders", wait=False)
    pchannels = {client.route(v) for v in orders.vchannels}
    assert pchannels == set(PCHANNELS)
    assert set(outcome.targets) == pchannels
    assert not outcome.waited and outcome.checkpoints == {}
    last: dict[str, MessageID] = {}
    for vchannel in orders.vchannels:
        async with client.consume(vchannel, types=[MessageType.FLUSH]) as consumer:
            entry = await consumer.next(HANG_GUARD)
            assert entry is not None and await consumer.next(0.3) is None
        # The node replaced the request by a seal (here of an empty segment:
        # nothing was growing), which fixes the request's position in the log.
        assert messages.SEGMENT in entry.message.properties
        assert entry.message.properties[messages.COLLECTION] == "orders"
        pchannel = client.route(vchannel)
        last[pchannel] = max(last.get(pchannel, entry.id), entry.id)
    # Each pchannel waits for its last request.
    assert outcome.targets == last

    # No flush runner: the wait runs out of time naming each pchannel behind.
    with pytest.raises(errors.Unavailable) as caught:
        await client.flush("orders", wait=True, timeout=0.3)
    assert caught.value.retryable
    assert "flush of orders not committed within 0.3s" in caught.value.message
    for pchannel in pchannels:
        assert f"{pchannel} checkpoint no checkpoint yet" in caught.value.message

    # A checkpoint short of the request still waits; one at it ends the wait.
    keys = served.keys
    targets = outcome.targets
    behind, ahead = sorted(pchannels)[0], sorted(pchannels)[1:]
    assert isinstance(targets[behind], MemoryMessageID)
    for pchannel in ahead:
        await served.metastore.put(
            keys.checkpoint(pchannel), checkpoint(pchannel, str(targets[pchannel])).to_json()
        )
    await served.metastore.put(keys.checkpoint(behind), checkpoint(behind, "memory:0").to_json())
    with pytest.raises(errors.Unavailable, match=f"{behind} checkpoint at memory:0") as caught:
        await wait_flushed(served.metastore, keys, "orders", targets, WaitOptions(timeout=0.3))
    assert all(p not in caught.value.message for p in ahead)
    waiting = asyncio.create_task(
        wait_flushed(served.metastore, keys, "orders", targets, WaitOptions(timeout=20.0))
    )
    await asyncio.sleep(0.3)
    assert not waiting.done()
    await served.metastore.put(
        keys.checkpoint(behind), checkpoint(behind, str(targets[behind])).to_json()
    )
    done = await waiting
    assert {p: c.position for p, c in done.items()} == {p: str(t) for p, t in targets.items()}


async def test_drop_announces_each_shard_marks_the_record_and_keeps_the_name(
    served: Cluster, client: HeadraceClient
) -> None:
    orders = await client.create_collection("orders", SCHEMA, shards=2)
    async with client.producer() as producer:
        await producer.insert("orders", rows(range(10)))
        dropped = await client.drop_collection("orders")
        assert dropped.dropped is not None and dropped.dropped.timetick > 0
        assert dropped.collection_id == orders.collection_id
        assert await client.drop_collection("orders") == dropped  # idempotent
        with pytest.raises(errors.NotFound, match="no collection 'other'"):
            await client.drop_collection("other")
        # A producer that had not looked the collection up yet refuses it.
        async with client.producer() as fresh:
            with pytest.raises(errors.NotFound, match="orders was dropped"):
                await fresh.insert("orders", rows(range(3)))
    for vchannel in orders.vchannels:
        ddl = await read_all(client, vchannel, DDL_TYPES)
        assert [m.type for m in ddl] == [
            MessageType.CREATE_COLLECTION,
            MessageType.DROP_COLLECTION,
        ]
        assert ddl[1].properties[messages.COLLECTION_ID] == str(orders.collection_id)
    assert (await client.describe_collection("orders")).dropped == dropped.dropped
    assert await client.list_collections() == []
    assert await client.list_collections(include_dropped=True) == [dropped]
    refused = r"orders was dropped \(at .*\); the name of a dropped collection is not reused"
    with pytest.raises(errors.Conflict, match=refused):
        await client.create_collection("orders", SCHEMA, shards=2)
    with pytest.raises(errors.NotFound, match="orders was dropped"):
        await client.flush("orders")


async def test_the_sync_client_mirrors_the_collection_methods(served: Cluster) -> None:
    def work() -> tuple[Collection, list[str], int, int, list[str], bool]:
        with SyncClient(served.url, "test") as client:
            created = client.create_collection("orders", SCHEMA, shards=2)
            names = [c.name for c in client.list_collections()]
            inserted = client.insert("orders", rows(range(100)))
            deleted = client.delete("orders", [1, 2])
            flushed = client.flush("orders", wait=False)
            dropped = client.drop_collection("orders")
            assert client.describe_collection("orders") == dropped
            return (
                created,
                names,
                inserted.rows,
                deleted.rows,
                sorted(flushed.targets),
                bool(dropped.dropped),
            )

    created, names, inserted, deleted, flushed, dropped = await asyncio.to_thread(work)
    assert created.vchannels == ("orders-0", "orders-1")
    assert names == ["orders"]
    assert (inserted, deleted) == (100, 2)
    assert flushed and dropped


def test_the_client_imports_no_pyiceberg() -> None:
    code = (
        "import sys, headrace.client, headrace.client.sync, headrace.table.collections; "
        "import headrace.table.messages, headrace.table.records; "
        "print(sorted(m for m in sys.modules if m.startswith('pyiceberg')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


async def test_a_not_found_answer_makes_the_producer_read_the_collection_again(
    served: Cluster, client: HeadraceClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    await client.create_collection("orders", SCHEMA, shards=2)
    async with client.producer() as producer:
        await producer.insert("orders", rows(range(4)))  # looked up and cached
        # Dropped behind the producer's back: the cached record still says live,
        # until a node answers NOT_FOUND (the node's collection check, once built).
        await client.collections.drop("orders", Dropped(at=1.0))
        real_send_many = producer.send_many

        async def refused(batch: list[Message]) -> list[AppendResult | errors.HeadraceError]:
            return [errors.NotFound("no collection orders at the node") for _ in batch]

        monkeypatch.setattr(producer, "send_many", refused)
        with pytest.raises(errors.NotFound, match="at the node"):
            await producer.insert("orders", rows(range(4)))
        monkeypatch.setattr(producer, "send_many", real_send_many)
        with pytest.raises(errors.NotFound, match="orders was dropped"):
            await producer.insert("orders", rows(range(4)))

"""The dropped mark of a collection record, and the client's message builders."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest

from headrace import errors
from headrace.cluster import Keys
from headrace.message.types import MessageType
from headrace.metastore.factory import open_metastore
from headrace.table import messages
from headrace.table.collections import (
    Collection,
    CollectionRecord,
    CollectionSpec,
    CollectionStore,
    Dropped,
)
from headrace.table.payloads import decode, key_array
from headrace.table.pins import (
    PinBasis,
    pin_epoch_key,
    pin_epochs_prefix,
    pin_ops,
    reader_pins_of,
    reader_pins_ops,
)
from headrace.table.records import collection_key, table_key

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
ORDERS = Collection(CollectionSpec("orders", SCHEMA, shards=2), collection_id=3)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CollectionStore]:
    metastore = await open_metastore(f"sqlite://{tmp_path}/meta.db")
    try:
        yield CollectionStore(metastore, Keys("drops"))
    finally:
        await metastore.close()


async def test_drop_marks_the_record_once_and_the_name_is_not_reused(
    store: CollectionStore,
) -> None:
    spec = CollectionSpec("orders", SCHEMA, shards=2)
    created = await store.create(spec)
    dropped = await store.drop("orders", Dropped(at=1_700_000_000.0, timetick=99))
    assert dropped == Collection(spec, created.collection_id, Dropped(1_700_000_000.0, 99))
    assert await store.get("orders") == dropped
    # Idempotent: a second drop keeps the first one's time.
    assert await store.drop("orders", Dropped(at=1_800_000_000.0, timetick=5)) == dropped
    with pytest.raises(errors.Conflict) as refused:
        await store.create(spec)
    assert refused.value.message.startswith(
        "collection orders was dropped (at 2023-11-14T22:13:20Z); the name of a dropped "
        "collection is not reused"
    )
    with pytest.raises(errors.NotFound, match="no collection 'users'"):
        await store.drop("users", Dropped(at=1.0))
    assert await store.list() == [dropped]
    assert dropped.describe()["dropped"] is True
    assert dropped.describe()["dropped_timetick"] == 99


async def test_the_drop_deletes_the_pin_epoch_and_no_pin_writes_it_again(
    metastore_url: str,
) -> None:
    """On SQLite and etcd: a pinned collection's epoch (the one pin key
    without a lease) goes with the drop, in its transaction; a read that
    planned before the drop cannot pin after it (that would write the epoch
    again), and an expiry that read the pins before the drop does not
    commit on them. The name is not reused, so no new collection can meet
    an old epoch."""
    keys = Keys(f"d{uuid.uuid4().hex[:10]}")
    async with await open_metastore(metastore_url) as metastore:
        store = CollectionStore(metastore, keys)
        spec = CollectionSpec("orders", SCHEMA, shards=2)
        await store.create(spec)
        await store.create(CollectionSpec("users", SCHEMA))
        record = await metastore.get(collection_key(keys, "orders"))
        assert record is not None
        basis = PinBasis(table_revision=0, collection_revision=record.mod_revision)
        for name in ("orders", "users"):
            lease = await metastore.grant_lease(60)
            planned_on = await metastore.get(collection_key(keys, name))
            assert planned_on is not None
            own = PinBasis(0, planned_on.mod_revision)
            assert (await metastore.txn(*pin_ops(keys, name, 7, lease, own))).succeeded
        assert await metastore.get(pin_epoch_key(keys, "orders")) is not None
        found = (await metastore.txn([], reader_pins_ops(keys, "orders"))).gets
        seen_by_expiry = reader_pins_of(keys, "orders", found)
        assert seen_by_expiry.epoch_revision > 0

        await store.drop("orders", Dropped(at=1_700_000_000.0, timetick=99))

        epochs = await metastore.get_prefix(pin_epochs_prefix(keys))
        assert [kv.key for kv in epochs] == [pin_epoch_key(keys, "users")]
        late = await metastore.grant_lease(60)
        pinned_late = await metastore.txn(*pin_ops(keys, "orders", 7, late, basis))
        assert not pinned_late.succeeded
        assert await metastore.get(pin_epoch_key(keys, "orders")) is None
        assert not (await metastore.txn([seen_by_expiry.unchanged()], [])).succeeded
        # A drop of a dropped collection changes nothing (and writes no epoch).
        await store.drop("orders", Dropped(at=1_800_000_000.0))
        assert await metastore.get(pin_epoch_key(keys, "orders")) is None
        with pytest.raises(errors.Conflict, match="is not reused"):
            await store.create(spec)
        assert await metastore.get(table_key(keys, "orders")) is None


async def test_a_drop_of_a_collection_never_pinned_has_no_epoch_to_delete(
    metastore_url: str,
) -> None:
    keys = Keys(f"d{uuid.uuid4().hex[:10]}")
    async with await open_metastore(metastore_url) as metastore:
        store = CollectionStore(metastore, keys)
        await store.create(CollectionSpec("orders", SCHEMA))
        dropped = await store.drop("orders", Dropped(at=1.0))
        assert dropped.dropped == Dropped(at=1.0)
        assert await metastore.get_prefix(pin_epochs_prefix(keys)) == []


async def test_a_record_written_before_the_dropped_mark_still_decodes(
    store: CollectionStore,
) -> None:
    record = json.loads(ORDERS.to_record().to_json())
    for field in ("dropped", "dropped_at", "dropped_timetick"):
        del record[field]
    await store.metastore.put(collection_key(store.keys, "orders"), json.dumps(record).encode())
    got = await store.get("orders")
    assert got == ORDERS and got.dropped is None
    assert CollectionRecord.from_json(got.to_record().to_json()).collection() == ORDERS


def test_client_messages_carry_the_collection_and_no_segment() -> None:
    rows = pa.table({"name": ["a", "b"], "pk": pa.array([1, 2], pa.int64())})
    insert = messages.insert_request(ORDERS, "orders-1", rows)
    assert insert.type is MessageType.INSERT
    assert dict(insert.properties) == {messages.COLLECTION: "orders"}
    assert decode(insert.payload, "insert").schema == SCHEMA  # the collection's field order
    # Unstamped, it cannot be flushed: the flush job refuses it rather than guess.
    with pytest.raises(errors.CorruptData, match="segment"):
        messages.parse(insert, {"orders": ORDERS})
    with pytest.raises(errors.InvalidArgument, match="not a shard of orders"):
        messages.insert_request(ORDERS, "orders-2", rows)
    with pytest.raises(errors.InvalidArgument, match="missing field 'pk'"):
        messages.insert_request(ORDERS, "orders-0", rows.select(["name"]))

    create = messages.create_collection(ORDERS, "orders-0")
    drop = messages.drop_collection(ORDERS, "orders-0")
    assert create.type is MessageType.CREATE_COLLECTION
    assert drop.type is MessageType.DROP_COLLECTION
    for ddl in (create, drop):
        assert dict(ddl.properties) == {
            messages.COLLECTION: "orders",
            messages.COLLECTION_ID: "3",
        }
        assert messages.parse(ddl, {"orders": ORDERS}) is None  # not collection data
    assert CollectionRecord.from_json(create.payload).collection() == ORDERS


def test_key_array_accepts_lists_and_chunked_arrays_and_names_the_key() -> None:
    assert key_array(ORDERS, [1, 2]).to_pylist() == [1, 2]
    chunked = pa.chunked_array([pa.array([1], pa.int64()), pa.array([2], pa.int64())])
    assert key_array(ORDERS, chunked).to_pylist() == [1, 2]
    with pytest.raises(errors.InvalidArgument, match="primary key field 'pk' holds 1 null"):
        key_array(ORDERS, [1, None])  # type: ignore[list-item]
    with pytest.raises(errors.InvalidArgument, match="primary key 'pk' has type int64"):
        key_array(ORDERS, pa.array(["x"]))

"""Collections in the metastore, Insert/Delete payloads and their schema checks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import hypothesis
import hypothesis.strategies as st
import pyarrow as pa
import pytest

from headrace import errors
from headrace.cluster import Keys
from headrace.message.types import Message, MessageType
from headrace.metastore.contract import Metastore, Put
from headrace.metastore.factory import open_metastore
from headrace.table import messages
from headrace.table.collections import (
    Collection,
    CollectionSpec,
    CollectionStore,
)
from headrace.table.payloads import (
    check_keys,
    check_rows,
    conform,
    decode,
    encode_keys,
    encode_rows,
)
from headrace.table.records import collection_key

SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
        pa.field("name", pa.string()),
    ]
)
ORDERS = Collection(CollectionSpec("orders", SCHEMA, "pk", shards=2), collection_id=1)


def batch(**columns: pa.Array) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(list(columns.values()), names=list(columns))


def good_rows(n: int = 3) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays(
        [
            pa.array(range(n), pa.int64()),
            pa.array([[float(i)] * 4 for i in range(n)], pa.list_(pa.float32())),
            pa.array([f"n{i}" for i in range(n)]),
        ],
        schema=SCHEMA,
    )


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CollectionStore]:
    metastore = await open_metastore(f"sqlite://{tmp_path}/meta.db")
    try:
        yield CollectionStore(metastore, Keys("collections"))
    finally:
        await metastore.close()


# -- the collection record ------------------------------------------------------


async def test_create_is_idempotent_and_ids_are_distinct(store: CollectionStore) -> None:
    spec = CollectionSpec("orders", SCHEMA, "pk", shards=4)
    first = await store.create(spec)
    again = await store.create(CollectionSpec("orders", SCHEMA, "pk", shards=4))
    other = await store.create(CollectionSpec("users", SCHEMA, "pk"))
    assert again == first
    assert first.vchannels == ("orders-0", "orders-1", "orders-2", "orders-3")
    assert other.collection_id != first.collection_id
    got = await store.get("orders")
    assert got == first
    assert got.schema.equals(SCHEMA)
    assert sorted(c.name for c in await store.list()) == ["orders", "users"]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            {"schema": SCHEMA.append(pa.field("extra", pa.int32()))},
            "schema",
        ),
        (
            {"primary_key": "name", "schema": SCHEMA.set(2, pa.field("name", pa.string(), False))},
            "primary key",
        ),
        ({"shards": 3}, "shards 3 vs 2"),
    ],
)
async def test_another_definition_under_the_same_name_is_a_conflict(
    store: CollectionStore, change: dict[str, object], named: str
) -> None:
    await store.create(CollectionSpec("orders", SCHEMA, "pk", shards=2))
    fields: dict[str, object] = {
        "name": "orders",
        "schema": SCHEMA,
        "primary_key": "pk",
        "shards": 2,
        **change,
    }
    with pytest.raises(errors.Conflict, match=named):
        await store.create(CollectionSpec(**fields))  # type: ignore[arg-type]
    assert (await store.get("orders")).spec.shards == 2


async def test_concurrent_creations_get_distinct_ids(store: CollectionStore) -> None:
    created = await asyncio.gather(
        *(store.create(CollectionSpec(f"c{i}", SCHEMA, "pk")) for i in range(6)),
        *(store.create(CollectionSpec("same", SCHEMA, "pk")) for _ in range(3)),
    )
    ids = {c.name: c.collection_id for c in created}
    assert len(set(ids.values())) == 7
    assert len({c.collection_id for c in created if c.name == "same"}) == 1


async def test_unknown_collection_is_not_found(store: CollectionStore) -> None:
    with pytest.raises(errors.NotFound, match="nope"):
        await store.get("nope")


async def test_a_malformed_record_is_corrupt_data(store: CollectionStore) -> None:
    metastore: Metastore = store.metastore
    await metastore.put(collection_key(store.keys, "bad"), b'{"name": "bad"}')
    with pytest.raises(errors.CorruptData, match="bad"):
        await store.get("bad")
    record = ORDERS.to_record().model_copy(update={"name": "bad", "schema_ipc": "AAAA"})
    await metastore.txn([], [Put(collection_key(store.keys, "bad"), record.to_json())])
    with pytest.raises(errors.CorruptData, match="bad"):
        await store.get("bad")


@pytest.mark.parametrize(
    ("name", "schema", "pk", "shards", "message"),
    [
        ("a-b", SCHEMA, "pk", 1, "invalid collection name"),
        ("", SCHEMA, "pk", 1, "invalid collection name"),
        ("c", SCHEMA, "pk", 0, "shards must be"),
        ("c", SCHEMA, "missing", 1, "'missing' is not a field"),
        ("c", SCHEMA, "vector", 1, "must be a non-nullable int64 or string"),
        ("c", SCHEMA, "name", 1, r"\(nullable\)"),
        ("c", pa.schema([pa.field("pk", pa.int32(), False)]), "pk", 1, "got int32"),
        ("c", pa.schema([]), "pk", 1, "no fields"),
        (
            "c",
            pa.schema([pa.field("pk", pa.int64(), False), pa.field("pk", pa.string())]),
            "pk",
            1,
            "appear twice",
        ),
    ],
)
def test_bad_definitions_are_refused(
    name: str, schema: pa.Schema, pk: str, shards: int, message: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        CollectionSpec(name, schema, pk, shards)


def test_a_string_primary_key_is_accepted() -> None:
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("x", pa.int64())])
    assert Collection(CollectionSpec("s", schema, "id"), 1).primary_key_type == pa.string()


# -- payloads and checks ----------------------------------------------------------


def test_insert_payload_round_trip_and_field_order_is_free() -> None:
    rows = good_rows()
    assert decode(encode_rows(rows), "insert").equals(pa.Table.from_batches([rows]))
    shuffled = rows.select(["name", "pk", "vector"])
    assert check_rows(ORDERS, shuffled) is None
    assert conform(ORDERS, shuffled).schema.equals(SCHEMA)


def test_a_nullable_declaration_without_nulls_is_accepted() -> None:
    rows = batch(
        pk=pa.array([1, 2], pa.int64()),
        vector=pa.array([[1.0], None], pa.list_(pa.float32())),
        name=pa.array(["a", None]),
    )
    assert rows.schema.field("pk").nullable
    assert check_rows(ORDERS, rows) is None
    assert conform(ORDERS, rows).schema.field("pk").nullable is False


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        (good_rows().drop_columns(["name"]), "missing field 'name'"),
        (good_rows().append_column("extra", pa.array([1, 2, 3])), "unexpected field 'extra'"),
        (
            good_rows().set_column(0, "pk", pa.array([1, 2, 3], pa.int32())),
            "field 'pk' has type int32, expected int64",
        ),
        (
            good_rows().set_column(0, "pk", pa.array([1, None, 3], pa.int64())),
            "primary key field 'pk' holds 1 null",
        ),
        (
            good_rows().set_column(2, "name", pa.array([1, 2, 3], pa.int64())),
            "field 'name' has type int64, expected string",
        ),
    ],
)
def test_a_mismatched_batch_is_invalid_argument_naming_the_field(
    rows: pa.RecordBatch, message: str
) -> None:
    error = check_rows(ORDERS, rows)
    assert isinstance(error, errors.InvalidArgument)
    assert message in str(error)
    assert error.code is errors.ErrorCode.INVALID_ARGUMENT
    with pytest.raises(errors.InvalidArgument, match=message):
        conform(ORDERS, rows)


def test_delete_payloads() -> None:
    keys = decode(encode_keys(ORDERS, [5, 7]), "delete")
    assert check_keys(ORDERS, keys) is None
    assert keys.column(0).to_pylist() == [5, 7]
    with pytest.raises(errors.InvalidArgument, match="are not int64"):
        encode_keys(ORDERS, ["a"])  # type: ignore[list-item]
    wrong_type = batch(pk=pa.array(["a"]))
    assert "has type int64, the delete gives string" in str(check_keys(ORDERS, wrong_type))
    assert "holds 1 null" in str(check_keys(ORDERS, batch(pk=pa.array([1, None], pa.int64()))))
    assert "one column" in str(check_keys(ORDERS, batch(id=pa.array([1], pa.int64()))))


@pytest.mark.parametrize("payload", [b"", b"garbage", encode_rows(good_rows())[:40]])
def test_a_payload_that_is_not_ipc_is_invalid_argument(payload: bytes) -> None:
    with pytest.raises(errors.InvalidArgument, match="not an Arrow IPC stream"):
        decode(payload, "insert")


_TYPES = [pa.int64(), pa.int32(), pa.string(), pa.float64(), pa.bool_(), pa.list_(pa.float32())]


@st.composite
def schema_and_batch(draw: st.DrawFn) -> tuple[Collection, pa.RecordBatch, bool]:
    """A collection, a batch built from a perturbed copy of its schema, and whether
    the perturbation keeps the batch acceptable."""
    n_fields = draw(st.integers(1, 5))
    types = [draw(st.sampled_from(_TYPES)) for _ in range(n_fields)]
    fields = [pa.field("pk", pa.int64(), nullable=False)] + [
        pa.field(f"f{i}", t) for i, t in enumerate(types)
    ]
    collection = Collection(CollectionSpec("p", pa.schema(fields), "pk"), 1)
    perturb = draw(st.sampled_from(["none", "drop", "extra", "retype", "null_pk", "shuffle"]))
    rows = 4
    columns = {f.name: pa.nulls(rows, f.type) for f in fields[1:]}
    columns = {"pk": pa.array(range(rows), pa.int64()), **columns}
    if perturb == "drop":
        del columns[draw(st.sampled_from(sorted(columns)))]
    elif perturb == "extra":
        columns["zz"] = pa.array(range(rows), pa.int64())
    elif perturb == "retype":
        victim = draw(st.sampled_from(sorted(columns)))
        current = collection.schema.field(victim).type
        other = draw(st.sampled_from([t for t in _TYPES if t != current]))
        columns[victim] = (
            pa.nulls(rows, other) if victim != "pk" else pa.array(range(rows), pa.int32())
        )
    elif perturb == "null_pk":
        columns["pk"] = pa.array([None, *range(rows - 1)], pa.int64())
    elif perturb == "shuffle":
        columns = dict(reversed(list(columns.items())))
    return collection, batch(**columns), perturb in ("none", "shuffle")


@hypothesis.given(schema_and_batch())
@hypothesis.settings(max_examples=200, deadline=None)
def test_check_rows_accepts_exactly_the_conforming_batches(
    case: tuple[Collection, pa.RecordBatch, bool],
) -> None:
    collection, rows, acceptable = case
    error = check_rows(collection, rows)
    assert (error is None) == acceptable, error
    if acceptable:
        written = conform(collection, decode(encode_rows(rows), "insert"))
        assert written.schema.equals(collection.schema)
        assert written.num_rows == rows.num_rows


# -- the WAL message convention ---------------------------------------------------


def test_messages_round_trip_through_the_convention() -> None:
    known = {"orders": ORDERS}
    rows = good_rows().select(["name", "pk", "vector"])
    parsed = messages.parse(messages.insert(ORDERS, "orders-1", 7, rows), known)
    assert isinstance(parsed, messages.Insert)
    assert (parsed.collection, parsed.segment_id) == ("orders", 7)
    assert parsed.rows.schema.equals(SCHEMA)
    gone = messages.parse(messages.delete(ORDERS, "orders-0", [1, 2]), known)
    assert isinstance(gone, messages.Delete)
    assert gone.keys.to_pylist() == [1, 2]
    assert messages.parse(messages.seal(ORDERS, "orders-1", 7), known) == messages.Seal("orders", 7)
    assert messages.parse(Message(MessageType.INSERT, "orders-0", b"opaque"), known) is None


def test_writing_outside_the_convention_is_refused() -> None:
    with pytest.raises(errors.InvalidArgument, match="not a shard of orders"):
        messages.insert(ORDERS, "orders-9", 1, good_rows())
    with pytest.raises(errors.InvalidArgument, match="segment id out of range"):
        messages.seal(ORDERS, "orders-0", 0)
    with pytest.raises(errors.InvalidArgument, match="missing field 'name'"):
        messages.insert(ORDERS, "orders-0", 1, good_rows().drop_columns(["name"]))


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (Message(MessageType.INSERT, "x-0", b"", {messages.COLLECTION: "x"}), "unknown collection"),
        (
            Message(MessageType.INSERT, "other-0", b"", {messages.COLLECTION: "orders"}),
            "not one of its shards",
        ),
        (
            Message(
                MessageType.INSERT,
                "orders-0",
                encode_rows(good_rows()),
                {messages.COLLECTION: "orders"},
            ),
            "must be a segment id",
        ),
        (
            Message(
                MessageType.INSERT,
                "orders-0",
                b"junk",
                {messages.COLLECTION: "orders", messages.SEGMENT: "3"},
            ),
            "not an Arrow IPC stream",
        ),
        (
            Message(
                MessageType.DELETE,
                "orders-0",
                encode_rows(batch(pk=pa.array(["a"]))),
                {messages.COLLECTION: "orders"},
            ),
            "the delete gives string",
        ),
    ],
)
def test_a_message_claiming_a_collection_but_malformed_is_corrupt_data(
    message: Message, reason: str
) -> None:
    with pytest.raises(errors.CorruptData, match=reason):
        messages.parse(message, {"orders": ORDERS})

"""Insert and Delete payloads, and their checks against a collection's schema.

* An **Insert** payload is an Arrow IPC stream of record batches whose schema is
  the collection's (fields in any order; a field declared nullable is accepted
  for a non-nullable column as long as it holds no null).
* A **Delete** payload is an Arrow IPC stream of one column: primary keys of
  the collection's key type, no nulls.

:func:`check_rows` and :func:`check_keys` are pure: they return the
``INVALID_ARGUMENT`` error naming the offending field, or None. They only look
at the schema and at null counts, so the node can run them on every batch
before anything is written.
"""

from __future__ import annotations

from typing import TypeAlias

import pyarrow as pa

from headrace import errors
from headrace.table.collections import Collection

Rows: TypeAlias = "pa.RecordBatch | pa.Table"


def encode_rows(rows: Rows) -> bytes:
    """An Insert payload holding ``rows``."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, rows.schema) as writer:
        writer.write(rows)
    payload: bytes = sink.getvalue().to_pybytes()
    return payload


Keys: TypeAlias = "pa.Array | pa.ChunkedArray | list[int] | list[str]"


def key_array(collection: Collection, keys: Keys) -> pa.Array:
    """``keys`` as one checked array of the primary key's type (InvalidArgument
    naming the key field if they do not fit it)."""
    try:
        if isinstance(keys, pa.ChunkedArray):
            array = keys.combine_chunks()
        elif isinstance(keys, pa.Array):
            array = keys
        else:
            array = pa.array(keys, collection.primary_key_type)
    except (pa.ArrowException, TypeError, ValueError) as exc:
        raise errors.InvalidArgument(
            f"delete keys of {collection.name} are not {collection.primary_key_type}: {exc}"
        ) from None
    error = check_keys(collection, pa.RecordBatch.from_arrays([array], [collection.primary_key]))
    if error is not None:
        raise error
    return array


def encode_keys(collection: Collection, keys: Keys) -> bytes:
    """A Delete payload holding ``keys`` (InvalidArgument if they do not fit the key type)."""
    array = key_array(collection, keys)
    return encode_rows(pa.RecordBatch.from_arrays([array], names=[collection.primary_key]))


def decode(payload: bytes, what: str) -> pa.Table:
    """The rows of an IPC stream payload; InvalidArgument if it is not one."""
    try:
        with pa.ipc.open_stream(pa.py_buffer(payload)) as reader:
            return reader.read_all()
    except (pa.ArrowException, ValueError) as exc:
        raise errors.InvalidArgument(f"{what} payload is not an Arrow IPC stream: {exc}") from None


def check_rows(collection: Collection, rows: Rows) -> errors.InvalidArgument | None:
    """Why ``rows`` cannot be inserted into ``collection``, or None if they can."""
    expected = collection.schema
    given = rows.schema
    prefix = f"insert into {collection.name}"
    for name in given.names:
        if expected.get_field_index(name) < 0:
            return errors.InvalidArgument(
                f"{prefix}: unexpected field {name!r} (the collection has "
                f"{', '.join(expected.names)})"
            )
    if len(given.names) != len(set(given.names)):
        return errors.InvalidArgument(f"{prefix}: a field appears twice: {given.names}")
    for field in expected:
        index = given.get_field_index(field.name)
        if index < 0:
            return errors.InvalidArgument(f"{prefix}: missing field {field.name!r}")
        actual = given.field(index).type
        if actual != field.type:
            return errors.InvalidArgument(
                f"{prefix}: field {field.name!r} has type {actual}, expected {field.type}"
            )
        if not field.nullable:
            nulls = rows.column(index).null_count
            if nulls:
                what = "primary key" if field.name == collection.primary_key else "non-nullable"
                return errors.InvalidArgument(
                    f"{prefix}: {what} field {field.name!r} holds {nulls} null(s)"
                )
    return None


def check_keys(collection: Collection, keys: Rows) -> errors.InvalidArgument | None:
    """Why ``keys`` (a one-column Delete payload) cannot delete from ``collection``."""
    prefix = f"delete from {collection.name}"
    pk = collection.primary_key
    if keys.schema.names != [pk]:
        return errors.InvalidArgument(
            f"{prefix}: a delete holds one column, the primary key {pk!r}; got {keys.schema.names}"
        )
    actual = keys.schema.field(0).type
    if actual != collection.primary_key_type:
        return errors.InvalidArgument(
            f"{prefix}: primary key {pk!r} has type {collection.primary_key_type}, "
            f"the delete gives {actual}"
        )
    nulls = keys.column(0).null_count
    if nulls:
        return errors.InvalidArgument(f"{prefix}: primary key field {pk!r} holds {nulls} null(s)")
    return None


def conform(collection: Collection, rows: Rows) -> pa.Table:
    """Checked rows in the collection's field order and exact schema (for writing)."""
    error = check_rows(collection, rows)
    if error is not None:
        raise error
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_batches([rows])
    return table.select(collection.schema.names).cast(collection.schema)

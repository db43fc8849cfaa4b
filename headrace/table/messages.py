"""How collection data rides in WAL messages: the one convention writers and
the flush job share.

* **Insert**: ``MessageType.INSERT`` on a shard vchannel of the collection,
  properties ``headrace.collection`` (name) and ``headrace.segment`` (the
  growing segment the rows belong to, a decimal id), payload an Insert payload
  (:mod:`headrace.table.payloads`).
* **Insert request**: the same without ``headrace.segment``, written by
  ``producer.insert``: the node's segment interceptor stamps the segment
  before the message reaches the log (:func:`insert_request`).
* **Create / drop**: ``MessageType.CREATE_COLLECTION`` /
  ``DROP_COLLECTION`` on every shard vchannel, properties
  ``headrace.collection`` and ``headrace.collection-id``; a create carries the
  collection's record (JSON, schema included) as its payload, a drop none.
  A repeated create of the same id is a no-op for readers.
* **Delete**: ``MessageType.DELETE`` on a shard vchannel, property
  ``headrace.collection``, payload a Delete payload. A delete removes its keys
  from every row of the collection before it in log order.
* **Seal**: ``MessageType.FLUSH`` on a shard vchannel, properties
  ``headrace.collection`` and ``headrace.segment``: the segment takes no more
  rows; its position is fixed in log order. A flush range ends at a seal.
* **Flush request**: ``MessageType.FLUSH`` on a shard vchannel with
  ``headrace.collection`` and **no** ``headrace.segment``, written by
  ``client.flush``: the node's segment interceptor replaces it by the seals of
  every growing segment of the pchannel (it never reaches the log as is).

Messages without the ``headrace.collection`` property are opaque and left
alone. The node's segments interceptor (:mod:`headrace.wal.interceptors.segments`)
stamps the segment of every insert (replacing a producer's) and writes the
seals itself; it refuses a producer's seal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pyarrow as pa

from headrace import errors
from headrace.message.types import Message, MessageType
from headrace.table.collections import Collection
from headrace.table.names import COLLECTION, COLLECTION_ID, SEGMENT
from headrace.table.payloads import (
    Keys,
    Rows,
    check_keys,
    conform,
    decode,
    encode_keys,
    encode_rows,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Insert:
    collection: str
    segment_id: int
    rows: pa.Table
    """In the collection's exact schema."""


@dataclasses.dataclass(frozen=True, slots=True)
class Delete:
    collection: str
    keys: pa.ChunkedArray


@dataclasses.dataclass(frozen=True, slots=True)
class Seal:
    collection: str
    segment_id: int


CollectionData = Insert | Delete | Seal


def insert(collection: Collection, vchannel: str, segment_id: int, rows: Rows) -> Message:
    """An INSERT of ``rows`` (InvalidArgument if they do not fit the schema)."""
    _check_shard(collection, vchannel)
    conform(collection, rows)
    return Message(
        MessageType.INSERT,
        vchannel,
        encode_rows(rows),
        {COLLECTION: collection.name, SEGMENT: _segment(segment_id)},
    )


def insert_request(collection: Collection, vchannel: str, rows: Rows) -> Message:
    """An INSERT of ``rows`` with no segment, as a client writes it (the node
    assigns the segment); InvalidArgument if the rows do not fit the schema."""
    _check_shard(collection, vchannel)
    return Message(
        MessageType.INSERT,
        vchannel,
        encode_rows(conform(collection, rows)),
        {COLLECTION: collection.name},
    )


def create_collection(collection: Collection, vchannel: str) -> Message:
    """The CREATE_COLLECTION DDL of ``collection`` on one of its shards."""
    _check_shard(collection, vchannel)
    return Message(
        MessageType.CREATE_COLLECTION,
        vchannel,
        collection.to_record().to_json(),
        {COLLECTION: collection.name, COLLECTION_ID: str(collection.collection_id)},
    )


def drop_collection(collection: Collection, vchannel: str) -> Message:
    """The DROP_COLLECTION DDL of ``collection`` on one of its shards."""
    _check_shard(collection, vchannel)
    return Message(
        MessageType.DROP_COLLECTION,
        vchannel,
        b"",
        {COLLECTION: collection.name, COLLECTION_ID: str(collection.collection_id)},
    )


def delete(collection: Collection, vchannel: str, keys: Keys) -> Message:
    _check_shard(collection, vchannel)
    return Message(
        MessageType.DELETE, vchannel, encode_keys(collection, keys), {COLLECTION: collection.name}
    )


def seal(collection: Collection, vchannel: str, segment_id: int) -> Message:
    _check_shard(collection, vchannel)
    return Message(
        MessageType.FLUSH,
        vchannel,
        b"",
        {COLLECTION: collection.name, SEGMENT: _segment(segment_id)},
    )


def flush_request(collection: Collection, vchannel: str) -> Message:
    """Ask the owner of ``vchannel``'s pchannel to seal its growing segments."""
    _check_shard(collection, vchannel)
    return Message(MessageType.FLUSH, vchannel, b"", {COLLECTION: collection.name})


def parse(message: Message, collections: Mapping[str, Collection]) -> CollectionData | None:
    """The collection data ``message`` carries; None for an opaque message.

    CorruptData if it claims a collection but does not follow the convention
    (unknown collection, missing segment, a payload that does not fit): such a
    message cannot be flushed, and skipping it would lose it.
    """
    name = message.properties.get(COLLECTION)
    if name is None or message.type not in _TYPES:
        return None
    collection = collections.get(name)
    if collection is None:
        raise errors.CorruptData(
            f"{message.type.name} on {message.vchannel} names unknown collection {name!r}"
        )
    if message.vchannel not in collection.vchannels:
        raise errors.CorruptData(
            f"{message.type.name} of {name} on {message.vchannel}, not one of its shards"
        )
    where = f"{message.type.name} on {message.vchannel}"
    try:
        if message.type is MessageType.DELETE:
            keys = decode(message.payload, "delete")
        elif message.type is MessageType.FLUSH:
            return Seal(name, _parse_segment(message.properties.get(SEGMENT, "")))
        else:
            segment_id = _parse_segment(message.properties.get(SEGMENT, ""))
            return Insert(name, segment_id, conform(collection, decode(message.payload, "insert")))
    except errors.InvalidArgument as exc:
        raise errors.CorruptData(f"{where}: {exc.message}") from None
    error = check_keys(collection, keys)
    if error is not None:
        raise errors.CorruptData(f"{where}: {error.message}")
    return Delete(name, keys.column(0))


_TYPES = frozenset({MessageType.INSERT, MessageType.DELETE, MessageType.FLUSH})


def _check_shard(collection: Collection, vchannel: str) -> None:
    if vchannel not in collection.vchannels:
        raise errors.InvalidArgument(
            f"{vchannel!r} is not a shard of {collection.name} ({', '.join(collection.vchannels)})"
        )


def _segment(segment_id: int) -> str:
    if not 0 < segment_id < 10**20:
        raise errors.InvalidArgument(f"segment id out of range: {segment_id}")
    return str(segment_id)


def _parse_segment(value: str) -> int:
    if not value.isdigit() or not 0 < int(value) < 10**20:
        raise errors.InvalidArgument(f"property {SEGMENT} must be a segment id, got {value!r}")
    return int(value)

"""Collections: a name, an Arrow schema with a primary key, and shard vchannels.

A collection is recorded once in the metastore::

    <root>/collections/<name>     CollectionRecord (JSON; the schema as Arrow IPC, base64)
    <root>/collection-ids         the last collection id handed out


:meth:`CollectionStore.create` is idempotent: the same definition (schema,
primary key, shard count) returns the existing record; another definition under
the same name is CONFLICT naming both. Shard ``i`` of collection ``c`` is the
vchannel ``c-i``; collection names use ``[A-Za-z0-9_]`` only, so the shard
names cannot collide across collections.

:meth:`CollectionStore.drop` keeps the record with a ``dropped`` mark (when,
and the timetick of the DROP_COLLECTION messages): flushing stops and the
table's data is garbage. A dropped name is never given out again (CONFLICT
naming the drop): its shard vchannels still hold the old collection's
messages, and a new collection on them would read as the old one's.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import time
from typing import TYPE_CHECKING

from headrace import errors
from headrace.cluster import JsonRecord, Keys
from headrace.metastore.contract import Compare, Delete, Metastore, Put
from headrace.table.pins import pin_epoch_key
from headrace.table.records import collection_key

if TYPE_CHECKING:
    # pyarrow is imported where a schema is built or checked, not with this
    # module: a node imports it on its write path and loads pyarrow only once
    # a collection exists.
    import pyarrow as pa

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_]{0,199}$")
"""Collection names: 1-200 of ``[A-Za-z0-9_]``, starting alphanumeric."""

MAX_SHARDS = 256


def collections_prefix(keys: Keys) -> str:
    return f"{keys.root}/collections/"


def collection_ids_key(keys: Keys) -> str:
    return f"{keys.root}/collection-ids"


def shard_vchannel(name: str, shard: int) -> str:
    return f"{name}-{shard}"


@dataclasses.dataclass(frozen=True, slots=True)
class CollectionSpec:
    """A collection's definition, as a user gives it; checked on construction."""

    name: str
    schema: pa.Schema
    primary_key: str = "pk"
    shards: int = 1

    def __post_init__(self) -> None:
        if not NAME_PATTERN.match(self.name):
            raise errors.InvalidArgument(
                f"invalid collection name {errors.quoted(self.name)}: use 1-200 characters of "
                "[A-Za-z0-9_], starting with a letter or digit"
            )
        if not 1 <= self.shards <= MAX_SHARDS:
            raise errors.InvalidArgument(
                f"collection {self.name}: shards must be 1..{MAX_SHARDS}, got {self.shards}"
            )
        names = self.schema.names
        if not names:
            raise errors.InvalidArgument(f"collection {self.name}: the schema has no fields")
        if len(set(names)) != len(names):
            raise errors.InvalidArgument(
                f"collection {self.name}: field names appear twice in the schema: {names}"
            )
        index = self.schema.get_field_index(self.primary_key)
        if index < 0:
            raise errors.InvalidArgument(
                f"collection {self.name}: primary key {errors.quoted(self.primary_key)} is not "
                f"a field of the schema ({', '.join(names)})"
            )
        field = self.schema.field(index)
        import pyarrow as pa  # noqa: PLC0415 - loaded already: the schema is an Arrow one

        if field.type not in (pa.int64(), pa.string()) or field.nullable:
            raise errors.InvalidArgument(
                f"collection {self.name}: primary key {self.primary_key!r} must be a non-nullable "
                f"int64 or string field, got {field.type}"
                + (" (nullable)" if field.nullable else "")
            )

    @property
    def vchannels(self) -> tuple[str, ...]:
        return tuple(shard_vchannel(self.name, i) for i in range(self.shards))

    def differences(self, other: CollectionSpec) -> list[str]:
        """What differs between two definitions of the same name (empty if none)."""
        found = []
        if not self.schema.equals(other.schema, check_metadata=True):
            found.append(
                f"schema {other.schema.to_string(show_schema_metadata=False)!r} "
                f"vs {self.schema.to_string(show_schema_metadata=False)!r}"
            )
        if self.primary_key != other.primary_key:
            found.append(f"primary key {other.primary_key!r} vs {self.primary_key!r}")
        if self.shards != other.shards:
            found.append(f"shards {other.shards} vs {self.shards}")
        return found


@dataclasses.dataclass(frozen=True, slots=True)
class Dropped:
    """When a collection was dropped."""

    at: float
    """Wall-clock seconds (``time.time()``) when the drop was recorded."""
    timetick: int = 0
    """The largest timetick of its DROP_COLLECTION messages (0 if unknown)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Collection:
    """A recorded collection: its definition and the id the metastore gave it."""

    spec: CollectionSpec
    collection_id: int
    dropped: Dropped | None = None
    """Set once the collection is dropped: no more writes or flushes."""

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def schema(self) -> pa.Schema:
        return self.spec.schema

    @property
    def primary_key(self) -> str:
        return self.spec.primary_key

    @property
    def primary_key_type(self) -> pa.DataType:
        return self.spec.schema.field(self.spec.primary_key).type

    @property
    def vchannels(self) -> tuple[str, ...]:
        return self.spec.vchannels

    def to_record(self) -> CollectionRecord:
        return CollectionRecord(
            name=self.name,
            collection_id=self.collection_id,
            schema_ipc=base64.b64encode(self.schema.serialize().to_pybytes()).decode(),
            primary_key=self.primary_key,
            vchannels=list(self.vchannels),
            dropped=self.dropped is not None,
            dropped_at=0.0 if self.dropped is None else self.dropped.at,
            dropped_timetick=0 if self.dropped is None else self.dropped.timetick,
        )

    def describe(self) -> dict[str, object]:
        """The collection as plain values (for JSON and the CLI)."""
        return {
            "name": self.name,
            "collection_id": self.collection_id,
            "primary_key": self.primary_key,
            "shards": self.spec.shards,
            "vchannels": list(self.vchannels),
            "fields": [
                {"name": f.name, "type": str(f.type), "nullable": f.nullable} for f in self.schema
            ],
            "dropped": self.dropped is not None,
            "dropped_at": None if self.dropped is None else self.dropped.at,
            "dropped_timetick": None if self.dropped is None else self.dropped.timetick,
        }


class CollectionRecord(JsonRecord):
    """How a collection is stored in the metastore."""

    name: str
    collection_id: int
    schema_ipc: str
    """The Arrow schema, serialized as an Arrow IPC schema message, base64."""
    primary_key: str
    vchannels: list[str]
    dropped: bool = False
    """True once the collection is dropped (see :class:`Dropped`)."""
    dropped_at: float = 0.0
    dropped_timetick: int = 0

    def collection(self) -> Collection:
        """The decoded collection; CorruptData if the record does not hold one."""
        import pyarrow as pa  # noqa: PLC0415 - see the TYPE_CHECKING import

        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(self.schema_ipc)))
            spec = CollectionSpec(self.name, schema, self.primary_key, len(self.vchannels))
        except (ValueError, pa.ArrowException, errors.InvalidArgument) as exc:
            raise errors.CorruptData(f"malformed collection record {self.name!r}: {exc}") from None
        if list(spec.vchannels) != self.vchannels:
            raise errors.CorruptData(
                f"collection record {self.name!r} names vchannels {self.vchannels}, "
                f"expected {list(spec.vchannels)}"
            )
        dropped = Dropped(self.dropped_at, self.dropped_timetick) if self.dropped else None
        return Collection(spec, self.collection_id, dropped)


class CollectionStore:
    """Collections of one cluster in its metastore."""

    max_attempts = 16
    """Tries when other creations race for the id counter."""

    def __init__(self, metastore: Metastore, keys: Keys) -> None:
        self.metastore = metastore
        self.keys = keys

    async def create(self, spec: CollectionSpec) -> Collection:
        """Record ``spec`` (idempotent); CONFLICT if the name holds another definition."""
        key = collection_key(self.keys, spec.name)
        counter_key = collection_ids_key(self.keys)
        for _ in range(self.max_attempts):
            existing = await self.metastore.get(key)
            if existing is not None:
                return _same_or_conflict(CollectionRecord.from_json(existing.value), spec)
            counter = await self.metastore.get(counter_key)
            last_id = 0 if counter is None else _counter(counter.value)
            counter_revision = 0 if counter is None else counter.mod_revision
            created = Collection(spec, last_id + 1)
            result = await self.metastore.txn(
                [
                    Compare.absent(key),
                    Compare.mod_revision_is(counter_key, counter_revision),
                ],
                [
                    Put(counter_key, str(created.collection_id).encode()),
                    Put(key, created.to_record().to_json()),
                ],
            )
            if result.succeeded:
                return created
        raise errors.Unavailable(
            f"creating collection {spec.name}: kept racing with other creations; try again"
        )

    async def get(self, name: str) -> Collection:
        """The recorded collection; NOT_FOUND if there is none."""
        if not NAME_PATTERN.match(name):
            raise errors.InvalidArgument(f"invalid collection name {errors.quoted(name)}")
        kv = await self.metastore.get(collection_key(self.keys, name))
        if kv is None:
            raise errors.NotFound(f"no collection {name!r} in cluster {self.keys.cluster}")
        return CollectionRecord.from_json(kv.value).collection()

    async def list(self) -> list[Collection]:
        """Every recorded collection, dropped ones included, by name."""
        items = await self.metastore.get_prefix(collections_prefix(self.keys))
        found = [CollectionRecord.from_json(item.value).collection() for item in items]
        return sorted(found, key=lambda c: c.name)

    async def drop(self, name: str, dropped: Dropped) -> Collection:
        """Mark ``name`` dropped (idempotent: a dropped one is returned as it is).

        The same transaction deletes the collection's reader pin epoch
        (:mod:`headrace.table.pins`): a dropped collection is never expired
        again, and no pin can be taken on it after the mark (a pin compares
        the record), so nothing would ever delete the key later. NOT_FOUND
        if there is no such collection.
        """
        key = collection_key(self.keys, name)
        for _ in range(self.max_attempts):
            kv = await self.metastore.get(key)
            if kv is None:
                raise errors.NotFound(f"no collection {name!r} in cluster {self.keys.cluster}")
            current = CollectionRecord.from_json(kv.value).collection()
            if current.dropped is not None:
                return current
            marked = dataclasses.replace(current, dropped=dropped)
            result = await self.metastore.txn(
                [Compare.mod_revision_is(key, kv.mod_revision)],
                [
                    Put(key, marked.to_record().to_json()),
                    Delete(pin_epoch_key(self.keys, name)),
                ],
            )
            if result.succeeded:
                return marked
        raise errors.Unavailable(f"dropping collection {name}: its record kept changing; try again")


def _same_or_conflict(record: CollectionRecord, spec: CollectionSpec) -> Collection:
    existing = record.collection()
    if existing.dropped is not None:
        raise errors.Conflict(
            f"collection {spec.name} was dropped (at {_when(existing.dropped.at)}); the name of "
            "a dropped collection is not reused, as its shard vchannels still hold the old "
            "collection's messages: choose another name"
        )
    differences = existing.spec.differences(spec)
    if differences:
        raise errors.Conflict(
            f"collection {spec.name} exists with another definition (asked vs recorded): "
            + "; ".join(differences)
        )
    return existing


def _when(at: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))


def _counter(value: bytes) -> int:
    try:
        return int(value.decode())
    except ValueError:
        raise errors.CorruptData(f"malformed collection id counter {value!r}") from None

"""Collections as Iceberg tables, committed by flushes under the owner's term.

:class:`TableCatalog` is the synchronous entry point a flush job uses::

    with TableCatalog.open(CatalogConfig(metastore_url, "s3://bucket/wh", object_store=...)) as c:
        c.create_table("orders", arrow_schema, primary_key="pk")          # idempotent
        path = c.write_data_file("orders", rows, "flush-p0-t3-s17-0")      # Parquet in the table
        result = c.commit_flush(FlushCommit(pchannel, launch_term, wal_range, checkpoint,
                                            (TableChanges("orders", (path,), deletes, segs),)))

:meth:`TableCatalog.commit_flush` is ONE metastore transaction that compares
the pchannel's Assignment (its ``mod_revision``, after checking it still names
the launch term), the current checkpoint (its ``mod_revision``) and every
touched table's pointer (its ``mod_revision``, the one the table commit was
staged on), checks each new segment key is absent, and then writes, in order:
the segment records, the tables' new metadata pointers, and the channel
checkpoint last. The WAL range and the checkpoint also ride in every Iceberg
snapshot the flush creates (:meth:`FlushCommit.summary`). See
``docs/pipeline.md`` for why this neither loses nor duplicates rows.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.exceptions import (
    CommitFailedException,
    NoSuchTableError,
    TableAlreadyExistsError,
    ValidationException,
)
from pyiceberg.expressions import In
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import Table
from pyiceberg.table.update import TableRequirement, TableUpdate

from headrace import errors
from headrace.cluster import DEFAULT_CLUSTER, Assignment, Keys
from headrace.metastore.contract import Compare, Get, KeyValue, Metastore, Op, Put
from headrace.metastore.factory import open_metastore
from headrace.table.bridge import LoopThread, SyncStore
from headrace.table.decide import AlreadyCommitted, Proceed, Refused, decide
from headrace.table.iceberg import HeadraceIcebergCatalog, StagedPointer
from headrace.table.pins import (
    ReaderPins,
    pinned_snapshots,
    pins_prefix,
    reader_pins_of,
    reader_pins_ops,
)
from headrace.table.records import (
    CheckpointRecord,
    FlushCommit,
    SegmentRecord,
    TableChanges,
    TableRecord,
    segment_keys,
    table_key,
)
from headrace.table.storage import ObjectStoreOptions, Referenced, Warehouse

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class MetadataChange:
    """A metadata-only change of one table (snapshot expiry)."""

    requirements: tuple[TableRequirement, ...]
    """Checked against the table's metadata when the change is applied."""
    updates: tuple[TableUpdate, ...]
    guards: tuple[Compare, ...] = ()
    """Metastore conditions the pointer swap compares as well (an expiry's:
    no reader pinned a snapshot since it read the pins)."""


PRIMARY_KEY_TYPES = (pa.int64(), pa.string())


@dataclasses.dataclass(frozen=True, slots=True)
class CatalogConfig:
    """Where the catalog's state and files live, and how long to wait."""

    metastore_url: str
    warehouse: str
    """An absolute directory or ``s3://bucket/prefix``."""
    cluster: str = DEFAULT_CLUSTER
    object_store: ObjectStoreOptions = dataclasses.field(default_factory=ObjectStoreOptions)
    metastore_timeout_s: float = 15.0
    commit_attempts: int = 8
    """Tries when only a table pointer raced (another pchannel's flush of the
    same collection); a moved term or checkpoint is never retried."""


class Outcome(enum.Enum):
    COMMITTED = "COMMITTED"
    ALREADY_COMMITTED = "ALREADY_COMMITTED"


@dataclasses.dataclass(frozen=True, slots=True)
class FlushResult:
    outcome: Outcome
    checkpoint: CheckpointRecord
    metadata_locations: dict[str, str]
    """Collection -> its metadata file after the commit (empty if ALREADY_COMMITTED)."""
    attempts: int


@dataclasses.dataclass(frozen=True, slots=True)
class TableInfo:
    collection: str
    primary_key: str
    metadata_location: str
    arrow_schema: pa.Schema


@dataclasses.dataclass(frozen=True, slots=True)
class ChannelView:
    """What a commit attempt read of its pchannel (one revision)."""

    assignment_kv: KeyValue | None
    checkpoint_kv: KeyValue | None
    recorded_segments: tuple[int, ...]
    table_revisions: dict[str, int]
    """Table key -> ``mod_revision`` of its pointer (0: no table)."""

    def staged_on_current(self, staged: Sequence[StagedPointer]) -> bool:
        """Whether every staged commit was staged on the pointer read now, so
        the staged metadata can be committed without staging again."""
        return all(self.table_revisions.get(p.key) == p.base_revision for p in staged)

    def assignment(self) -> Assignment | None:
        kv = self.assignment_kv
        return None if kv is None else Assignment.from_json(kv.value)

    def checkpoint(self) -> CheckpointRecord | None:
        kv = self.checkpoint_kv
        return None if kv is None else CheckpointRecord.from_json(kv.value)

    @property
    def assignment_revision(self) -> int:
        return 0 if self.assignment_kv is None else self.assignment_kv.mod_revision

    @property
    def checkpoint_revision(self) -> int:
        return 0 if self.checkpoint_kv is None else self.checkpoint_kv.mod_revision


class TableCatalog:
    """Blocking catalog of a cluster's collection tables; close it when done."""

    def __init__(self, config: CatalogConfig, loop: LoopThread, metastore: Metastore) -> None:
        self.config = config
        self.keys = Keys(config.cluster)
        self.warehouse = Warehouse.parse(config.warehouse, config.object_store)
        self._loop = loop
        self._store = SyncStore(loop, metastore, config.metastore_timeout_s)
        self._iceberg = HeadraceIcebergCatalog(
            self._store, self.keys, **self.warehouse.io_properties()
        )
        self._commit_lock = threading.Lock()

    @classmethod
    def open(cls, config: CatalogConfig) -> TableCatalog:
        Warehouse.parse(config.warehouse, config.object_store)
        if config.commit_attempts < 1:
            raise errors.InvalidArgument(
                f"commit_attempts must be >= 1, got {config.commit_attempts}"
            )
        loop = LoopThread(f"headrace-tables-{config.cluster}")
        try:
            metastore = loop.run(open_metastore(config.metastore_url), config.metastore_timeout_s)
        except BaseException:
            loop.stop()
            raise
        return cls(config, loop, metastore)

    def close(self) -> None:
        try:
            self._loop.run(self._store.metastore.close(), self.config.metastore_timeout_s)
        finally:
            self._loop.stop()

    def __enter__(self) -> TableCatalog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- tables -------------------------------------------------------------

    def create_table(self, collection: str, arrow_schema: pa.Schema, primary_key: str) -> TableInfo:
        """Create the collection's table, or return it if it exists with this schema.

        The primary key must be a non-nullable int64 or string field; it becomes
        the Iceberg schema's identifier field. An existing table with another
        schema or key is refused (CONFLICT).
        """
        schema = self._iceberg_schema(collection, arrow_schema, primary_key)
        identifier = self._iceberg.identifier(collection)
        try:
            table = self.storage(
                f"creating table {collection}",
                lambda: self._iceberg.create_table(identifier, schema),
            )
        except TableAlreadyExistsError:
            table = self._load(collection)
        info = self._info(collection, table)
        if info.primary_key != primary_key or table.schema().as_struct() != schema.as_struct():
            raise errors.Conflict(
                f"table {collection} exists with primary key {info.primary_key!r} and schema "
                f"{table.schema()}; asked for {primary_key!r} and {schema}"
            )
        return info

    def table(self, collection: str) -> TableInfo:
        """The collection's table (NOT_FOUND if it was never created)."""
        return self._info(collection, self._load(collection))

    def collections(self) -> list[str]:
        return [name for _, name in self._iceberg.list_tables(self.keys.cluster)]

    def table_record(self, collection: str) -> TableRecord:
        """The collection's pointer record (NOT_FOUND if it was never created)."""
        found = self._iceberg.read_record(collection)
        if found is None:
            raise errors.NotFound(f"no table for collection {collection}")
        return found[0]

    def reader_pins(self) -> dict[str, frozenset[int]]:
        """Collection -> the snapshot ids open snapshot reads hold
        (:mod:`headrace.table.pins`), for tools and tests; snapshot expiry
        reads one collection's with :meth:`reader_pins_of` instead."""
        return pinned_snapshots(self.keys, self._store.get_prefix(pins_prefix(self.keys)))

    def reader_pins_of(self, collection: str) -> ReaderPins:
        """The snapshots open reads of ``collection`` hold, with the pin epoch
        to compare when a commit relies on them (:class:`MetadataChange` guards)."""
        found = self._store.txn([], reader_pins_ops(self.keys, collection)).gets
        return reader_pins_of(self.keys, collection, found)

    def iceberg_table(self, collection: str) -> Table:
        """The collection's pyiceberg ``Table`` as of now (for readers and tools)."""
        return self._load(collection)

    def scan(self, collection: str) -> pa.Table:
        """The committed rows (pyiceberg's own reader; tests use DuckDB as well)."""
        table = self._load(collection)
        current = f"the current snapshot of {table.metadata_location}"
        return self.storage(
            f"reading {collection}", lambda: table.scan().to_arrow(), Referenced("", current)
        )

    def write_data_file(self, collection: str, rows: pa.Table, name: str) -> str:
        """Write ``rows`` as ``<table location>/data/<name>.parquet``; its path.

        An existing file of that name is overwritten: never reuse a name a
        commit may reference (the flush job puts a per-run id in every name).
        """
        if not name or "/" in name:
            raise errors.InvalidArgument(f"invalid data file name {name!r}")
        table = self._load(collection)
        expected = table.schema()
        given = self._convert(rows.schema)
        if given.as_struct() != expected.as_struct():
            raise errors.InvalidArgument(
                f"rows for {collection} do not match its schema: got {given}, expected {expected}"
            )
        path = f"{table.location()}/data/{name}.parquet"

        def write() -> None:
            with table.io.new_output(path).create(overwrite=True) as stream:
                pq.write_table(rows, stream)

        self.storage(f"writing {path}", write)
        return path

    def change_table(
        self, collection: str, plan: Callable[[Table], MetadataChange | None]
    ) -> Table:
        """Apply a metadata-only change (snapshot expiry) to the current table.

        ``plan`` sees the table as loaded now and returns the change, or None
        for nothing to do. The change is one swap of the table's pointer,
        compared on its ``mod_revision`` like every commit and on the change's
        ``guards``, and touches no checkpoint or segment; when another commit
        (a flush) moved the pointer or a guard failed meanwhile, it is planned
        again on the new metadata (up to ``commit_attempts`` tries, then
        CONFLICT, retryable). The table after.
        """
        with self._commit_lock:
            for attempt in range(1, self.config.commit_attempts + 1):
                table = self._load(collection)
                change = plan(table)
                if change is None:
                    return table
                if self._swap(collection, table, change):
                    return self._load(collection)
                log.info("%s: change attempt %d raced; trying again", collection, attempt)
        raise errors.Conflict(
            f"the change of table {collection} kept racing with other commits "
            f"({self.config.commit_attempts} attempts); try again",
            retryable=True,
        )

    def _swap(self, collection: str, table: Table, change: MetadataChange) -> bool:
        """Write the changed metadata and swap the pointer under the guards;
        False if the table or a guard moved."""
        with self._iceberg.staging() as staged:
            commit = functools.partial(
                self._iceberg.commit_table, table, change.requirements, change.updates
            )
            try:
                self.storage(f"committing a change of {collection}", commit)
            except CommitFailedException:
                return False
            pointers = list(staged)
        if not pointers:
            return True  # the change leaves the metadata as it is
        compares = [*(p.compare() for p in pointers), *change.guards]
        return self._store.txn(compares, [p.put() for p in pointers]).succeeded

    def commit(self, collection: str, action: Callable[[], Table]) -> Table | None:
        """Run ``action``, a pyiceberg commit of ``collection`` (one pointer swap
        compared on its ``mod_revision``), under the catalog's commit lock; the
        table after, or None when another commit moved the table first.

        pyiceberg retries a transaction on the moved table by itself and
        validates it there (``ValidationException`` when, say, a file it removes
        is gone or another commit added files); both mean nothing landed."""
        with self._commit_lock:
            try:
                return self.storage(f"committing a change of {collection}", action)
            except (CommitFailedException, ValidationException) as exc:
                log.info("%s: commit raced: %s", collection, exc)
                return None

    # -- flush commit -------------------------------------------------------

    def commit_flush(self, commit: FlushCommit) -> FlushResult:
        """Commit a flush (see the module docstring); FENCED, CONFLICT or
        UNAVAILABLE with the reason if it cannot."""
        staged: list[StagedPointer] | None = None
        with self._commit_lock:
            for attempt in range(1, self.config.commit_attempts + 1):
                view = self._read_channel(commit)
                decision = decide(
                    commit, view.assignment(), view.checkpoint(), view.recorded_segments
                )
                if isinstance(decision, AlreadyCommitted):
                    log.info("%s: flush %s already committed", commit.pchannel, commit.wal_range)
                    return FlushResult(Outcome.ALREADY_COMMITTED, decision.checkpoint, {}, attempt)
                if isinstance(decision, Refused):
                    raise decision.error
                if staged is None or not view.staged_on_current(staged):
                    staged = self._stage(commit)
                if staged is None:
                    continue  # a table moved while staging
                result = self._try_commit(commit, decision, view, staged, attempt)
                if result is not None:
                    return result
                log.info("%s: commit attempt %d raced; trying again", commit.pchannel, attempt)
        raise errors.Conflict(
            f"{commit.pchannel}: the commit of {commit.wal_range} kept racing with other "
            f"commits of its tables ({self.config.commit_attempts} attempts); try again",
            retryable=True,
        )

    def _try_commit(
        self,
        commit: FlushCommit,
        decision: Proceed,
        view: ChannelView,
        staged: Sequence[StagedPointer],
        attempt: int,
    ) -> FlushResult | None:
        """One transaction; None if something moved meanwhile."""
        checkpoint = CheckpointRecord(
            pchannel=commit.pchannel,
            position=commit.checkpoint.position,
            timetick=commit.checkpoint.timetick,
            node=decision.node,
            term=commit.launch_term,
            flush_start=commit.wal_range.start,
            flush_end=commit.wal_range.end,
        )
        pchannel = commit.pchannel
        compares = [
            Compare.mod_revision_is(self.keys.pchannel(pchannel), view.assignment_revision),
            Compare.mod_revision_is(self.keys.checkpoint(pchannel), view.checkpoint_revision),
            *(pointer.compare() for pointer in staged),
            *(Compare.absent(key) for key in segment_keys(self.keys, commit)),
        ]
        ops: list[Op] = [
            *self._segment_puts(commit, decision.node),
            *(pointer.put() for pointer in staged),
            Put(self.keys.checkpoint(commit.pchannel), checkpoint.to_json()),
        ]
        if not self._store.txn(compares, ops).succeeded:
            return None
        return FlushResult(
            Outcome.COMMITTED,
            checkpoint,
            {p.record.collection: p.record.metadata_location for p in staged},
            attempt,
        )

    def _read_channel(self, commit: FlushCommit) -> ChannelView:
        """The pchannel's Assignment and checkpoint, which of the flush's
        segments are already recorded and its tables' pointers, at one revision."""
        pchannel = commit.pchannel
        segments = [s.segment_id for table in commit.tables for s in table.segments]
        tables = [table_key(self.keys, table.collection) for table in commit.tables]
        keys = [
            self.keys.pchannel(pchannel),
            self.keys.checkpoint(pchannel),
            *segment_keys(self.keys, commit),
            *tables,
        ]
        gets: list[Op] = [Get(key) for key in keys]
        found = [kvs[0] if kvs else None for kvs in self._store.txn([], gets).gets]
        assignment, checkpoint = found[:2]
        segment_kvs, table_kvs = found[2 : 2 + len(segments)], found[2 + len(segments) :]
        recorded = tuple(s for s, kv in zip(segments, segment_kvs, strict=True) if kv is not None)
        revisions = {
            key: 0 if kv is None else kv.mod_revision
            for key, kv in zip(tables, table_kvs, strict=True)
        }
        return ChannelView(assignment, checkpoint, recorded, revisions)

    def _stage(self, commit: FlushCommit) -> list[StagedPointer] | None:
        """Write each table's new metadata; None if a table moved while staging."""
        with self._iceberg.staging() as staged:
            for changes in commit.tables:
                try:
                    self._stage_table(changes, commit.summary())
                except CommitFailedException:
                    return None
            return list(staged)

    def _stage_table(self, changes: TableChanges, summary: dict[str, str]) -> None:
        if not changes.data_files and not changes.deletes:
            return
        table = self._load(changes.collection)
        primary_key = self._primary_key(table)

        def stage() -> None:
            txn = table.transaction()
            if changes.deletes:
                # pyiceberg's In is built by its __new__, which mypy does not see.
                matching = In(primary_key, set(changes.deletes))  # type: ignore[call-arg, arg-type]
                txn.delete(matching, snapshot_properties=summary)
            if changes.data_files:
                txn.add_files(
                    list(changes.data_files),
                    snapshot_properties=summary,
                    check_duplicate_files=False,
                )
            txn.commit_transaction()

        try:
            self.storage(f"staging the commit of {changes.collection}", stage)
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(
                f"flush of {changes.collection} refused by the table: {exc}"
            ) from None

    def _segment_puts(self, commit: FlushCommit, node: str) -> Sequence[Put]:
        keys = segment_keys(self.keys, commit)
        records: list[SegmentRecord] = [
            segment.model_copy(
                update={
                    "collection": table.collection,
                    "pchannel": commit.pchannel,
                    "node": node,
                    "term": commit.launch_term,
                }
            )
            for table in commit.tables
            for segment in table.segments
        ]
        return [Put(key, record.to_json()) for key, record in zip(keys, records, strict=True)]

    # -- helpers ------------------------------------------------------------

    def _load(self, collection: str) -> Table:
        try:
            return self.storage(
                f"loading table {collection}",
                lambda: self._iceberg.load_table(self._iceberg.identifier(collection)),
            )
        except NoSuchTableError:
            raise errors.NotFound(f"no table for collection {collection}") from None

    @staticmethod
    def _primary_key(table: Table) -> str:
        (name,) = table.schema().identifier_field_names()
        return name

    def _info(self, collection: str, table: Table) -> TableInfo:
        return TableInfo(
            collection=collection,
            primary_key=self._primary_key(table),
            metadata_location=table.metadata_location,
            arrow_schema=table.schema().as_arrow(),
        )

    def _iceberg_schema(self, collection: str, arrow_schema: pa.Schema, primary_key: str) -> Schema:
        index = arrow_schema.get_field_index(primary_key)
        if index < 0:
            raise errors.InvalidArgument(
                f"collection {collection}: primary key {primary_key!r} is not a field of the schema"
            )
        field = arrow_schema.field(index)
        if field.type not in PRIMARY_KEY_TYPES or field.nullable:
            raise errors.InvalidArgument(
                f"collection {collection}: primary key {primary_key!r} must be a non-nullable "
                f"int64 or string field, got {field.type}{' (nullable)' if field.nullable else ''}"
            )
        converted = self._convert(arrow_schema)
        identifier = converted.find_field(primary_key).field_id
        return Schema(*converted.fields, identifier_field_ids=[identifier])

    def _convert(self, arrow_schema: pa.Schema) -> Schema:
        """The Iceberg schema of ``arrow_schema``, with ids numbered from 1 in order."""
        try:
            return assign_fresh_schema_ids(self._iceberg._convert_schema_if_needed(arrow_schema))
        except (ValueError, TypeError) as exc:
            raise errors.InvalidArgument(f"no Iceberg type for {arrow_schema}: {exc}") from None

    def storage(
        self, doing: str, action: Callable[[], T], referenced: Referenced | None = None
    ) -> T:
        """Run a storage action; its OSError as a Headrace error (``referenced``:
        the action reads files committed metadata references, see
        :meth:`Warehouse.translate`)."""
        try:
            return action()
        except OSError as exc:
            raise self.warehouse.translate(exc, doing, referenced) from None

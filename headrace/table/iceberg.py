"""A pyiceberg catalog whose table pointers live in Headrace's metastore.

Each table is one key, ``<root>/tables/<collection>``, holding a
:class:`~headrace.table.records.TableRecord` whose ``metadata_location`` is the
table's current metadata file. A commit writes the new metadata file, then
swaps the pointer with a metastore transaction that compares the key's
``mod_revision`` with the one the commit was staged on (optimistic concurrency,
as every Iceberg catalog does with its pointer).

For flushes the swap is not done here: inside :meth:`HeadraceIcebergCatalog.staging`
a commit only writes the metadata file and records a :class:`StagedPointer`;
the caller then swaps every staged pointer together with the segment meta and
the channel checkpoint in one transaction (:mod:`headrace.table.catalog`).

There is one namespace, the cluster's name; views are not supported.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyiceberg.catalog import Catalog, MetastoreCatalog, PropertiesUpdateSummary
from pyiceberg.exceptions import (
    CommitFailedException,
    NamespaceAlreadyExistsError,
    NoSuchNamespaceError,
    NoSuchTableError,
    NoSuchViewError,
    TableAlreadyExistsError,
)
from pyiceberg.partitioning import UNPARTITIONED_PARTITION_SPEC, PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.serializers import FromInputFile
from pyiceberg.table import CommitTableResponse, Table
from pyiceberg.table.metadata import TableMetadata
from pyiceberg.table.sorting import UNSORTED_SORT_ORDER, SortOrder
from pyiceberg.table.update import TableRequirement, TableUpdate
from pyiceberg.typedef import EMPTY_DICT, Identifier, Properties
from pyiceberg.view import View
from pyiceberg.view.metadata import ViewVersion
from typing_extensions import override

from headrace import errors
from headrace.cluster import Keys
from headrace.metastore.contract import Compare, KeyValue, Op, Put
from headrace.table.bridge import SyncStore
from headrace.table.records import TableRecord, table_key, tables_prefix


@dataclasses.dataclass(frozen=True, slots=True)
class StagedPointer:
    """A table commit whose metadata file is written but not yet pointed to."""

    key: str
    base_revision: int
    """``mod_revision`` of the pointer the commit was staged on."""
    record: TableRecord

    def compare(self) -> Compare:
        return Compare.mod_revision_is(self.key, self.base_revision)

    def put(self) -> Put:
        return Put(self.key, self.record.to_json())


class HeadraceIcebergCatalog(MetastoreCatalog):
    """pyiceberg ``Catalog`` over a :class:`SyncStore` (see the module docstring)."""

    def __init__(self, store: SyncStore, keys: Keys, **properties: str) -> None:
        super().__init__(keys.cluster, **properties)
        self._store = store
        self._keys = keys
        self._staged: list[StagedPointer] | None = None

    # -- identifiers --------------------------------------------------------

    def identifier(self, collection: str) -> Identifier:
        return (self._keys.cluster, collection)

    def _collection(self, identifier: str | Identifier) -> str:
        # pyiceberg splits dotted strings into levels; the one namespace is the
        # cluster name, which may hold dots itself (the operator's clusters are
        # ``<namespace>.<name>``), so it is compared joined again.
        parts = Catalog.identifier_to_tuple(identifier)
        if len(parts) < 2 or ".".join(parts[:-1]) != self._keys.cluster:
            raise NoSuchTableError(f"no table {'.'.join(parts)} in namespace {self._keys.cluster}")
        return parts[-1]

    def _check_namespace(self, namespace: str | Identifier) -> None:
        if ".".join(Catalog.identifier_to_tuple(namespace)) != self._keys.cluster:
            raise NoSuchNamespaceError(f"the only namespace is {self._keys.cluster}")

    # -- tables -------------------------------------------------------------

    def read_record(self, collection: str) -> tuple[TableRecord, KeyValue] | None:
        kv = self._store.get(table_key(self._keys, collection))
        return None if kv is None else (TableRecord.from_json(kv.value), kv)

    @override
    def create_table(
        self,
        identifier: str | Identifier,
        schema: Schema | pa.Schema,
        location: str | None = None,
        partition_spec: PartitionSpec = UNPARTITIONED_PARTITION_SPEC,
        sort_order: SortOrder = UNSORTED_SORT_ORDER,
        properties: Properties = EMPTY_DICT,
    ) -> Table:
        collection = self._collection(identifier)
        if not isinstance(schema, Schema) or len(schema.identifier_field_names()) != 1:
            raise errors.InvalidArgument(
                f"table {collection}: an Iceberg schema with one identifier field (the primary key)"
            )
        staged = self._create_staged_table(
            identifier, schema, location, partition_spec, sort_order, properties
        )
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        (primary_key,) = schema.identifier_field_names()
        record = TableRecord(
            collection=collection,
            primary_key=primary_key,
            metadata_location=staged.metadata_location,
        )
        key = table_key(self._keys, collection)
        result = self._store.txn([Compare.absent(key)], [Put(key, record.to_json())])
        if not result.succeeded:
            raise TableAlreadyExistsError(f"table {collection} already exists")
        return self.load_table(identifier)

    @override
    def load_table(self, identifier: str | Identifier) -> Table:
        collection = self._collection(identifier)
        found = self.read_record(collection)
        if found is None:
            raise NoSuchTableError(f"no table {collection}")
        return self._table(collection, found[0].metadata_location)

    def _table(self, collection: str, metadata_location: str) -> Table:
        io = self._load_file_io(location=metadata_location)
        metadata = FromInputFile.table_metadata(io.new_input(metadata_location))
        return Table(
            identifier=self.identifier(collection),
            metadata=metadata,
            metadata_location=metadata_location,
            io=io,
            catalog=self,
        )

    @contextlib.contextmanager
    def staging(self) -> Iterator[list[StagedPointer]]:
        """Within: commits write metadata files and are collected, not applied."""
        if self._staged is not None:
            raise errors.InvalidArgument("staging commits is not reentrant")
        self._staged = []
        try:
            yield self._staged
        finally:
            self._staged = None

    @override
    def commit_table(
        self,
        table: Table,
        requirements: tuple[TableRequirement, ...],
        updates: tuple[TableUpdate, ...],
    ) -> CommitTableResponse:
        collection = self._collection(table.name())
        found = self.read_record(collection)
        if found is None:
            raise NoSuchTableError(f"no table {collection}")
        record, kv = found
        current = self._table(collection, record.metadata_location)
        staged = self._update_and_stage_table(current, table.name(), requirements, updates)
        if staged.metadata == current.metadata:
            return _response(current.metadata, current.metadata_location)
        self._write_metadata(staged.metadata, staged.io, staged.metadata_location)
        pointer = StagedPointer(
            kv.key,
            kv.mod_revision,
            record.model_copy(
                update={
                    "metadata_location": staged.metadata_location,
                    "previous_metadata_location": record.metadata_location,
                }
            ),
        )
        if self._staged is not None:
            self._staged.append(pointer)
        else:
            ops: Sequence[Op] = [pointer.put()]
            if not self._store.txn([pointer.compare()], ops).succeeded:
                raise CommitFailedException(f"table {collection} was updated by another commit")
        return _response(staged.metadata, staged.metadata_location)

    @override
    def list_tables(self, namespace: str | Identifier) -> list[Identifier]:
        self._check_namespace(namespace)
        prefix = tables_prefix(self._keys)
        return [self.identifier(kv.key[len(prefix) :]) for kv in self._store.get_prefix(prefix)]

    @override
    def register_table(
        self, identifier: str | Identifier, metadata_location: str, overwrite: bool = False
    ) -> Table:
        raise NotImplementedError("tables are created by Headrace, not registered")

    @override
    def drop_table(self, identifier: str | Identifier) -> None:
        raise NotImplementedError("dropping a collection is part of the pipeline (issue #12)")

    @override
    def rename_table(
        self, from_identifier: str | Identifier, to_identifier: str | Identifier
    ) -> Table:
        raise NotImplementedError("collections are not renamed")

    # -- namespaces: exactly one, the cluster -------------------------------

    @override
    def create_namespace(
        self, namespace: str | Identifier, properties: Properties = EMPTY_DICT
    ) -> None:
        self._check_namespace(namespace)
        raise NamespaceAlreadyExistsError(f"namespace {self._keys.cluster} always exists")

    @override
    def drop_namespace(self, namespace: str | Identifier) -> None:
        raise NotImplementedError("the cluster's namespace cannot be dropped")

    @override
    def list_namespaces(self, namespace: str | Identifier = ()) -> list[Identifier]:
        return [] if namespace else [(self._keys.cluster,)]

    @override
    def load_namespace_properties(self, namespace: str | Identifier) -> Properties:
        self._check_namespace(namespace)
        return {}

    @override
    def update_namespace_properties(
        self,
        namespace: str | Identifier,
        removals: set[str] | None = None,
        updates: Properties = EMPTY_DICT,
    ) -> PropertiesUpdateSummary:
        raise NotImplementedError("the cluster's namespace has no properties")

    # -- views: none --------------------------------------------------------

    @override
    def list_views(self, namespace: str | Identifier) -> list[Identifier]:
        return []

    @override
    def view_exists(self, identifier: str | Identifier) -> bool:
        return False

    @override
    def load_view(self, identifier: str | Identifier) -> View:
        raise NoSuchViewError(f"no views in a Headrace catalog: {identifier}")

    @override
    def register_view(self, identifier: str | Identifier, metadata_location: str) -> View:
        raise NotImplementedError("no views in a Headrace catalog")

    @override
    def drop_view(self, identifier: str | Identifier) -> None:
        raise NoSuchViewError(f"no views in a Headrace catalog: {identifier}")

    @override
    def create_view(
        self,
        identifier: str | Identifier,
        schema: Schema | pa.Schema,
        view_version: ViewVersion,
        location: str | None = None,
        properties: Properties = EMPTY_DICT,
    ) -> View:
        raise NotImplementedError("no views in a Headrace catalog")


def _response(metadata: TableMetadata, location: str) -> CommitTableResponse:
    return CommitTableResponse.model_validate({"metadata": metadata, "metadata-location": location})

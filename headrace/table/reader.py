"""The table side of a snapshot read (pyiceberg and pyarrow, no Spark).

* :func:`open_table`: a collection's table from its metadata file (the
  pointer a read found in the metastore), read-only;
* :func:`history`: the main branch's retained snapshots as
  :class:`~headrace.table.snapshots.SnapshotFacts`, oldest first, and how far
  expired history may reach;
* :class:`RowFilter`: the one filter form reads accept, an Iceberg row-filter
  string (``"price > 10 and name = 'x'"``, ``"pk in (1, 2)"``, ``"name is
  null"``), checked against the collection's schema; it is pushed into the
  table scan and evaluated on the WAL tail's rows as a pyarrow expression;
* :func:`scan_files`: the rows of one snapshot, data file by data file,
  newest first, in the collection's Arrow schema.

Storage failures are Headrace errors (:meth:`Warehouse.translate`); every
file read here is one committed metadata references, so a missing one is
:class:`headrace.errors.MissingFile` naming it and the snapshot, never the
caller's bad input.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
from collections.abc import Callable, Generator, Sequence
from functools import partial
from itertools import islice
from typing import TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import ValidationError
from pyiceberg.expressions import AlwaysTrue, BooleanExpression, parser
from pyiceberg.expressions.visitors import bind
from pyiceberg.io.pyarrow import ArrowScan, expression_to_pyarrow
from pyiceberg.schema import Schema, assign_fresh_schema_ids
from pyiceberg.table import FileScanTask, StaticTable, Table
from pyiceberg.table.snapshots import ancestors_of
from pyparsing import ParseBaseException

from headrace import errors
from headrace.table.maintenance import table_location
from headrace.table.snapshots import SnapshotFacts
from headrace.table.storage import ObjectStoreOptions, Referenced, Warehouse

T = TypeVar("T")

READ_AHEAD = 4
"""Data files a scan reads at once (threads; pyarrow releases the GIL): with
one at a time a 1,000,000-row read took 0.18-0.60 s in its file reads, with
four 0.13-0.30 s on the benchmark machine under load."""


def warehouse_of(metadata_location: str, object_store: ObjectStoreOptions) -> Warehouse:
    return Warehouse.parse(table_location(metadata_location), object_store)


def open_table(metadata_location: str, object_store: ObjectStoreOptions) -> Table:
    warehouse = warehouse_of(metadata_location, object_store)
    return storage(
        warehouse,
        f"reading {metadata_location}",
        lambda: StaticTable.from_metadata(metadata_location, warehouse.io_properties()),
        Referenced(metadata_location, "the table pointer"),
    )


def history(table: Table) -> tuple[list[SnapshotFacts], int]:
    """The main branch's snapshots, oldest first (the current one last), and
    the commit time (ms) of the oldest one when it has an expired parent (0
    when the history reaches the table's first snapshot)."""
    metadata = table.metadata
    chain = list(ancestors_of(table.current_snapshot(), metadata))
    chain.reverse()
    facts = [
        SnapshotFacts.of(s.snapshot_id, dict(s.summary.additional_properties) if s.summary else {})
        for s in chain
    ]
    expired_ms = chain[0].timestamp_ms if chain and chain[0].parent_snapshot_id else 0
    return facts, expired_ms


def iceberg_schema(arrow_schema: pa.Schema) -> Schema:
    """The collection's Iceberg schema (field ids numbered from 1, as the table's)."""
    return assign_fresh_schema_ids(Catalog._convert_schema_if_needed(arrow_schema))


@dataclasses.dataclass(frozen=True, slots=True)
class RowFilter:
    """A parsed, schema-checked Iceberg row filter."""

    text: str
    iceberg: BooleanExpression
    arrow: pc.Expression | None
    """None: every row (no filter)."""

    @classmethod
    def parse(cls, text: str | None, arrow_schema: pa.Schema) -> RowFilter:
        """INVALID_ARGUMENT naming the problem for a filter that does not parse
        or names a field the collection does not have or compares it with a
        value of another type."""
        if text is None or not text.strip():
            return cls("", AlwaysTrue(), None)
        if not isinstance(text, str):
            raise errors.InvalidArgument(
                f"filter must be an Iceberg row-filter string, got a {type(text).__name__}"
            )
        schema = iceberg_schema(arrow_schema)
        try:
            expression = parser.parse(text)
            bound = bind(schema, expression, case_sensitive=True)
            arrow = expression_to_pyarrow(bound, schema)
        except (ValueError, TypeError, ValidationError, ParseBaseException) as exc:
            fields = ", ".join(arrow_schema.names)
            problem = (
                f"does not parse at column {exc.col}"
                if isinstance(exc, ParseBaseException)
                else _first_line(exc)
            )
            raise errors.InvalidArgument(
                f"filter {text!r}: {problem} (an Iceberg row filter such as "
                f"\"pk > 10 and name = 'x'\"; fields: {fields})"
            ) from None
        return cls(text, expression, arrow)

    def apply(self, rows: pa.Table) -> pa.Table:
        return rows if self.arrow is None else rows.filter(self.arrow)


def scan_files(
    table: Table,
    *,
    snapshot_id: int,
    row_filter: RowFilter,
    fields: Sequence[str],
    arrow_schema: pa.Schema,
    object_store: ObjectStoreOptions,
) -> Generator[pa.Table, None, None]:
    """The snapshot's rows of ``fields`` matching the filter, in
    ``arrow_schema`` (the collection's, restricted to ``fields``), one data
    file at a time, the newest file (highest data sequence number) first;
    at most ``READ_AHEAD`` files are read ahead of the one given."""
    warehouse = warehouse_of(table.metadata_location, object_store)
    target = pa.schema([arrow_schema.field(name) for name in fields])
    scan = table.scan(
        row_filter=row_filter.iceberg, selected_fields=tuple(fields), snapshot_id=snapshot_id
    )
    snapshot = f"snapshot {snapshot_id} of {table.metadata_location}"
    # The manifests are read with their paths known first, so a missing one is named.
    order = _sequence_numbers(table, snapshot_id, warehouse)
    doing = f"planning a scan of {snapshot}"
    planned = storage(warehouse, doing, lambda: list(scan.plan_files()), Referenced("", snapshot))
    tasks = sorted(planned, key=lambda task: order.get(task.file.file_path, 0), reverse=True)
    reader = ArrowScan(table.metadata, table.io, scan.projection(), scan.row_filter)

    def read(task: FileScanTask) -> pa.Table:
        fetch = partial(reader.to_table, [task])
        path = task.file.file_path
        return storage(warehouse, f"reading {path}", fetch, Referenced(path, snapshot))

    # Files are read READ_AHEAD at a time in threads and given in order.
    remaining = iter(tasks)
    with concurrent.futures.ThreadPoolExecutor(READ_AHEAD, "headrace-scan") as pool:
        pending = collections.deque(pool.submit(read, t) for t in islice(remaining, READ_AHEAD))
        while pending:
            rows = pending.popleft().result()
            following = next(remaining, None)
            if following is not None:
                pending.append(pool.submit(read, following))
            if rows.num_rows:
                yield conform(rows, target)


def _sequence_numbers(table: Table, snapshot_id: int, warehouse: Warehouse) -> dict[str, int]:
    """Data file path -> its data sequence number (the commit that added it)."""
    snapshot = table.snapshot_by_id(snapshot_id)
    if snapshot is None:
        raise errors.NotFound(f"snapshot {snapshot_id} is not in {table.metadata_location}")
    name = f"snapshot {snapshot_id} of {table.metadata_location}"
    manifests = storage(
        warehouse,
        f"reading the manifest list of {name}",
        lambda: snapshot.manifests(table.io),
        Referenced(snapshot.manifest_list, name),
    )
    found: dict[str, int] = {}
    for manifest in manifests:
        entries = storage(
            warehouse,
            f"reading a manifest of {name}",
            partial(manifest.fetch_manifest_entry, table.io, discard_deleted=True),
            Referenced(manifest.manifest_path, name),
        )
        for entry in entries:
            found[entry.data_file.file_path] = entry.sequence_number or 0
    return found


def conform(rows: pa.Table, target: pa.Schema) -> pa.Table:
    """``rows`` read from Parquet in the collection's exact types (a string
    may come back large, a fixed-size list as a list)."""
    rows = rows.select(target.names)
    if rows.schema.equals(target):
        return rows
    columns = [rows.column(f.name).cast(f.type) for f in target]
    return pa.Table.from_arrays(columns, schema=target)


def storage(warehouse: Warehouse, doing: str, action: Callable[[], T], referenced: Referenced) -> T:
    """Run a storage action that reads a file committed metadata references;
    its OSError as a Headrace error (a missing file: MissingFile naming it)."""
    try:
        return action()
    except OSError as exc:
        raise warehouse.translate(exc, doing, referenced) from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]

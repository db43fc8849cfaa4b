"""A table's live data files, and the compaction's replace commit (I/O).

:func:`live_files` lists the data files of a table's current snapshot with
what a compaction planner needs (rows, bytes, when the file was added, its
smallest primary key).

:func:`replace_files` commits a compaction: ONE Iceberg ``overwrite`` snapshot
that removes the input files and adds the output files, conditioned on the
inputs being live in the snapshot it is built on. Like every commit it is one
swap of the table pointer compared on its ``mod_revision`` (the catalog's
optimistic commit), and pyiceberg adds the requirement that ``main`` is still
at the snapshot it was built on. When another commit moved the table (a
flush appending files), the inputs are checked again on the new snapshot and,
if every one is still live, the same output files are committed on it (no
rewrite); when an input is gone (a flush's delete rewrote it, another
compaction replaced it), nothing is committed and the result says so: the
caller re-reads and compacts again, or gives up. That is what keeps a
deleted row from coming back: a compaction never commits rows read from a
file that a later commit replaced.

The snapshot carries the parent's ``headrace.*`` properties (the WAL position
the rows reflect does not change) plus ``headrace.operation=compaction``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
from collections.abc import Mapping, Sequence

from pyiceberg.conversions import from_bytes
from pyiceberg.io.pyarrow import parquet_file_to_data_file
from pyiceberg.manifest import DataFile, DataFileContent
from pyiceberg.table import Table
from pyiceberg.types import PrimitiveType

from headrace import errors
from headrace.table.catalog import TableCatalog
from headrace.table.records import PrimaryKey
from headrace.table.storage import Referenced

log = logging.getLogger(__name__)

OPERATION = "headrace.operation"
"""Snapshot property: ``compaction`` on a compaction's snapshot."""


@dataclasses.dataclass(frozen=True, slots=True)
class LiveFile:
    """One data file of the current snapshot."""

    path: str
    rows: int
    bytes: int
    added_at_s: float
    """When the snapshot that added the file was committed (wall clock)."""
    lower_key: PrimaryKey | None
    """The smallest primary key as the manifest records it (None: not recorded)."""
    lower_key_exact: bool
    """False when the manifest may hold a truncated prefix (long string keys)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TableFiles:
    """A table's current snapshot and its live data files."""

    collection: str
    primary_key: str
    snapshot_id: int | None
    files: tuple[LiveFile, ...]


STRING_BOUND_CHARS = 16
"""pyiceberg truncates string bounds to 16 characters by default
(``write.metadata.metrics.default = truncate(16)``): a bound that long may be
a prefix of the real key."""


def live_files(catalog: TableCatalog, collection: str) -> TableFiles:
    """The live data files of ``collection``'s current snapshot."""
    table = catalog.iceberg_table(collection)
    return files_of(catalog, table, collection)


def files_of(catalog: TableCatalog, table: Table, collection: str) -> TableFiles:
    (primary_key,) = table.schema().identifier_field_names()
    field = table.schema().find_field(primary_key)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return TableFiles(collection, primary_key, None, ())
    added = {s.snapshot_id: s.timestamp_ms / 1000 for s in table.metadata.snapshots}

    def read() -> tuple[LiveFile, ...]:
        found: list[LiveFile] = []
        for manifest in snapshot.manifests(table.io):
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                data = entry.data_file
                if data.content != DataFileContent.DATA:
                    continue
                bound = (data.lower_bounds or {}).get(field.field_id)
                key = None if bound is None else _key(field.field_type, bound)
                exact = key is not None and (
                    not isinstance(key, str) or len(key) < STRING_BOUND_CHARS
                )
                found.append(
                    LiveFile(
                        path=data.file_path,
                        rows=data.record_count,
                        bytes=data.file_size_in_bytes,
                        added_at_s=added.get(entry.snapshot_id or 0, 0.0),
                        lower_key=key,
                        lower_key_exact=exact,
                    )
                )
        return tuple(found)

    current = Referenced("", f"snapshot {snapshot.snapshot_id} of {table.metadata_location}")
    files = catalog.storage(f"reading the manifests of {collection}", read, current)
    return TableFiles(collection, primary_key, snapshot.snapshot_id, files)


def _key(field_type: object, bound: bytes) -> PrimaryKey | None:
    if not isinstance(field_type, PrimitiveType):
        return None
    value = from_bytes(field_type, bound)
    return value if isinstance(value, int | str) else None


class ReplaceOutcome(enum.Enum):
    COMMITTED = "COMMITTED"
    INPUTS_CHANGED = "INPUTS_CHANGED"
    """An input is no longer live: nothing was committed; re-read and compact again."""


@dataclasses.dataclass(frozen=True, slots=True)
class Replaced:
    outcome: ReplaceOutcome
    snapshot_id: int | None
    """The compaction's snapshot (COMMITTED) or the snapshot that lacks an input."""
    attempts: int
    """Pointer races survived (1: the first try committed)."""
    reason: str = ""
    metadata_location: str = ""


def replace_files(
    catalog: TableCatalog,
    collection: str,
    inputs: Sequence[str],
    outputs: Sequence[str],
    properties: Mapping[str, str],
) -> Replaced:
    """Replace ``inputs`` by ``outputs`` in one snapshot, if every input is
    still live (see the module docstring). CONFLICT (retryable) when the
    pointer kept racing for ``commit_attempts`` tries."""
    if not inputs:
        raise errors.InvalidArgument("a compaction replaces at least one file")
    wanted = set(inputs)
    attempts = catalog.config.commit_attempts
    for attempt in range(1, attempts + 1):
        table = catalog.iceberg_table(collection)
        snapshot = table.current_snapshot()
        live = _live_data_files(catalog, table) if snapshot is not None else {}
        missing = sorted(wanted - live.keys())
        if missing:
            return Replaced(
                ReplaceOutcome.INPUTS_CHANGED,
                None if snapshot is None else snapshot.snapshot_id,
                attempt,
                f"{len(missing)} input file(s) are no longer live, e.g. {missing[0]}",
            )
        assert snapshot is not None
        summary = {
            k: v
            for k, v in (snapshot.summary.additional_properties if snapshot.summary else {}).items()
            if k.startswith("headrace.")
        }
        summary.update(properties)
        summary[OPERATION] = "compaction"
        added = [_data_file(catalog, table, path) for path in outputs]
        commit = functools.partial(
            _overwrite, table, [live[path] for path in inputs], added, summary
        )
        committed = catalog.commit(collection, commit)
        if committed is not None:
            after = committed.current_snapshot()
            return Replaced(
                ReplaceOutcome.COMMITTED,
                None if after is None else after.snapshot_id,
                attempt,
                metadata_location=committed.metadata_location,
            )
        log.info("%s: compaction commit %d raced; checking its inputs again", collection, attempt)
    raise errors.Conflict(
        f"the compaction of {collection} kept racing with other commits ({attempts} attempts); "
        "try again",
        retryable=True,
    )


def _overwrite(
    table: Table, removed: Sequence[DataFile], added: Sequence[DataFile], summary: dict[str, str]
) -> Table:
    """One overwrite snapshot on ``table``: pyiceberg requires ``main`` to be
    at its current snapshot and every removed file to be live in it."""
    txn = table.transaction()
    with txn.update_snapshot(snapshot_properties=summary).overwrite() as overwrite:
        for data_file in removed:
            overwrite.delete_data_file(data_file)
        for data_file in added:
            overwrite.append_data_file(data_file)
    return txn.commit_transaction()


def _live_data_files(catalog: TableCatalog, table: Table) -> dict[str, DataFile]:
    snapshot = table.current_snapshot()
    if snapshot is None:
        return {}

    def read() -> dict[str, DataFile]:
        return {
            entry.data_file.file_path: entry.data_file
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
            if entry.data_file.content == DataFileContent.DATA
        }

    current = Referenced("", f"snapshot {snapshot.snapshot_id} of {table.metadata_location}")
    return catalog.storage(f"reading the manifests of {table.name()}", read, current)


def _data_file(catalog: TableCatalog, table: Table, path: str) -> DataFile:
    def read() -> DataFile:
        return parquet_file_to_data_file(table.io, table.metadata, path)

    try:
        return catalog.storage(f"reading the footer of {path}", read)
    except (ValueError, TypeError) as exc:
        raise errors.InvalidArgument(
            f"compaction output {path} does not fit the table: {exc}"
        ) from None

"""Snapshot expiry and orphan file collection for a collection's table (I/O).

:func:`maintain` does, for one table:

1. **expire snapshots** (:func:`~headrace.table.expiry.snapshots_to_expire`
   decides, keeping every snapshot a reader pins, read afresh with the pin
   epoch for each plan): a ``RemoveSnapshotsUpdate`` committed through the
   catalog like any commit, one pointer swap compared on ``mod_revision``
   and on the pin epoch (:mod:`headrace.table.pins`), re-planned if a flush
   moved the pointer or a read pinned a snapshot meanwhile; it requires the
   main branch to be where the plan saw it, and moves no checkpoint;
2. **collect orphans** (:func:`~headrace.table.expiry.orphans` decides):
   list the files under ``<location>/data`` and ``<location>/metadata`` with
   the table's own pyarrow filesystem (local or S3) and delete those that no
   retained snapshot references (data files via the manifests, the manifests,
   the manifest lists) and no kept metadata file is (current, previous
   pointer, metadata log), once older than the grace period.

:func:`collect_dropped` deletes a dropped collection's whole location after
the grace period (its table record stays, so the name stays taken).

A storage failure is raised as a Headrace error (UNAVAILABLE for a store that
does not answer) after the deletions done so far; the next round retries.
Nothing here runs concurrently with a flush of the same table in the runner;
elsewhere the grace period (longer than a flush's deadline) keeps a running
flush's unreferenced files.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping

from pyarrow import fs as pafs
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table
from pyiceberg.table.refs import MAIN_BRANCH
from pyiceberg.table.update import AssertRefSnapshotId, RemoveSnapshotsUpdate

from headrace import errors
from headrace.table.catalog import MetadataChange, TableCatalog
from headrace.table.expiry import (
    Listed,
    OrphanPlan,
    RetentionOptions,
    SnapshotAge,
    dropped_files,
    orphans,
    snapshots_to_expire,
)
from headrace.table.storage import Referenced

log = logging.getLogger(__name__)

TABLE_DIRS = ("data", "metadata")


@dataclasses.dataclass(frozen=True, slots=True)
class MaintenanceReport:
    collection: str
    expired: tuple[int, ...]
    deleted: tuple[str, ...]
    too_young: int
    """Unreferenced files kept because they are inside the grace period."""


def maintain(
    catalog: TableCatalog,
    collection: str,
    options: RetentionOptions,
    pinned: frozenset[int] = frozenset(),
    now_s: float | None = None,
) -> MaintenanceReport:
    """Expire the table's old snapshots, then delete its orphan files.

    Every snapshot a reader pins (issue #15) is kept: the pins are read here,
    for each plan, and the expiry commits only if no pin was taken since.
    ``pinned``: more snapshot ids to keep whatever their age, on top of the
    readers' and the table's branch and tag heads.
    """
    now = time.time() if now_s is None else now_s
    planned: list[Expiry] = []

    def plan(table: Table) -> MetadataChange | None:
        pins = catalog.reader_pins_of(collection)
        expiry = plan_expiry(table, pinned | pins.snapshot_ids, now, options)
        planned[:] = [] if expiry is None else [expiry]
        if expiry is None:
            return None
        return dataclasses.replace(expiry.change, guards=(pins.unchanged(),))

    table = catalog.change_table(collection, plan)
    expired = planned[0].snapshot_ids if planned else frozenset()
    if expired:
        log.info("%s: expired %d snapshots", collection, len(expired))
    record = catalog.table_record(collection)
    referenced = _referenced(catalog, table, record.previous_metadata_location)
    listed = _list(catalog, table.location())
    decided = orphans(listed, referenced, now, options)
    deleted = _delete(catalog, table.location(), decided)
    return MaintenanceReport(collection, tuple(sorted(expired)), deleted, len(decided.too_young))


@dataclasses.dataclass(frozen=True, slots=True)
class Expiry:
    snapshot_ids: frozenset[int]
    change: MetadataChange
    """Remove those snapshots, if the main branch is still where it was."""


def plan_expiry(
    table: Table, pinned: frozenset[int], now_s: float, options: RetentionOptions
) -> Expiry | None:
    """The expiry of ``table``'s snapshots as of its metadata now; None: nothing to expire."""
    metadata = table.metadata
    refs = frozenset(ref.snapshot_id for ref in metadata.refs.values())
    decided = snapshots_to_expire(
        (SnapshotAge(s.snapshot_id, s.timestamp_ms / 1000) for s in metadata.snapshots),
        metadata.current_snapshot_id,
        pinned | refs,
        now_s,
        options,
    )
    if not decided.expire:
        return None
    requirement = AssertRefSnapshotId.model_validate(
        {"ref": MAIN_BRANCH, "snapshot-id": metadata.current_snapshot_id}
    )
    update = RemoveSnapshotsUpdate.model_validate({"snapshot-ids": sorted(decided.expire)})
    return Expiry(decided.expire, MetadataChange((requirement,), (update,)))


def collect_dropped(
    catalog: TableCatalog,
    collection: str,
    dropped_at_s: float,
    options: RetentionOptions,
    now_s: float | None = None,
) -> MaintenanceReport:
    """Delete a dropped collection's files once the drop is past the grace period."""
    now = time.time() if now_s is None else now_s
    location = table_location(catalog.table_record(collection).metadata_location)
    decided = dropped_files(_list(catalog, location), dropped_at_s, now, options)
    deleted = _delete(catalog, location, decided)
    return MaintenanceReport(collection, (), deleted, len(decided.too_young))


def table_location(metadata_location: str) -> str:
    """The table's location from its metadata file's (``<location>/metadata/<file>``),
    without reading it: a dropped table's metadata file may be collected already."""
    location, sep, _ = metadata_location.rpartition("/metadata/")
    if not sep:
        raise errors.CorruptData(f"metadata file {metadata_location!r} is not under metadata/")
    return location


def _referenced(catalog: TableCatalog, table: Table, previous: str) -> frozenset[str]:
    """Filesystem paths of every file the table's current metadata keeps."""
    metadata = table.metadata
    uris = {table.metadata_location, *(e.metadata_file for e in metadata.metadata_log)}
    if previous:
        uris.add(previous)

    def read() -> None:
        for snapshot in metadata.snapshots:
            uris.add(snapshot.manifest_list)
            for manifest in snapshot.manifests(table.io):
                uris.add(manifest.manifest_path)
                for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True):
                    uris.add(entry.data_file.file_path)

    retained = Referenced("", f"the retained snapshots of {table.metadata_location}")
    catalog.storage(f"reading the manifests of {table.name()}", read, retained)
    return frozenset(_fs_path(uri) for uri in uris)


def _list(catalog: TableCatalog, location: str) -> list[Listed]:
    filesystem, root = _filesystem(catalog, location)

    def listing() -> list[Listed]:
        found: list[Listed] = []
        for sub in TABLE_DIRS:
            selector = pafs.FileSelector(f"{root}/{sub}", recursive=True, allow_not_found=True)
            for info in filesystem.get_file_info(selector):
                if info.type == pafs.FileType.File:
                    mtime = None if info.mtime is None else info.mtime.timestamp()
                    found.append(Listed(info.path, mtime))
        return found

    return catalog.storage(f"listing {location}", listing)


def _delete(catalog: TableCatalog, location: str, decided: OrphanPlan) -> tuple[str, ...]:
    filesystem, _ = _filesystem(catalog, location)
    deleted: list[str] = []
    for path in decided.delete:
        try:
            filesystem.delete_file(path)
        except FileNotFoundError:
            pass  # gone already (another collector): the goal is reached
        except OSError as exc:
            if deleted:
                log.info("%s: deleted %d orphan files before failing", location, len(deleted))
            raise catalog.warehouse.translate(exc, f"deleting {path}") from None
        deleted.append(path)
    if deleted:
        log.info("%s: deleted %d orphan files", location, len(deleted))
    return tuple(deleted)


def _filesystem(catalog: TableCatalog, location: str) -> tuple[pafs.FileSystem, str]:
    scheme, netloc, path = PyArrowFileIO.parse_location(location)
    io = PyArrowFileIO(catalog.warehouse.io_properties())
    return io.fs_by_scheme(scheme, netloc), path.rstrip("/")


def _fs_path(uri: str) -> str:
    return PyArrowFileIO.parse_location(uri)[2]


@dataclasses.dataclass(frozen=True, slots=True)
class MaintenanceFailure:
    collection: str
    error: errors.HeadraceError


def maintain_all(
    catalog: TableCatalog, dropped: Mapping[str, float], options: RetentionOptions
) -> list[MaintenanceReport | MaintenanceFailure]:
    """:func:`maintain` every table (:func:`collect_dropped` for those in
    ``dropped``: collection -> when it was dropped); a table that fails does
    not stop the others, its failure is returned (retry it next round)."""
    results: list[MaintenanceReport | MaintenanceFailure] = []
    for collection in catalog.collections():
        try:
            if collection in dropped:
                report = collect_dropped(catalog, collection, dropped[collection], options)
            else:
                report = maintain(catalog, collection, options)
        except errors.HeadraceError as exc:
            results.append(MaintenanceFailure(collection, exc))
            continue
        results.append(report)
    return results

"""Snapshot expiry and orphan collection on a real warehouse (local and S3)
with the catalog: a killed flush's files go after the grace period, committed
ones stay; after copy-on-write deletes and expiry the replaced files go and
DuckDB still reads exactly the current rows; expiry races a flush safely."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pyarrow.fs as pafs
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from headrace import errors
from headrace.metastore.factory import open_metastore
from headrace.table import TableCatalog, maintenance
from headrace.table.catalog import MetadataChange
from headrace.table.expiry import Listed, RetentionOptions
from headrace.table.maintenance import (
    MaintenanceFailure,
    MaintenanceReport,
    collect_dropped,
    maintain,
    maintain_all,
    plan_expiry,
    table_location,
)
from headrace.table.pins import PinBasis, pin_ops
from headrace.table.records import table_key

from .conftest import SCHEMA, Bed, expected
from .test_commit import P, flush

LATER = 2 * 3600.0
"""Past the default one-hour grace period."""


def files(catalog: TableCatalog, sub: str = "data") -> set[str]:
    """Filesystem paths of the files under the table's ``sub`` directory."""
    location = table_location(catalog.table_record("orders").metadata_location)
    scheme, netloc, root = PyArrowFileIO.parse_location(location)
    filesystem = PyArrowFileIO(catalog.warehouse.io_properties()).fs_by_scheme(scheme, netloc)
    selector = pafs.FileSelector(f"{root}/{sub}", recursive=True, allow_not_found=True)
    return {i.path for i in filesystem.get_file_info(selector) if i.type == pafs.FileType.File}


def fs_path(uri: str) -> str:
    return PyArrowFileIO.parse_location(uri)[2]


def live_data_files(table: Table) -> set[str]:
    return {fs_path(task.file.file_path) for task in table.scan().plan_files()}


def test_a_killed_runs_files_are_deleted_after_the_grace_period(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        committed = catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        killed = fs_path(catalog.write_data_file("orders", SCHEMA.empty_table(), "flush-killed"))
        committed_files = live_data_files(catalog.iceberg_table("orders"))
        metadata_before = files(catalog, "metadata")
        assert killed in files(catalog) and killed not in committed_files

        soon = maintain(catalog, "orders", RetentionOptions())
        assert soon.deleted == () and soon.expired == ()
        assert soon.too_young >= 1 and killed in files(catalog)

        later = maintain(catalog, "orders", RetentionOptions(), now_s=time.time() + LATER)
        assert later.deleted == (killed,)
        assert files(catalog) == committed_files
        # Every metadata file of a kept version stays (nothing was staged and left).
        assert files(catalog, "metadata") == metadata_before
        location = catalog.table("orders").metadata_location
        assert location == committed.metadata_locations["orders"]
    assert bed.duckdb_rows(location) == expected([1, 2, 3])


class Killed(Exception):
    """The flush process died here."""


def test_staged_but_uncommitted_metadata_is_collected(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2]))
        before_data, before_metadata = files(catalog), files(catalog, "metadata")
        real_txn = catalog._store.txn

        def txn(*args: Any, **kwargs: Any) -> Any:
            if args[0]:  # the commit's transaction (it has compares): killed before it
                raise Killed
            return real_txn(*args, **kwargs)

        with monkeypatch.context() as patch:
            patch.setattr(catalog._store, "txn", txn)
            with pytest.raises(Killed):
                catalog.commit_flush(flush(catalog, 3, 10, 20, [5], segment_id=2, name="dead"))
        left = (files(catalog) | files(catalog, "metadata")) - before_data - before_metadata
        assert len(left) >= 3, "a data file, a metadata file, a manifest list, manifests"
        report = maintain(catalog, "orders", RetentionOptions(), now_s=time.time() + LATER)
        assert set(report.deleted) == left
        assert files(catalog) == before_data and files(catalog, "metadata") == before_metadata
        assert catalog.scan("orders").num_rows == 2
        # The killed flush's retry still commits once.
        catalog.commit_flush(flush(catalog, 3, 10, 20, [5], segment_id=2, name="retry"))
        assert sorted(r["pk"] for r in catalog.scan("orders").to_pylist()) == [1, 2, 5]


def test_after_deletes_and_expiry_replaced_files_go_and_readers_see_the_current_rows(
    bed: Bed,
) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3, 4, 5, 6]))
        first_files = live_data_files(catalog.iceberg_table("orders"))
        catalog.commit_flush(flush(catalog, 3, 10, 20, [7, 8], deletes=(2, 4), segment_id=2))
        catalog.commit_flush(flush(catalog, 3, 20, 30, [9], deletes=(7,), segment_id=3))
        checkpoint_before = bed.get(bed.keys.checkpoint(P))
        table = catalog.iceberg_table("orders")
        current = table.metadata.current_snapshot_id
        assert len(table.metadata.snapshots) >= 3
        live = live_data_files(table)
        assert not first_files & live, "the deletes rewrote the first file"

        # Snapshots younger than a day are kept: nothing of theirs goes.
        kept = maintain(catalog, "orders", RetentionOptions(), now_s=time.time() + LATER)
        assert kept.expired == () and kept.deleted == ()
        assert first_files <= files(catalog)

        options = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1)
        report = maintain(catalog, "orders", options, now_s=time.time() + LATER)
        assert len(report.expired) == len(table.metadata.snapshots) - 1
        after = catalog.iceberg_table("orders")
        assert [s.snapshot_id for s in after.metadata.snapshots] == [current]
        assert files(catalog) == live
        assert first_files & set(report.deleted) == first_files
        # Expiry is a table commit only: the channel checkpoint did not move.
        checkpoint_after = bed.get(bed.keys.checkpoint(P))
        assert checkpoint_before is not None and checkpoint_after is not None
        assert checkpoint_after.mod_revision == checkpoint_before.mod_revision
        # The current and previous metadata files are kept.
        record = catalog.table_record("orders")
        kept_metadata = files(catalog, "metadata")
        assert fs_path(record.metadata_location) in kept_metadata
        assert fs_path(record.previous_metadata_location) in kept_metadata
        location = record.metadata_location
        assert sorted(catalog.scan("orders").to_pylist(), key=lambda r: r["pk"]) == [
            {"pk": pk, "name": name, "score": score}
            for pk, name, score in expected([1, 3, 5, 6, 8, 9])
        ]
        # A second round has nothing left to do.
        again = maintain(catalog, "orders", options, now_s=time.time() + LATER)
        assert again.expired == () and again.deleted == ()
    assert bed.duckdb_rows(location) == expected([1, 3, 5, 6, 8, 9])


def test_expiry_racing_a_flush_is_planned_again_and_keeps_the_flush(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog, bed.open() as flusher:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2]))
        catalog.commit_flush(flush(catalog, 3, 10, 20, [3], segment_id=2))
        plans: list[int | None] = []

        def plan(table: Table) -> MetadataChange | None:
            plans.append(table.metadata.current_snapshot_id)
            if len(plans) == 1:  # a flush commits between our read and our swap
                flusher.commit_flush(flush(flusher, 3, 20, 30, [4], segment_id=3))
            # no grace either: the snapshots replaced just now expire too
            options = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0)
            expiry = plan_expiry(table, frozenset(), time.time(), options)
            assert expiry is not None
            return expiry.change

        after = catalog.change_table("orders", plan)
        assert len(plans) == 2 and plans[0] != plans[1]
        assert [s.snapshot_id for s in after.metadata.snapshots] == [plans[1]]
        assert sorted(r["pk"] for r in catalog.scan("orders").to_pylist()) == [1, 2, 3, 4]


def test_a_dropped_collections_files_go_after_the_grace_period(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2]))
        dropped_at = time.time()
        early = collect_dropped(catalog, "orders", dropped_at, RetentionOptions())
        assert early.deleted == () and files(catalog)
        later = collect_dropped(
            catalog, "orders", dropped_at, RetentionOptions(), now_s=dropped_at + LATER
        )
        assert later.deleted and files(catalog) == set() and files(catalog, "metadata") == set()
        assert catalog.table_record("orders").collection == "orders"
        again = collect_dropped(
            catalog, "orders", dropped_at, RetentionOptions(), now_s=dropped_at + LATER
        )
        assert again.deleted == ()


def test_maintain_all_reports_a_failing_table_and_goes_on(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.create_table("users", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1]))
        real = maintenance._list

        def listing(cat: TableCatalog, location: str) -> list[Listed]:
            if location.endswith("orders"):
                raise cat.warehouse.translate(ConnectionError("connection refused"), "listing")
            return real(cat, location)

        monkeypatch.setattr(maintenance, "_list", listing)
        results = maintain_all(catalog, {}, RetentionOptions())
        by_name = {r.collection: r for r in results}
        failure = by_name["orders"]
        assert isinstance(failure, MaintenanceFailure)
        assert isinstance(failure.error, errors.Unavailable)
        assert isinstance(by_name["users"], MaintenanceReport)


def test_a_pinned_snapshot_keeps_its_files(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        first = catalog.iceberg_table("orders")
        first_files = live_data_files(first)
        pinned = first.metadata.current_snapshot_id
        assert pinned is not None
        catalog.commit_flush(flush(catalog, 3, 10, 20, [4], deletes=(1,), segment_id=2))
        catalog.commit_flush(flush(catalog, 3, 20, 30, [5], deletes=(2,), segment_id=3))
        count = len(catalog.iceberg_table("orders").metadata.snapshots)
        options = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1)
        report = maintain(catalog, "orders", options, frozenset({pinned}), time.time() + LATER)
        table = catalog.iceberg_table("orders")
        ids = {s.snapshot_id for s in table.metadata.snapshots}
        assert ids == {pinned, table.metadata.current_snapshot_id}
        assert len(report.expired) == count - 2
        assert first_files <= files(catalog)
        old = table.scan(snapshot_id=pinned).to_arrow()
        assert sorted(old.column("pk").to_pylist()) == [1, 2, 3]


def pin_as_a_reader(bed: Bed, snapshot_id: int) -> int:
    """Pin ``snapshot_id`` of ``orders`` the way a snapshot read does (the
    table pointer's revision compared); the pin's lease."""

    async def take() -> int:
        async with await open_metastore(bed.config.metastore_url) as store:
            lease = await store.grant_lease(60)
            pointer = await store.get(table_key(bed.keys, "orders"))
            assert pointer is not None
            # No collection record here (the table alone): revision 0, absent.
            basis = PinBasis(table_revision=pointer.mod_revision, collection_revision=0)
            compares, puts = pin_ops(bed.keys, "orders", snapshot_id, lease, basis)
            assert (await store.txn(compares, puts)).succeeded
            return lease

    return asyncio.run(take())


@pytest.mark.parametrize("flush_meanwhile", [False, True], ids=["pin", "pin-and-flush"])
def test_a_pin_taken_after_the_round_read_the_pins_keeps_its_snapshot(
    bed: Bed, monkeypatch: pytest.MonkeyPatch, flush_meanwhile: bool
) -> None:
    """A round reads the pins (none), then a reader pins an old snapshot
    (and, in the variant, a flush commits) before the round's expiry
    commits: the snapshot and its files stay for the reader."""
    bed.assign(P, term=3)
    with bed.open() as catalog, bed.open() as flusher:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        first = catalog.iceberg_table("orders")
        first_files = live_data_files(first)
        old = first.metadata.current_snapshot_id
        assert old is not None
        catalog.commit_flush(flush(catalog, 3, 10, 20, [4], deletes=(1,), segment_id=2))
        real = maintenance.plan_expiry
        leases: list[int] = []

        def plan_expiry(
            table: Table, pinned: frozenset[int], now_s: float, options: RetentionOptions
        ) -> maintenance.Expiry | None:
            if not leases:
                leases.append(pin_as_a_reader(bed, old))
                if flush_meanwhile:
                    flusher.commit_flush(flush(flusher, 3, 20, 30, [5], segment_id=3))
            return real(table, pinned, now_s, options)

        monkeypatch.setattr(maintenance, "plan_expiry", plan_expiry)
        options = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0)
        pins = catalog.reader_pins().get("orders", frozenset())
        report = maintain(catalog, "orders", options, pins, time.time() + LATER)
        assert leases, "the round never planned"
        assert old not in report.expired
        assert first_files <= files(catalog), "a pinned snapshot's file was deleted"
        table = catalog.iceberg_table("orders")
        assert old in {s.snapshot_id for s in table.metadata.snapshots}
        rows_then = table.scan(snapshot_id=old).to_arrow()
        assert sorted(rows_then.column("pk").to_pylist()) == [1, 2, 3]

"""A snapshot scan that meets a missing file: the snapshot was expired and its
files collected after the table was opened, or a file was deleted from the
store by hand. Neither is the caller's bad input: the error says which file
of which snapshot is gone (DATA_LOSS on the wire), never INVALID_ARGUMENT."""

from __future__ import annotations

import time

import grpc
import pyarrow as pa
import pytest
from pyiceberg.io.pyarrow import PyArrowFileIO
from pyiceberg.table import Table

from headrace import errors
from headrace.node.errors import STATUS_OF_CODE
from headrace.table import TableCatalog
from headrace.table.expiry import RetentionOptions
from headrace.table.maintenance import maintain
from headrace.table.reader import RowFilter, open_table, scan_files

from .conftest import SCHEMA, Bed
from .test_commit import P, flush

EVERYTHING_GOES = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0)


def scan(catalog: TableCatalog, table: Table, snapshot_id: int) -> pa.Table:
    parts = scan_files(
        table,
        snapshot_id=snapshot_id,
        row_filter=RowFilter.parse(None, SCHEMA),
        fields=SCHEMA.names,
        arrow_schema=SCHEMA,
        object_store=catalog.config.object_store,
    )
    return pa.concat_tables(list(parts))


def data_files(table: Table, snapshot_id: int) -> list[str]:
    return [t.file.file_path for t in table.scan(snapshot_id=snapshot_id).plan_files()]


def delete(catalog: TableCatalog, uri: str) -> None:
    scheme, netloc, path = PyArrowFileIO.parse_location(uri)
    io = PyArrowFileIO(catalog.warehouse.io_properties())
    io.fs_by_scheme(scheme, netloc).delete_file(path)


def assert_names_the_loss(raised: errors.HeadraceError, uri: str, snapshot_id: int) -> None:
    assert isinstance(raised, errors.MissingFile), raised
    assert not isinstance(raised, errors.InvalidArgument)
    assert STATUS_OF_CODE[raised.code] is grpc.StatusCode.DATA_LOSS
    assert raised.path == uri
    assert uri in raised.message and f"snapshot {snapshot_id}" in raised.message
    assert not raised.retryable


def test_a_data_file_deleted_by_hand_is_named_with_its_snapshot(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        catalog.commit_flush(flush(catalog, 3, 10, 20, [4, 5], segment_id=2))
        table = catalog.iceberg_table("orders")
        current = table.metadata.current_snapshot_id
        assert current is not None
        assert scan(catalog, table, current).num_rows == 5
        gone = data_files(table, current)[0]
        delete(catalog, gone)
        with pytest.raises(errors.HeadraceError) as raised:
            scan(catalog, table, current)
        assert_names_the_loss(raised.value, gone, current)
        assert "deleted" in raised.value.message


def test_a_snapshot_expired_after_the_table_was_opened_names_the_collected_file(
    bed: Bed,
) -> None:
    """An unpinned reader opened the table at its first snapshot; a delete
    rewrote that snapshot's only file, then expiry dropped the snapshot and
    collected the file: the scan says the snapshot's file is gone and that
    expiry is a cause (a pinned read never meets this)."""
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        opened = catalog.iceberg_table("orders")
        old = opened.metadata.current_snapshot_id
        assert old is not None
        (old_file,) = data_files(opened, old)
        assert scan(catalog, opened, old).num_rows == 3
        catalog.commit_flush(flush(catalog, 3, 10, 20, [4], deletes=(1,), segment_id=2))
        report = maintain(catalog, "orders", EVERYTHING_GOES, now_s=time.time() + 60)
        assert old in report.expired
        assert any(old_file.endswith(path) for path in report.deleted)
        old_snapshot = opened.snapshot_by_id(old)
        assert old_snapshot is not None
        with pytest.raises(errors.HeadraceError) as raised:
            scan(catalog, opened, old)
        # Its manifest list went with it: the first file the scan needs.
        assert_names_the_loss(raised.value, old_snapshot.manifest_list, old)
        assert "expiry" in raised.value.message


def test_a_missing_manifest_and_a_missing_metadata_file_are_named_too(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        table = catalog.iceberg_table("orders")
        snapshot = table.current_snapshot()
        assert snapshot is not None
        (manifest,) = snapshot.manifests(table.io)
        delete(catalog, manifest.manifest_path)
        with pytest.raises(errors.HeadraceError) as raised:
            scan(catalog, table, snapshot.snapshot_id)
        assert_names_the_loss(raised.value, manifest.manifest_path, snapshot.snapshot_id)

        location = catalog.table_record("orders").metadata_location
        delete(catalog, location)
        with pytest.raises(errors.MissingFile) as missing:
            open_table(location, catalog.config.object_store)
        assert missing.value.path == location
        assert missing.value.message.startswith(f"the table pointer needs {location}")


def test_maintenance_and_the_catalogs_scan_name_a_missing_file_too(bed: Bed) -> None:
    """Expiry's reading of the retained manifests and ``TableCatalog.scan``
    meet the same fault: MissingFile, never INVALID_ARGUMENT (which stays for
    a file a flush commit names, tests/table/test_errors.py)."""
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        table = catalog.iceberg_table("orders")
        snapshot = table.current_snapshot()
        assert snapshot is not None
        (manifest,) = snapshot.manifests(table.io)
        delete(catalog, manifest.manifest_path)
        with pytest.raises(errors.HeadraceError) as in_maintenance:
            maintain(catalog, "orders", EVERYTHING_GOES)
        with pytest.raises(errors.HeadraceError) as in_scan:
            catalog.scan("orders")
    for raised in (in_maintenance.value, in_scan.value):
        assert isinstance(raised, errors.MissingFile), raised
        assert STATUS_OF_CODE[raised.code] is grpc.StatusCode.DATA_LOSS
        assert table.metadata_location in raised.message

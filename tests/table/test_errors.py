"""Bad input and faults of the table catalog: each gets a clear error and
changes nothing."""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow as pa
import pytest

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace import errors
from headrace.cluster import Assignment, AssignmentState
from headrace.table import (
    CatalogConfig,
    Checkpoint,
    CheckpointRecord,
    FlushCommit,
    ObjectStoreOptions,
    SegmentRecord,
    TableCatalog,
    TableChanges,
    WalRange,
)
from headrace.table.decide import AlreadyCommitted, Proceed, Refused, decide
from headrace_testbed.ports import free_port
from headrace_testbed.seaweedfs import start_seaweedfs

from .conftest import Bed
from .data import SCHEMA, rows

P = "pchannel-000"


@pytest.fixture
def local_bed(tmp_path: Path) -> Bed:
    return Bed(CatalogConfig(f"sqlite:///{tmp_path / 'meta.db'}", str(tmp_path / "wh")), None)


def commit_of(*tables: TableChanges, start: str = "", end: str = "local:10") -> FlushCommit:
    return FlushCommit(P, 3, WalRange(start, end), Checkpoint(end), tables)


# -- tables and schemas ---------------------------------------------------------


def test_create_table_is_idempotent_and_refuses_another_schema(local_bed: Bed) -> None:
    with local_bed.open() as catalog:
        first = catalog.create_table("orders", SCHEMA, "pk")
        again = catalog.create_table("orders", SCHEMA, "pk")
        assert again.metadata_location == first.metadata_location
        assert catalog.collections() == ["orders"]
        other = SCHEMA.append(pa.field("extra", pa.int32()))
        with pytest.raises(errors.Conflict, match="exists with primary key"):
            catalog.create_table("orders", other, "pk")
        assert catalog.table("orders").metadata_location == first.metadata_location


@pytest.mark.parametrize(
    ("field", "message"),
    [
        (pa.field("pk", pa.int64(), nullable=True), "non-nullable"),
        (pa.field("pk", pa.float64(), nullable=False), "int64 or string"),
        (pa.field("id", pa.int64(), nullable=False), "not a field"),
    ],
)
def test_bad_primary_key_is_refused(local_bed: Bed, field: pa.Field, message: str) -> None:
    schema = pa.schema([field, pa.field("name", pa.string())])
    with local_bed.open() as catalog:
        with pytest.raises(errors.InvalidArgument, match=message):
            catalog.create_table("orders", schema, "pk")
        assert catalog.collections() == []


def test_string_primary_keys_and_their_deletes(local_bed: Bed) -> None:
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("v", pa.int64())])
    local_bed.assign(P, term=3)
    with local_bed.open() as catalog:
        catalog.create_table("docs", schema, "id")
        data = pa.table({"id": ["a", "b", "c"], "v": [1, 2, 3]}, schema=schema)
        path = catalog.write_data_file("docs", data, "f1")
        catalog.commit_flush(commit_of(TableChanges("docs", (path,))))
        result = catalog.commit_flush(
            commit_of(TableChanges("docs", deletes=("b",)), start="local:10", end="local:20")
        )
    assert local_bed.duckdb_rows(result.metadata_locations["docs"]) == [("a", 1), ("c", 3)]


def test_unknown_collection_is_not_found(local_bed: Bed) -> None:
    local_bed.assign(P, term=3)
    with local_bed.open() as catalog:
        with pytest.raises(errors.NotFound, match="nosuch"):
            catalog.table("nosuch")
        with pytest.raises(errors.NotFound, match="nosuch"):
            catalog.commit_flush(commit_of(TableChanges("nosuch", deletes=(1,))))
    assert local_bed.get(local_bed.keys.checkpoint(P)) is None


def test_rows_of_another_schema_are_refused(local_bed: Bed) -> None:
    with local_bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        wrong = pa.table({"pk": pa.array([1], pa.int64()), "name": ["x"]})
        with pytest.raises(errors.InvalidArgument, match="do not match its schema"):
            catalog.write_data_file("orders", wrong, "f1")


def test_missing_data_file_or_wrong_delete_type_changes_nothing(local_bed: Bed) -> None:
    local_bed.assign(P, term=3)
    with local_bed.open() as catalog:
        info = catalog.create_table("orders", SCHEMA, "pk")
        missing = f"{info.metadata_location.rsplit('/metadata/', 1)[0]}/data/missing.parquet"
        with pytest.raises(errors.InvalidArgument, match=r"missing\.parquet"):
            catalog.commit_flush(commit_of(TableChanges("orders", (missing,))))
        with pytest.raises(errors.InvalidArgument, match="orders"):
            catalog.commit_flush(commit_of(TableChanges("orders", deletes=("not-an-int",))))
        assert catalog.table("orders").metadata_location == info.metadata_location
    assert local_bed.get(local_bed.keys.checkpoint(P)) is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: FlushCommit(P, 0, WalRange("", "local:5"), Checkpoint("local:5"), ()), "term"),
        (lambda: WalRange("local:9", "local:5"), "before it starts"),
        (lambda: FlushCommit(P, 1, WalRange("", "local:5"), Checkpoint("local:6"), ()), "outside"),
        (
            lambda: FlushCommit(P, 1, WalRange("local:5", "local:9"), Checkpoint("local:5"), ()),
            "outside",
        ),
        (lambda: WalRange("", "kafka5"), "malformed message id"),
        (
            lambda: commit_of(
                TableChanges(
                    "a",
                    segments=(
                        SegmentRecord(segment_id=1, vchannel="v", start="local:0", end="local:1"),
                    ),
                ),
                TableChanges(
                    "b",
                    segments=(
                        SegmentRecord(segment_id=1, vchannel="w", start="local:0", end="local:1"),
                    ),
                ),
            ),
            "segment id appears twice",
        ),
        (
            lambda: commit_of(
                TableChanges(
                    "a",
                    segments=tuple(
                        SegmentRecord(segment_id=i, vchannel="v", start="local:0", end="local:1")
                        for i in range(120)
                    ),
                ),
            ),
            "at most 120 together",
        ),
    ],
)
def test_malformed_flushes_are_refused(build: object, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        build()  # type: ignore[operator]


# -- the decision -----------------------------------------------------------------


def test_decide_says_already_committed_even_after_the_term_moved() -> None:
    commit = commit_of(TableChanges("orders"))
    written = CheckpointRecord(pchannel=P, position="local:10", term=3, flush_end="local:10")
    moved = Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=9, node="n9")
    assert decide(commit, moved, written) == AlreadyCommitted(written)
    refused = decide(commit, moved, None)
    assert isinstance(refused, Refused) and isinstance(refused.error, errors.Fenced)
    owner = Assignment(pchannel=P, state=AssignmentState.ASSIGNING, term=3, node="n3")
    assert decide(commit, owner, None) == Proceed("n3")
    assert isinstance(decide(commit, None, None), Refused)


@pytest.mark.parametrize(
    ("position", "start", "end", "message"),
    [
        (None, "local:5", "local:10", "no checkpoint yet"),
        ("local:12", "", "local:10", "already covers this flush's range"),
        ("local:7", "local:5", "local:10", "another flush committed first"),
    ],
)
def test_decide_explains_a_moved_checkpoint(
    position: str | None, start: str, end: str, message: str
) -> None:
    commit = FlushCommit(P, 3, WalRange(start, end), Checkpoint(end), ())
    owner = Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=3, node="n3")
    checkpoint = (
        None
        if position is None
        else CheckpointRecord(pchannel=P, position=position, term=3, flush_end=position)
    )
    refused = decide(commit, owner, checkpoint)
    assert isinstance(refused, Refused) and isinstance(refused.error, errors.Conflict)
    assert message in str(refused.error)


# -- an object store that does not answer -----------------------------------------


def test_unreachable_object_store_is_a_clear_retryable_error(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    options = ObjectStoreOptions(
        endpoint=endpoint,
        access_key="k",
        secret_key="s",
        connect_timeout_s=1.0,
        request_timeout_s=2.0,
    )
    config = CatalogConfig(
        f"sqlite:///{tmp_path / 'meta.db'}", "s3://bucket/wh", object_store=options
    )
    started = time.monotonic()
    with TableCatalog.open(config) as catalog:
        with pytest.raises(errors.Unavailable) as caught:
            catalog.create_table("orders", SCHEMA, "pk")
        assert caught.value.retryable
        assert endpoint in str(caught.value)
        assert catalog.collections() == []
    assert time.monotonic() - started < 120


@pytest.mark.s3
def test_object_store_lost_before_the_commit_leaves_the_checkpoint(tmp_path: Path) -> None:
    """The store goes away after the data files are written: the commit fails
    with UNAVAILABLE and moves nothing; once the store is back, the same flush
    commits its rows once."""
    server = start_seaweedfs(tmp_path / "weed")
    with server:
        options = ObjectStoreOptions(
            endpoint=server.endpoint,
            access_key=server.credentials.access_key,
            secret_key=server.credentials.secret_key,
            connect_timeout_s=1.0,
            request_timeout_s=3.0,
        )
        bed = Bed(
            CatalogConfig(
                f"sqlite:///{tmp_path / 'meta.db'}",
                f"s3://{server.bucket}/wh",
                object_store=options,
            ),
            None,
        )
        bed.assign(P, term=3)
        with bed.open() as catalog:
            catalog.create_table("orders", SCHEMA, "pk")
            path = catalog.write_data_file("orders", rows([1, 2]), "f1")
            server.stop()
            with pytest.raises(errors.Unavailable, match=server.endpoint) as caught:
                catalog.commit_flush(commit_of(TableChanges("orders", (path,))))
            assert caught.value.retryable
            assert bed.get(bed.keys.checkpoint(P)) is None


def test_a_closed_catalog_says_so(local_bed: Bed) -> None:
    catalog = local_bed.open()
    catalog.close()
    with pytest.raises(errors.Closed):
        catalog.collections()


def test_unreachable_metastore_is_unavailable(tmp_path: Path) -> None:
    config = CatalogConfig(f"etcd://127.0.0.1:{free_port()}", str(tmp_path / "wh"))
    with pytest.raises(errors.Unavailable):
        TableCatalog.open(config)

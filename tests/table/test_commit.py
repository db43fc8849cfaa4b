"""Flush commits on every metastore x warehouse: DuckDB reads exactly the
committed rows; a stale term, a concurrent flush and a retried flush neither
lose nor duplicate anything."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from pyiceberg.manifest import ManifestContent
from pyiceberg.table import StaticTable

from headrace import errors
from headrace.cluster import AssignmentState
from headrace.coordinator.checkpoint import RecoveryPoint, load_recovery
from headrace.metastore.factory import open_metastore
from headrace.table import (
    CatalogConfig,
    Checkpoint,
    CheckpointRecord,
    FlushCommit,
    Outcome,
    SegmentRecord,
    TableCatalog,
    TableChanges,
    WalRange,
)
from headrace.table.records import MAX_KEYS_PER_COMMIT, table_key
from headrace.table.storage import Warehouse

from .conftest import SCHEMA, Bed, expected, rows

P = "pchannel-000"


def segment(segment_id: int, start: int, end: int, count: int) -> SegmentRecord:
    return SegmentRecord(
        segment_id=segment_id,
        vchannel="orders-0",
        start=f"local:{start}",
        end=f"local:{end}",
        rows=count,
    )


def flush(
    catalog: TableCatalog,
    term: int,
    start: int | None,
    end: int,
    pks: list[int],
    *,
    deletes: tuple[int, ...] = (),
    segment_id: int = 1,
    name: str = "",
) -> FlushCommit:
    """Write ``pks`` as one data file of a flush of (start, end] and describe its commit."""
    path = catalog.write_data_file("orders", rows(pks), name or f"flush-{P}-t{term}-s{segment_id}")
    return FlushCommit(
        pchannel=P,
        launch_term=term,
        wal_range=WalRange("" if start is None else f"local:{start}", f"local:{end}"),
        checkpoint=Checkpoint(f"local:{end}", timetick=end * 10),
        tables=(
            TableChanges(
                "orders", (path,), deletes, (segment(segment_id, start or 0, end, len(pks)),)
            ),
        ),
    )


def test_two_flushes_one_with_deletes_read_by_duckdb(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        first = catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3, 4, 5, 6]))
        assert first.outcome is Outcome.COMMITTED
        assert bed.duckdb_rows(first.metadata_locations["orders"]) == expected([1, 2, 3, 4, 5, 6])
        second = catalog.commit_flush(
            flush(catalog, 3, 10, 20, [7, 8, 9], deletes=(2, 4, 99), segment_id=2)
        )
        location = second.metadata_locations["orders"]
        assert catalog.table("orders").metadata_location == location
    assert bed.duckdb_rows(location) == expected([1, 3, 5, 6, 7, 8, 9])

    # The checkpoint and WAL range ride in the snapshot summary.
    table = StaticTable.from_metadata(location, properties=_io_props(bed))
    snapshot = table.current_snapshot()
    assert snapshot is not None and snapshot.summary is not None
    summary = snapshot.summary.additional_properties
    assert summary["headrace.wal-start"] == "local:10"
    assert summary["headrace.wal-end"] == "local:20"
    assert summary["headrace.checkpoint"] == "local:20"
    assert summary["headrace.term"] == "3"
    # Deletes were applied by rewriting data files: no delete files anywhere.
    contents = {m.content for m in snapshot.manifests(table.io)}
    assert contents == {ManifestContent.DATA}

    # The records are the ones the coordinator's recovery reads.
    checkpoint_kv = bed.get(bed.keys.checkpoint(P))
    assert checkpoint_kv is not None
    checkpoint = CheckpointRecord.model_validate_json(checkpoint_kv.value)
    assert (checkpoint.position, checkpoint.term, checkpoint.node) == ("local:20", 3, "node-1")
    recovery = _recovery(bed)
    assert [(s.segment_id, s.end, s.term) for s in recovery.segments] == [
        (1, "local:10", 3),
        (2, "local:20", 3),
    ]


def test_stale_term_is_fenced_and_changes_nothing(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        committed = catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2]))
        stale = flush(catalog, 3, 10, 20, [3, 4], deletes=(1,), segment_id=2)
        bed.assign(P, term=4, node="node-2")
        pointer = bed.get(table_key(bed.keys, "orders"))
        checkpoint = bed.get(bed.keys.checkpoint(P))
        with pytest.raises(errors.Fenced) as caught:
            catalog.commit_flush(stale)
        assert "term 3" in str(caught.value) and "term 4" in str(caught.value)
        assert (caught.value.term, caught.value.current_term) == (3, 4)
        assert bed.get(table_key(bed.keys, "orders")) == pointer
        assert bed.get(bed.keys.checkpoint(P)) == checkpoint
        assert len(bed.get_prefix(f"{bed.keys.root}/segments/")) == 1
        location = catalog.table("orders").metadata_location
        assert location == committed.metadata_locations["orders"]
    assert bed.duckdb_rows(location) == expected([1, 2])


def test_unassigning_owner_may_still_commit_but_unassigned_may_not(bed: Bed) -> None:
    bed.assign(P, term=3, state=AssignmentState.UNASSIGNING)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        assert catalog.commit_flush(flush(catalog, 3, None, 10, [1])).outcome is Outcome.COMMITTED
        bed.assign(P, term=3, state=AssignmentState.UNASSIGNED)
        with pytest.raises(errors.Fenced, match="UNASSIGNED"):
            catalog.commit_flush(flush(catalog, 3, 10, 20, [2], segment_id=2))


def test_second_flush_of_the_same_range_conflicts(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as first, bed.open() as second:
        first.create_table("orders", SCHEMA, "pk")
        ours = flush(first, 3, None, 10, [1, 2], name="a")
        theirs = flush(second, 3, None, 12, [1, 2, 3], segment_id=2, name="b")
        first.commit_flush(ours)
        with pytest.raises(errors.Conflict, match="another flush committed first") as caught:
            second.commit_flush(theirs)
        assert not caught.value.retryable
        location = first.table("orders").metadata_location
    assert bed.duckdb_rows(location) == expected([1, 2])


def test_racing_flushes_of_one_range_commit_exactly_once(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as one, bed.open() as two:
        one.create_table("orders", SCHEMA, "pk")
        commits = [
            flush(one, 3, None, 10, [1, 2], name="one"),
            flush(two, 3, None, 11, [1, 2, 3], segment_id=2, name="two"),
        ]
        outcomes: list[object] = [None, None]
        barrier = threading.Barrier(2)

        def run(index: int, catalog: TableCatalog) -> None:
            barrier.wait()
            try:
                outcomes[index] = catalog.commit_flush(commits[index]).outcome
            except errors.HeadraceError as exc:
                outcomes[index] = exc

        threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate((one, two))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        winners = [i for i, outcome in enumerate(outcomes) if outcome is Outcome.COMMITTED]
        assert len(winners) == 1, outcomes
        assert isinstance(outcomes[1 - winners[0]], errors.Conflict), outcomes
        location = one.table("orders").metadata_location
    assert bed.duckdb_rows(location) == expected([1, 2] if winners == [0] else [1, 2, 3])


def test_table_pointer_race_with_another_pchannel_is_retried(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two pchannels flush into one table; the one that loses the pointer race
    stages again on the new metadata and both flushes' rows are there."""
    other = "pchannel-001"
    bed.assign(P, term=3)
    bed.assign(other, term=7, node="node-2")
    with bed.open() as ours, bed.open() as theirs:
        ours.create_table("orders", SCHEMA, "pk")
        mine = flush(ours, 3, None, 10, [1, 2])
        path = theirs.write_data_file("orders", rows([100, 101]), "other-flush")
        their_commit = FlushCommit(
            other,
            7,
            WalRange("", "local:5"),
            Checkpoint("local:5"),
            (TableChanges("orders", (path,), (), ()),),
        )
        _before_the_commit_txn(monkeypatch, ours, lambda: _commit(theirs, their_commit))
        result = ours.commit_flush(mine)
        assert result.outcome is Outcome.COMMITTED
        assert result.attempts == 2
    assert bed.duckdb_rows(result.metadata_locations["orders"]) == expected([1, 2, 100, 101])


def _recovery(bed: Bed) -> RecoveryPoint:
    async def load() -> RecoveryPoint:
        async with await open_metastore(bed.config.metastore_url) as store:
            return await load_recovery(store, bed.config.cluster, P)

    return asyncio.run(load())


def _io_props(bed: Bed) -> dict[str, str]:
    return Warehouse.parse(bed.config.warehouse, bed.config.object_store).io_properties()


def _before_the_commit_txn(
    monkeypatch: pytest.MonkeyPatch, catalog: TableCatalog, action: Callable[[], None]
) -> None:
    """Run ``action`` once, right before ``catalog``'s commit transaction."""
    store = catalog._store
    real_txn = store.txn
    done: list[bool] = []

    def txn(*args: object, **kwargs: object) -> object:
        if not done and args[0]:  # the commit's transaction (it has compares)
            done.append(True)
            action()
        return real_txn(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(store, "txn", txn)


def test_term_moving_after_the_check_still_fences_the_transaction(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The term is compared inside the transaction, not only before staging."""
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        before = catalog.table("orders").metadata_location
        commit = flush(catalog, 3, None, 10, [1, 2])
        _before_the_commit_txn(monkeypatch, catalog, lambda: bed.assign(P, term=4, node="n2"))
        with pytest.raises(errors.Fenced, match="term 4"):
            catalog.commit_flush(commit)
        assert catalog.table("orders").metadata_location == before
    assert bed.get(bed.keys.checkpoint(P)) is None
    assert bed.get_prefix(f"{bed.keys.root}/segments/") == []
    assert bed.duckdb_rows(before) == []


def test_checkpoint_moving_after_the_check_conflicts_in_the_transaction(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog, bed.open() as rival:
        catalog.create_table("orders", SCHEMA, "pk")
        ours = flush(catalog, 3, None, 10, [1, 2], name="ours")
        # A rival flush that only records a segment: no table pointer moves, so
        # only the checkpoint's compare can stop ours.
        theirs = FlushCommit(
            P,
            3,
            WalRange("", "local:8"),
            Checkpoint("local:8"),
            (TableChanges("orders", segments=(segment(2, 0, 8, 0),)),),
        )
        _before_the_commit_txn(monkeypatch, catalog, lambda: _commit(rival, theirs))
        with pytest.raises(errors.Conflict, match="local:8"):
            catalog.commit_flush(ours)
        location = catalog.table("orders").metadata_location
    assert bed.duckdb_rows(location) == []
    checkpoint = bed.get(bed.keys.checkpoint(P))
    assert checkpoint is not None and b'"position":"local:8"' in checkpoint.value


def _commit(catalog: TableCatalog, commit: FlushCommit) -> None:
    catalog.commit_flush(commit)


def test_a_segment_recorded_by_an_earlier_flush_is_refused(bed: Bed) -> None:
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1], segment_id=7))
        again = flush(catalog, 3, 10, 20, [2], segment_id=7, name="again")
        with pytest.raises(errors.Conflict, match=r"segments \[7\] are already recorded"):
            catalog.commit_flush(again)
        location = catalog.table("orders").metadata_location
    assert bed.duckdb_rows(location) == expected([1])


def test_a_same_term_state_change_is_retried_without_staging_again(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ASSIGNED -> UNASSIGNING under the same term moves the Assignment's
    revision: the transaction is tried again with the metadata already staged
    (a delete's rewrite is not done twice)."""
    bed.assign(P, term=3)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
        commit = flush(catalog, 3, 10, 20, [4], deletes=(2,), segment_id=2)
        stagings: list[int] = []
        real_stage = catalog._stage

        def counting_stage(c: FlushCommit) -> object:
            stagings.append(1)
            return real_stage(c)

        monkeypatch.setattr(catalog, "_stage", counting_stage)
        _before_the_commit_txn(
            monkeypatch,
            catalog,
            lambda: bed.assign(P, term=3, state=AssignmentState.UNASSIGNING),
        )
        result = catalog.commit_flush(commit)
        assert (result.outcome, result.attempts, len(stagings)) == (Outcome.COMMITTED, 2, 1)
    assert bed.duckdb_rows(result.metadata_locations["orders"]) == expected([1, 3, 4])


def test_the_largest_commit_fits_one_transaction(metastore_url: str, tmp_path: Path) -> None:
    """119 segments and one table: etcd's default --max-txn-ops (128) holds it."""
    cluster = f"t{uuid.uuid4().hex[:8]}"
    bed = Bed(CatalogConfig(metastore_url, str(tmp_path / "wh"), cluster=cluster), None)
    bed.assign(P, term=3)
    segments = tuple(segment(i, i, i + 1, 1) for i in range(MAX_KEYS_PER_COMMIT - 1))
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        path = catalog.write_data_file("orders", rows([1]), "f")
        result = catalog.commit_flush(
            FlushCommit(
                P,
                3,
                WalRange("", "local:200"),
                Checkpoint("local:200"),
                (TableChanges("orders", (path,), (), segments),),
            )
        )
        assert result.outcome is Outcome.COMMITTED
    assert len(bed.get_prefix(f"{bed.keys.root}/segments/")) == MAX_KEYS_PER_COMMIT - 1


def test_a_cluster_named_like_the_operators_commits(tmp_path: Path) -> None:
    """The operator's clusters are ``<namespace>.<name>`` in the metastore:
    the dot must not split the Iceberg namespace (it did: every flush of an
    operator-managed cluster failed with NoSuchNamespaceError)."""
    config = CatalogConfig(
        f"sqlite:///{tmp_path / 'meta.db'}", str(tmp_path / "warehouse"), cluster="data.lake"
    )
    bed = Bed(config, None)
    bed.assign(P, term=1)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        result = catalog.commit_flush(flush(catalog, 1, None, 10, [1, 2, 3]))
        assert result.outcome is Outcome.COMMITTED
        assert catalog.table("orders").metadata_location == result.metadata_locations["orders"]
    assert bed.duckdb_rows(result.metadata_locations["orders"]) == expected([1, 2, 3])

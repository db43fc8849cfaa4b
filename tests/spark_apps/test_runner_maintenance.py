"""The flush runner's maintenance rounds, without Spark (no seal, so no flush):
a killed run's file is deleted, a dropped collection's files go, the
committed rows stay."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from headrace.cluster import Assignment, AssignmentState
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, TableCatalog
from headrace.table.collections import CollectionSpec, CollectionStore, Dropped
from headrace.table.expiry import RetentionOptions
from headrace.table.pins import PinBasis, pin_ops
from headrace.table.records import collection_key, table_key
from spark_apps.runner import FlushRunner, RunnerOptions, parse_args
from tests.node.harness import until
from tests.table.data import SCHEMA
from tests.table.test_commit import P, flush


def no_spark() -> None:
    raise AssertionError("maintenance must not start Spark")


def data_files(warehouse: Path, collection: str) -> set[str]:
    return {p.name for p in warehouse.rglob(f"{collection}/data/*") if p.is_file()}


async def test_the_runner_collects_orphans_between_flushes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    warehouse = tmp_path / "warehouse"
    config = CatalogConfig(url, str(warehouse))
    metastore = await open_metastore(url)
    try:
        options = RunnerOptions(
            metastore_url=url,
            warehouse=str(warehouse),
            poll_s=0.1,
            maintenance_interval_s=0.2,
            retention=RetentionOptions(orphan_grace_s=0.5),
        )
        runner = FlushRunner(options, no_spark, metastore)  # type: ignore[arg-type]
        record = Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=3, node="n1")
        await metastore.put(runner.keys.pchannel(P), record.to_json())
        store = CollectionStore(metastore, runner.keys)
        await store.create(CollectionSpec("orders", SCHEMA))
        await store.create(CollectionSpec("gone", SCHEMA))
        await store.drop("gone", Dropped(at=time.time()))

        def prepare() -> None:
            with TableCatalog.open(config) as catalog:
                catalog.create_table("orders", SCHEMA, "pk")
                catalog.create_table("gone", SCHEMA, "pk")
                catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
                catalog.write_data_file("orders", SCHEMA.empty_table(), "flush-killed")
                catalog.write_data_file("gone", SCHEMA.empty_table(), "flush-old")

        await asyncio.to_thread(prepare)
        committed = data_files(warehouse, "orders") - {"flush-killed.parquet"}
        assert len(committed) == 1

        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            async with asyncio.timeout(60):
                while "flush-killed.parquet" in data_files(warehouse, "orders") or data_files(
                    warehouse, "gone"
                ):
                    assert not task.done(), task
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await task
        assert runner.maintenance_rounds >= 2  # the first round found them too young
        assert data_files(warehouse, "orders") == committed

        def rows() -> list[int]:
            with TableCatalog.open(config) as catalog:
                return sorted(catalog.scan("orders").column("pk").to_pylist())

        assert await asyncio.to_thread(rows) == [1, 2, 3]
    finally:
        await metastore.close()


def test_maintenance_flags() -> None:
    base = ["--metastore", "sqlite:///m.db", "--warehouse", "/w"]
    options = parse_args([*base, "--maintenance-interval", "30", "--orphan-grace", "7200"])
    assert options.maintenance_interval_s == 30.0
    assert options.retention == RetentionOptions(orphan_grace_s=7200.0)
    with pytest.raises(SystemExit):
        parse_args([*base, "--min-snapshots", "0"])
    with pytest.raises(SystemExit):
        parse_args([*base, "--maintenance-interval", "0"])


async def test_the_runner_keeps_a_snapshot_a_reader_pins(tmp_path: Path) -> None:
    """Expiry with no age or count to keep anything: the runner keeps the
    snapshot a reader pinned (and its data file, which the newer snapshot no
    longer references), and expires it once the pin's lease is revoked."""
    url = f"sqlite:///{tmp_path / 'meta.db'}"
    warehouse = tmp_path / "warehouse"
    config = CatalogConfig(url, str(warehouse))
    metastore = await open_metastore(url)
    try:
        options = RunnerOptions(
            metastore_url=url,
            warehouse=str(warehouse),
            poll_s=0.1,
            maintenance_interval_s=0.1,
            retention=RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0),
        )
        runner = FlushRunner(options, no_spark, metastore)  # type: ignore[arg-type]
        record = Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=3, node="n1")
        await metastore.put(runner.keys.pchannel(P), record.to_json())
        await CollectionStore(metastore, runner.keys).create(CollectionSpec("orders", SCHEMA))

        def prepare() -> tuple[int, set[str]]:
            with TableCatalog.open(config) as catalog:
                catalog.create_table("orders", SCHEMA, "pk")
                catalog.commit_flush(flush(catalog, 3, None, 10, [1, 2, 3]))
                first = catalog.iceberg_table("orders").current_snapshot()
                assert first is not None
                files = data_files(warehouse, "orders")
                # Deleting key 1 rewrites the only file: the first one is then
                # referenced by the first snapshot alone.
                catalog.commit_flush(flush(catalog, 3, 10, 20, [4], deletes=(1,), segment_id=2))
                return first.snapshot_id, files

        pinned, first_files = await asyncio.to_thread(prepare)
        lease = await metastore.grant_lease(60)
        pointer = await metastore.get(table_key(runner.keys, "orders"))
        assert pointer is not None
        record = await metastore.get(collection_key(runner.keys, "orders"))
        assert record is not None
        basis = PinBasis(pointer.mod_revision, collection_revision=record.mod_revision)
        compares, puts = pin_ops(runner.keys, "orders", pinned, lease, basis)
        assert (await metastore.txn(compares, puts)).succeeded

        def snapshots() -> set[int]:
            with TableCatalog.open(config) as catalog:
                return {s.snapshot_id for s in catalog.iceberg_table("orders").snapshots()}

        stop = asyncio.Event()
        task = asyncio.create_task(runner.run(stop))
        try:
            await until(lambda: runner.maintenance_rounds >= 3, 60)
            assert pinned in await asyncio.to_thread(snapshots)
            assert first_files <= data_files(warehouse, "orders")
            await metastore.revoke_lease(lease)
            async with asyncio.timeout(60):
                while pinned in await asyncio.to_thread(snapshots) or (
                    first_files & data_files(warehouse, "orders")
                ):
                    assert not task.done(), task
                    await asyncio.sleep(0.1)
        finally:
            stop.set()
            await task
    finally:
        await metastore.close()

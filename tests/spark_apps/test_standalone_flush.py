"""``headrace standalone`` runs the flush runner: a seal is flushed into the
default warehouse (DATA_DIR/warehouse) and DuckDB reads it; the runner killed
is restarted by the standalone and flushes the next seal; ``--no-flush``
starts no runner."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import HeadraceClient
from headrace.table import CatalogConfig, TableCatalog
from headrace.table.collections import Collection
from tests.cli.standalone_proc import Standalone
from tests.spark_apps.test_flush_job import SCHEMA, expected, rows
from tests.table import duck

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEADLINE = 600.0


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    running = Standalone(tmp_path / "data", nodes=1, pchannels=2).require_ready()
    yield running
    running.kill_all()


def runner_pids(standalone: Standalone) -> list[int]:
    """The standalone's flush runner processes (its children running spark_apps.runner)."""
    return standalone.children("spark_apps.runner")


async def flush_batch(url: str, collection: Collection, pks: list[int]) -> None:
    """Insert rows through the public producer and flush them (the node seals
    and records the seal, the runner commits); wait until committed."""
    async with HeadraceClient(url) as client:
        async with client.producer() as producer:
            await producer.insert(collection, rows(pks))
        flushed = await client.flush(collection.name, wait=True, timeout=DEADLINE)
    assert flushed.waited


def table_rows(standalone: Standalone) -> list[tuple[object, ...]]:
    warehouse = str((standalone.data_dir / "warehouse").resolve())
    with TableCatalog.open(CatalogConfig(standalone.url, warehouse)) as catalog:
        location = catalog.table("orders").metadata_location
    return duck.iceberg_rows(location)


async def test_the_standalone_flushes_seals_and_restarts_a_dead_runner(
    standalone: Standalone,
) -> None:
    async with HeadraceClient(standalone.url) as client:
        orders = await client.create_collection("orders", SCHEMA, "pk", shards=1)
    await flush_batch(standalone.url, orders, [1, 2, 3])
    assert table_rows(standalone) == expected({1, 2, 3})

    (pid,) = runner_pids(standalone)
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(120):
        while True:
            restarted = [p for p in runner_pids(standalone) if p != pid]
            if restarted:
                break
            await asyncio.sleep(0.2)
    await flush_batch(standalone.url, orders, [4, 5])
    assert table_rows(standalone) == expected({1, 2, 3, 4, 5})
    log = (standalone.data_dir / "logs" / "flush-runner.log").read_text()
    assert log.count("headrace flush runner ready") == 2, log


def test_no_flush_starts_no_runner(tmp_path: Path) -> None:
    running = Standalone(tmp_path / "data", nodes=1, pchannels=1, extra=["--no-flush"])
    try:
        running.require_ready()
        assert runner_pids(running) == []
    finally:
        running.kill_all()


def test_the_runner_is_started_when_pyspark_is_installed(standalone: Standalone) -> None:
    assert len(runner_pids(standalone)) == 1

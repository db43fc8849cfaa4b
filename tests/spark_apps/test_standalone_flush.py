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
from headrace.message.types import Message
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, CheckpointRecord, TableCatalog, messages
from headrace.table.collections import Collection, CollectionSpec, CollectionStore
from headrace.table.records import SealRecord, seal_key
from headrace.wal.api import AppendResult
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
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == standalone.proc.pid and b"spark_apps.runner" in cmdline:
            found.append(int(entry.name))
    return found


async def flush_batch(url: str, collection: Collection, pks: list[int], segment: int) -> str:
    """Insert rows into one segment, seal it, record the seal as the node would;
    return the seal's position."""
    vchannel = collection.vchannels[0]
    batch: list[Message] = [
        messages.insert(collection, vchannel, segment, rows(pks)),
        messages.seal(collection, vchannel, segment),
    ]
    async with HeadraceClient(url) as client:
        producer = client.producer()
        outcomes = await producer.send_many(batch)
        await producer.close()
        pchannel = client.route(vchannel)
    assert all(isinstance(o, AppendResult) for o in outcomes), outcomes
    end = outcomes[-1]
    assert isinstance(end, AppendResult)
    metastore = await open_metastore(url, create=False)
    try:
        keys = client.keys
        record = SealRecord(pchannel=pchannel, position=str(end.id), term=1)
        await metastore.put(seal_key(keys, pchannel), record.to_json())
        async with asyncio.timeout(DEADLINE):
            while True:
                kv = await metastore.get(keys.checkpoint(pchannel))
                if kv is not None and CheckpointRecord.from_json(kv.value).position == str(end.id):
                    return str(end.id)
                await asyncio.sleep(0.3)
    finally:
        await metastore.close()


def table_rows(standalone: Standalone) -> list[tuple[object, ...]]:
    warehouse = str((standalone.data_dir / "warehouse").resolve())
    with TableCatalog.open(CatalogConfig(standalone.url, warehouse)) as catalog:
        location = catalog.table("orders").metadata_location
    return duck.iceberg_rows(location)


async def test_the_standalone_flushes_seals_and_restarts_a_dead_runner(
    standalone: Standalone,
) -> None:
    metastore = await open_metastore(standalone.url, create=False)
    try:
        async with HeadraceClient(standalone.url) as client:
            keys = client.keys
        spec = CollectionSpec("orders", SCHEMA, "pk", shards=1)
        orders = await CollectionStore(metastore, keys).create(spec)
    finally:
        await metastore.close()
    await flush_batch(standalone.url, orders, [1, 2, 3], segment=1)
    assert table_rows(standalone) == expected({1, 2, 3})

    (pid,) = runner_pids(standalone)
    os.kill(pid, signal.SIGKILL)
    async with asyncio.timeout(120):
        while True:
            restarted = [p for p in runner_pids(standalone) if p != pid]
            if restarted:
                break
            await asyncio.sleep(0.2)
    await flush_batch(standalone.url, orders, [4, 5], segment=2)
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

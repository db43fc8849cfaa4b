"""The PySpark flush job end to end: real streaming nodes, real local Spark,
DuckDB as the independent reader of the committed Iceberg table.

The test writes INSERT and DELETE messages of :mod:`headrace.table.messages`
without segments and ends each range with a flush request: the node stamps
the segments and replaces the request by the seals of every growing segment,
whose last position (the request's result) is the range's end.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pyarrow as pa
import pytest

from headrace.client import HeadraceClient
from headrace.message.types import Message, MessageType
from headrace.table import (
    CatalogConfig,
    CheckpointRecord,
    ObjectStoreOptions,
    TableCatalog,
    messages,
)
from headrace.table.collections import Collection, CollectionSpec, CollectionStore
from headrace.table.payloads import encode_rows
from headrace.wal.api import AppendResult
from tests.fixtures_s3 import S3Store
from tests.node.harness import Cluster, make_cluster
from tests.table import duck

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

P = "pch-0"
SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
        pa.field("name", pa.string()),
    ]
)
JOB_DEADLINE = 600.0


def rows(pks: list[int]) -> pa.Table:
    return pa.table(
        {
            "pk": pa.array(pks, pa.int64()),
            "vector": pa.array([[float(p)] * 4 for p in pks], pa.list_(pa.float32())),
            "name": [f"n{p}" for p in pks],
        },
        schema=SCHEMA,
    )


def expected(pks: set[int]) -> list[tuple[object, ...]]:
    return sorted((p, [float(p)] * 4, f"n{p}") for p in pks)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path, name="flush"):
        await c.configure([P])
        await c.start_node("n1")
        await c.assign(P, "n1", term=1)
        yield c


async def create(cluster: Cluster, shards: int = 2) -> Collection:
    spec = CollectionSpec("orders", SCHEMA, "pk", shards=shards)
    return await CollectionStore(cluster.metastore, cluster.keys).create(spec)


async def write(cluster: Cluster, *steps: list[Message]) -> list[AppendResult]:
    """Append each step's messages after the previous step was acknowledged."""
    results: list[AppendResult] = []
    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        producer = client.producer()
        for step in steps:
            for outcome in await producer.send_many(step):
                assert isinstance(outcome, AppendResult), outcome
                results.append(outcome)
        await producer.close()
    return results


def shard_of(collection: Collection, pk: int) -> str:
    return collection.vchannels[pk % len(collection.vchannels)]


def inserts(collection: Collection, pks: list[int]) -> list[Message]:
    """Rows split by shard (pk % shards); the node stamps their segments."""
    built = []
    for vchannel in collection.vchannels:
        mine = [p for p in pks if shard_of(collection, p) == vchannel]
        if mine:
            built.append(
                Message(
                    MessageType.INSERT,
                    vchannel,
                    encode_rows(rows(mine)),
                    {messages.COLLECTION: collection.name},
                )
            )
    return built


def deletes(collection: Collection, pks: list[int]) -> list[Message]:
    return [
        messages.delete(collection, v, [p for p in pks if shard_of(collection, p) == v])
        for v in collection.vchannels
        if any(shard_of(collection, p) == v for p in pks)
    ]


def seals(collection: Collection) -> list[Message]:
    """A flush request: its result is the last seal of every growing segment."""
    return [messages.flush_request(collection, collection.vchannels[0])]


class Job:
    """``python -m spark_apps.flush`` as a child process of its own group."""

    def __init__(
        self,
        cluster: Cluster,
        warehouse: Path | str,
        term: int,
        start: str,
        end: str,
        *extra: str,
        s3: S3Store | None = None,
    ) -> None:
        self.args = [
            sys.executable, "-m", "spark_apps.flush",
            "--metastore", cluster.url, "--cluster", cluster.keys.cluster,
            "--pchannel", P, "--term", str(term), "--warehouse", str(warehouse),
            "--start", start, "--end", end, "--read-idle-timeout", "120", *extra,
        ]  # fmt: skip
        self.env = dict(os.environ)
        if s3 is not None:
            self.args += ["--s3-endpoint", s3.endpoint]
            self.env.update(AWS_ACCESS_KEY_ID=s3.access_key, AWS_SECRET_ACCESS_KEY=s3.secret_key)
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> asyncio.subprocess.Process:
        self.proc = await asyncio.create_subprocess_exec(
            *self.args,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
            env=self.env,
        )
        return self.proc

    async def run(self) -> tuple[int, str, str]:
        proc = await self.start()
        out, err = await asyncio.wait_for(proc.communicate(), JOB_DEADLINE)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)


def table_rows(
    cluster: Cluster, warehouse: Path | str, s3: S3Store | None = None
) -> list[tuple[object, ...]]:
    store = ObjectStoreOptions()
    if s3 is not None:
        store = ObjectStoreOptions(s3.endpoint, s3.access_key, s3.secret_key)
    config = CatalogConfig(cluster.url, str(warehouse), cluster.keys.cluster, store)
    with TableCatalog.open(config) as catalog:
        location = catalog.table("orders").metadata_location
    return duck.iceberg_rows(location, s3)


async def checkpoint(cluster: Cluster) -> str | None:
    kv = await cluster.metastore.get(cluster.keys.checkpoint(P))
    return None if kv is None else CheckpointRecord.from_json(kv.value).position


async def test_two_flushes_with_deletes_read_back_by_duckdb(
    cluster: Cluster, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster)
    first = await write(
        cluster,
        inserts(orders, list(range(100))),
        inserts(orders, list(range(100, 200))),
        deletes(orders, [5, 150, 999]),
        [Message(MessageType.INSERT, "opaque-log", b"not collection data")],
        seals(orders),
    )
    end1 = str(first[-1].id)
    code, out, err = await Job(cluster, warehouse, 1, "", end1).run()
    assert code == 0, err
    assert '"outcome": "COMMITTED"' in out
    kept = set(range(200)) - {5, 150}
    assert table_rows(cluster, warehouse) == expected(kept)
    assert await checkpoint(cluster) == end1

    # The next range: deletes of committed rows and of rows in the range, a re-insert.
    second = await write(
        cluster,
        inserts(orders, [200, 201, 202, 5]),
        deletes(orders, [10, 201, 11]),
        seals(orders),
    )
    end2 = str(second[-1].id)
    code, out, err = await Job(cluster, warehouse, 1, end1, end2).run()
    assert code == 0, err
    kept = (kept | {200, 202, 5}) - {10, 11}
    assert table_rows(cluster, warehouse) == expected(kept)
    assert await checkpoint(cluster) == end2

    # Running the second flush again adds nothing.
    code, out, err = await Job(cluster, warehouse, 1, end1, end2).run()
    assert code == 0, err
    assert '"outcome": "ALREADY_COMMITTED"' in out
    assert table_rows(cluster, warehouse) == expected(kept)


async def test_a_job_launched_under_a_stale_term_cannot_commit(
    cluster: Cluster, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster, shards=1)
    written = await write(cluster, inserts(orders, [1, 2, 3]), seals(orders))
    await cluster.start_node("n2")
    moved = await cluster.move(P, "n2")
    assert moved.term == 2
    code, _, err = await Job(cluster, warehouse, 1, "", str(written[-1].id)).run()
    assert code == 3, err
    assert "FENCED" in err and "term 1" in err and "term 2" in err, err
    assert await checkpoint(cluster) is None
    # The new owner's flush of the same range commits it once.
    code, _, err = await Job(cluster, warehouse, 2, "", str(written[-1].id)).run()
    assert code == 0, err
    assert table_rows(cluster, warehouse) == expected({1, 2, 3})


async def test_a_refused_job_never_changes_committed_files(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A job of a range overlapping a committed one (a launcher bug the commit
    refuses) writes files of the same segments first: they may not take the
    names of the committed ones, which would change the committed rows."""
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster, shards=1)
    first = await write(cluster, inserts(orders, [1, 2, 3]), seals(orders))
    code, _, err = await Job(cluster, warehouse, 1, "", str(first[-1].id)).run()
    assert code == 0, err
    # the overlapping range folds the committed segment again without key 2
    second = await write(cluster, inserts(orders, [4]), deletes(orders, [2]), seals(orders))
    code, _, err = await Job(cluster, warehouse, 1, "", str(second[-1].id)).run()
    assert code == 4, err
    assert "another flush committed first" in err
    assert table_rows(cluster, warehouse) == expected({1, 2, 3})


async def test_a_job_killed_mid_write_then_rerun_leaves_no_duplicate_and_no_gap(
    cluster: Cluster, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster)
    pks = list(range(6000))
    steps = [inserts(orders, pks[i : i + 500]) for i in range(0, 6000, 500)]
    written = await write(cluster, *steps, deletes(orders, [7, 4001]), seals(orders))
    end = str(written[-1].id)
    job = Job(cluster, warehouse, 1, "", end, "--rows-per-file", "50")
    await job.start()
    async with asyncio.timeout(JOB_DEADLINE):
        while not list(warehouse.rglob("*.parquet")):
            assert job.proc is not None and job.proc.returncode is None
            await asyncio.sleep(0.05)
    job.kill()
    assert job.proc is not None
    await job.proc.wait()
    assert await checkpoint(cluster) is None, "the job committed before it was killed"
    code, out, err = await Job(cluster, warehouse, 1, "", end, "--rows-per-file", "50").run()
    assert code == 0, err
    assert '"outcome": "COMMITTED"' in out
    assert table_rows(cluster, warehouse) == expected(set(pks) - {7, 4001})


@pytest.mark.s3
async def test_a_flush_into_an_s3_warehouse_from_the_python_workers(
    cluster: Cluster, s3_store: S3Store
) -> None:
    warehouse = f"s3://{s3_store.bucket}/flush-{uuid.uuid4().hex[:8]}"
    orders = await create(cluster)
    written = await write(
        cluster, inserts(orders, list(range(50))), deletes(orders, [3]), seals(orders)
    )
    code, _, err = await Job(cluster, warehouse, 1, "", str(written[-1].id), s3=s3_store).run()
    assert code == 0, err
    assert table_rows(cluster, warehouse, s3_store) == expected(set(range(50)) - {3})

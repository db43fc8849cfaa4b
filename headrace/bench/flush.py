"""``headrace bench flush``: the Spark flush job against pyarrow writing the
same rows to Parquet, in the same run.

1. A standalone (in this process, one node, one pchannel, local WAL, no flush
   runner) takes ``rows`` rows of an int64 primary key, a 128-float32 vector
   and a short string, as INSERT messages of ``batch_rows`` rows in a
   ``shards``-shard collection (``producer.insert``), then ``client.flush``
   (the node seals every growing segment).
2. Baseline: pyarrow writes the same rows, split the same way (one file per
   shard, sorted by key as the job sorts them), to Parquet in a local
   directory: ``baseline_rows_per_s``.
3. The flush job (``python -m spark_apps.timed``, the job of
   :mod:`spark_apps.flush` with its start-up timed apart) flushes the range
   into a local warehouse: ``startup_s`` (new JVM and Spark session) and
   ``rows_per_s`` (rows / the job in that session: read the WAL through the
   node, fold, write Parquet, commit). ``ratio`` = rows_per_s /
   baseline_rows_per_s. The committed snapshot must hold exactly ``rows``
   rows (else the bench fails).

The standalone's flush runner keeps its session, so a flush there costs what
``rows_per_s`` measures; a process per flush would add ``startup_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from headrace import cluster, errors, standalone
from headrace.bench import report
from headrace.client.client import HeadraceClient
from headrace.client.routing import split_by_shard
from headrace.metastore import factory
from headrace.metastore.contract import Metastore
from headrace.table import CatalogConfig, TableCatalog

DIM = 128
SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vector", pa.list_(pa.float32())),
        pa.field("name", pa.string()),
    ]
)


def make_rows(start: int, count: int, dim: int = DIM) -> pa.Table:
    """``count`` rows from key ``start``: random vectors of ``dim`` floats (so
    Parquet cannot shrink them to nothing), names ``n<key>``."""
    values = pa.Array.from_buffers(
        pa.float32(), count * dim, [None, pa.py_buffer(os.urandom(4 * dim * count))]
    )
    offsets = pa.array(range(0, count * dim + 1, dim), pa.int32())
    keys = pa.array(range(start, start + count), pa.int64())
    return pa.table(
        {
            "pk": keys,
            "vector": pa.ListArray.from_arrays(offsets, values),
            "name": pc.binary_join_element_wise("n", pc.cast(keys, pa.string()), ""),
        },
        schema=SCHEMA,
    )


async def _write_wal(
    url: str, cluster_name: str, table: pa.Table, options: Ingest
) -> tuple[str, float]:
    """Create the collection, insert the rows through the public producer
    (``batch_rows`` rows per call; the client routes them by key and the node
    stamps their segments) and ask for a flush, which seals every growing
    segment; the last seal's position and the seconds it took."""
    started = time.perf_counter()
    async with HeadraceClient(url, cluster_name) as client:
        collection = await client.create_collection("bench", SCHEMA, "pk", options.shards)
        async with client.producer() as producer:
            for offset in range(0, table.num_rows, options.batch_rows):
                await producer.insert(collection, table.slice(offset, options.batch_rows))
        requested = await client.flush("bench", wait=False)
    (end,) = requested.targets.values()
    return str(end), time.perf_counter() - started


def baseline(table: pa.Table, shards: int, root: Path) -> float:
    """Seconds pyarrow takes to write the rows as the job does: per shard,
    sorted by key, one Parquet file."""
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    for shard, mine in split_by_shard(table, "pk", shards).items():
        pq.write_table(mine.sort_by("pk"), root / f"shard-{shard}.parquet")
    return time.perf_counter() - started


@dataclasses.dataclass(frozen=True)
class SparkJob:
    """A job run by a benchmark as its own process: the module, what its
    error says, and the logger whose ``<logger> <word> ...`` lines to keep."""

    module: str
    what: str
    logger: str
    word: str


FLUSH_JOB = SparkJob("spark_apps.timed", "the flush job", "spark_apps.flush", "flush")


async def run_job(argv: list[str], job: SparkJob = FLUSH_JOB) -> dict[str, Any]:
    """Run ``job`` with ``argv``; its JSON summary, with its ``log`` lines."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-P",
        "-m",
        job.module,
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=standalone.node_environment(os.environ),
    )
    out, err = await proc.communicate()
    if proc.returncode != 0:
        tail = "\n".join(err.decode(errors="replace").splitlines()[-20:])
        raise errors.HeadraceError(f"{job.what} exited with {proc.returncode}:\n{tail}")
    summary: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    summary["log"] = [
        line.split(f" {job.logger} ", 1)[1]
        for line in err.decode(errors="replace").splitlines()
        if f" {job.logger} {job.word} " in line
    ]
    return summary


async def bench_flush(
    rows: int, root: Path, *, shards: int = 4, batch_rows: int = 2000, master: str = "local[2]"
) -> dict[str, Any]:
    if rows < 1 or shards < 1 or batch_rows < 1:
        raise errors.InvalidArgument("--rows, --shards and --batch-rows must be positive")
    cfg = standalone.StandaloneConfig(
        data_dir=root / "data", nodes=1, pchannels=1, flush=False, lease_ttl_s=15.0
    )
    stop = asyncio.Event()
    task = asyncio.create_task(standalone.run_standalone(cfg, stop, announce=False))
    store = None
    try:
        store = await ready(cfg, task)
        # CPU-heavy steps off the event loop: the standalone's coordinator runs on it.
        table = await asyncio.to_thread(make_rows, 0, rows)
        end, ingest_s = await _write_wal(
            cfg.metastore_url, cfg.cluster, table, Ingest(shards, batch_rows)
        )
        baseline_s = await asyncio.to_thread(baseline, table, shards, root / "baseline")
        del table
        (pchannel,) = cluster.default_pchannels(1)
        kv = await store.get(cluster.Keys(cfg.cluster).pchannel(pchannel))
        assert kv is not None
        term = cluster.Assignment.from_json(kv.value).term
        warehouse = str((root / "warehouse").resolve())
        job = await run_job(
            [
                "--metastore", cfg.metastore_url, "--cluster", cfg.cluster,
                "--pchannel", pchannel, "--term", str(term), "--warehouse", warehouse,
                "--end", end, "--master", master, "--read-idle-timeout", "300",
            ]
        )  # fmt: skip
        committed = _committed_rows(CatalogConfig(cfg.metastore_url, warehouse, cfg.cluster))
        if committed != rows:
            raise errors.HeadraceError(f"the table holds {committed} rows, expected {rows}")
    finally:
        stop.set()
        if store is not None:
            await store.close()
        with contextlib.suppress(errors.HeadraceError):
            await task
    rows_per_s = report.rate(rows, job["flush_s"])
    baseline_rows_per_s = report.rate(rows, baseline_s)
    return {
        "bench": "flush",
        "rows": rows,
        "shards": shards,
        "rows_per_s": round(rows_per_s, 1),
        "baseline_rows_per_s": round(baseline_rows_per_s, 1),
        "ratio": ratio(rows_per_s, baseline_rows_per_s),
        "startup_s": job["startup_s"],
        "flush_s": job["flush_s"],
        "baseline_s": round(baseline_s, 3),
        "ingest_s": round(ingest_s, 3),
        "master": master,
        "job_log": job["log"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


@dataclasses.dataclass(frozen=True, slots=True)
class Ingest:
    shards: int
    batch_rows: int


def ratio(measured: float, baseline: float) -> float:
    """``measured / baseline`` to three significant digits (a small run's
    ratio must not round to 0); 0 without a baseline."""
    return float(f"{measured / baseline:.3g}") if baseline > 0 else 0.0


async def ready(cfg: standalone.StandaloneConfig, task: asyncio.Task[int]) -> Metastore:
    """The standalone's metastore once its pchannel is served."""
    deadline = time.monotonic() + cfg.ready_timeout_s
    while not (cfg.data_dir / "meta.db").exists():
        if task.done() or time.monotonic() > deadline:
            task.result()
            raise errors.Unavailable("the bench's standalone did not start")
        await asyncio.sleep(0.05)
    store = await factory.open_metastore(cfg.metastore_url)
    waiting = asyncio.create_task(
        standalone.wait_all_assigned(store, cfg.cluster, cfg.pchannels, cfg.ready_timeout_s)
    )
    await asyncio.wait({waiting, task}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiting.cancel()
        await store.close()
        task.result()
        raise errors.Unavailable("the bench's standalone stopped before it was ready")
    waiting.result()
    return store


def _committed_rows(config: CatalogConfig) -> int:
    with TableCatalog.open(config) as catalog:
        snapshot = catalog.iceberg_table("bench").current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0
    return int(snapshot.summary.get("total-records") or 0)

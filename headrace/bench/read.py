"""``headrace bench read``: snapshot reads against DuckDB scanning the same
Iceberg table, in the same run, and the cost of the WAL-tail part.

1. A standalone (in this process, one node, one pchannel, local WAL, no flush
   runner) takes ``rows`` rows (an int64 key, a 16-float32 vector, a short
   string) into a ``shards``-shard collection through the public producer,
   and the flush job (:mod:`spark_apps.timed`, the real job and commit)
   flushes them all. A second collection then gets ``tail_rows`` rows that
   are never flushed: growing rows in the WAL (inserted after the snapshot
   reads and DuckDB's, so that the flushed collection's tail, which the node
   scans from its checkpoint, is empty as in a quiet pchannel).
2. ``rows_per_s``: a snapshot read (:meth:`HeadraceClient.snapshot_read`,
   what :meth:`HeadraceClient.read` does) of the flushed collection
   ("latest": plan, pin, the WAL tail after the checkpoint, which is empty,
   the pyiceberg scan, the merge), best of ``repeats``; ``read_open_s``: the
   part before the scan (plan, pin, tail). Each read must return exactly
   ``rows`` distinct keys.
3. ``baseline_rows_per_s``: DuckDB's ``iceberg_scan`` of the same metadata
   file into an Arrow table (``fetch_arrow_table``), best of ``repeats``.
   ``ratio`` = rows_per_s / baseline_rows_per_s (target >= 0.5).
4. ``tail_rows_per_s``: a read of the never-flushed collection: every row
   comes from the WAL (consumed through the node, decoded, folded), best of
   ``repeats``.

DuckDB (a dev dependency) loads its avro and iceberg extensions from the
``duckdb-ext-*`` wheels by path: nothing is downloaded.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import os
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from headrace import cluster, errors, standalone
from headrace.bench import report
from headrace.bench.flush import SCHEMA, ratio, ready, run_job
from headrace.bench.flush import make_rows as flush_rows
from headrace.client.client import HeadraceClient
from headrace.table import CatalogConfig, TableCatalog

DIM = 16
"""Floats per vector: smaller than the flush bench's, reads are what is measured."""


def make_rows(start: int, count: int) -> pa.Table:
    return flush_rows(start, count, DIM)


async def _insert(
    client: HeadraceClient, name: str, rows: int, batch_rows: int, shards: int
) -> None:
    await client.create_collection(name, SCHEMA, "pk", shards)
    async with client.producer() as producer:
        for start in range(0, rows, batch_rows):
            part = await asyncio.to_thread(make_rows, start, min(batch_rows, rows - start))
            await producer.insert(name, part)


def _duckdb_scan(metadata_location: str) -> tuple[int, float]:
    """Rows DuckDB's ``iceberg_scan`` returns as Arrow, and the seconds it took."""
    duckdb: Any = importlib.import_module("duckdb")
    spec = importlib.util.find_spec("duckdb_ext")
    if spec is None or not spec.submodule_search_locations:
        raise errors.InvalidArgument("bench read needs the duckdb-ext-* wheels (dev dependencies)")
    root = Path(next(iter(spec.submodule_search_locations)))
    extensions = root / "extensions" / f"v{duckdb.__version__}" / "linux_amd64"
    con = duckdb.connect(
        config={"allow_unsigned_extensions": True, "autoinstall_known_extensions": False}
    )
    try:
        for name in ("avro", "iceberg"):
            con.execute(f"LOAD '{extensions / f'{name}.duckdb_extension'}'")
        started = time.perf_counter()
        table = con.execute(
            "SELECT * FROM iceberg_scan(?)", [metadata_location.removeprefix("file://")]
        ).fetch_arrow_table()
        return table.num_rows, time.perf_counter() - started
    finally:
        con.close()


async def _timed_read(client: HeadraceClient, name: str, expected: int) -> tuple[float, float]:
    """Seconds of the whole read, and of its opening (plan, pin, WAL tail)."""
    started = time.perf_counter()
    async with client.snapshot_read(name) as reading:
        opened = time.perf_counter()
        rows = await reading.table()
    took = time.perf_counter() - started
    keys = rows.column("pk")
    if rows.num_rows != expected or pc.count_distinct(keys).as_py() != expected:
        raise errors.HeadraceError(
            f"the read of {name} returned {rows.num_rows} rows "
            f"({pc.count_distinct(keys).as_py()} keys), expected {expected}"
        )
    return took, opened - started


async def bench_read(
    rows: int,
    root: Path,
    *,
    shards: int = 4,
    tail_rows: int = 100_000,
    batch_rows: int = 5000,
    repeats: int = 3,
    master: str = "local[2]",
) -> dict[str, Any]:
    if min(rows, shards, tail_rows, batch_rows, repeats) < 1:
        raise errors.InvalidArgument("every count of bench read must be positive")
    if importlib.util.find_spec("duckdb") is None:
        raise errors.InvalidArgument("bench read needs duckdb (a dev dependency)")
    cfg = standalone.StandaloneConfig(
        data_dir=root / "data", nodes=1, pchannels=1, flush=False, lease_ttl_s=15.0
    )
    stop = asyncio.Event()
    task = asyncio.create_task(standalone.run_standalone(cfg, stop, announce=False))
    store = None
    warehouse = str((root / "warehouse").resolve())
    try:
        store = await ready(cfg, task)
        async with HeadraceClient(cfg.metastore_url, cfg.cluster) as client:
            await _insert(client, "bench", rows, batch_rows, shards)
            requested = await client.flush("bench", wait=False)
            (end,) = requested.targets.values()
            (pchannel,) = cluster.default_pchannels(1)
            kv = await store.get(cluster.Keys(cfg.cluster).pchannel(pchannel))
            assert kv is not None
            term = cluster.Assignment.from_json(kv.value).term
            job = await run_job(
                [
                    "--metastore", cfg.metastore_url, "--cluster", cfg.cluster,
                    "--pchannel", pchannel, "--term", str(term), "--warehouse", warehouse,
                    "--end", str(end), "--master", master, "--read-idle-timeout", "300",
                ]
            )  # fmt: skip
            with TableCatalog.open(CatalogConfig(cfg.metastore_url, warehouse, cfg.cluster)) as c:
                metadata = c.table("bench").metadata_location
            read_s = [await _timed_read(client, "bench", rows) for _ in range(repeats)]
            duck = [await asyncio.to_thread(_duckdb_scan, metadata) for _ in range(repeats)]
            if any(n != rows for n, _ in duck):
                raise errors.HeadraceError(f"DuckDB read {duck} rows, expected {rows}")
            # After those reads: the tail collection's rows would follow the
            # flushed collection's checkpoint in the one pchannel.
            await _insert(client, "tail", tail_rows, batch_rows, shards)
            tail_s = [await _timed_read(client, "tail", tail_rows) for _ in range(repeats)]
    finally:
        stop.set()
        if store is not None:
            await store.close()
        with contextlib.suppress(errors.HeadraceError):
            await task
    duck_s = [s for _, s in duck]
    rows_per_s = report.rate(rows, min(s for s, _ in read_s))
    baseline_rows_per_s = report.rate(rows, min(duck_s))
    return {
        "bench": "read",
        "rows": rows,
        "shards": shards,
        "rows_per_s": round(rows_per_s, 1),
        "baseline_rows_per_s": round(baseline_rows_per_s, 1),
        "ratio": ratio(rows_per_s, baseline_rows_per_s),
        "tail_rows": tail_rows,
        "tail_rows_per_s": round(report.rate(tail_rows, min(s for s, _ in tail_s)), 1),
        "read_s": [round(s, 3) for s, _ in read_s],
        "read_open_s": [round(s, 3) for _, s in read_s],
        "duckdb_s": [round(s, 3) for s in duck_s],
        "tail_read_s": [round(s, 3) for s, _ in tail_s],
        "flush_s": job["flush_s"],
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }

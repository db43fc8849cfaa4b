"""``headrace bench compact``: the Spark compaction job against pyarrow reading,
sorting and rewriting the same files, in the same run.

1. A table of one 1-shard collection (SQLite metastore, local warehouse)
   holds ``rows`` rows of an int64 primary key in random order, a 128-float32
   vector and a short string, as ``files`` small Parquet files committed by one
   flush commit (through the catalog, under a recorded pchannel owner).
2. Baseline: pyarrow reads those files, sorts the rows by key and writes them
   as files of ``target_file_mb`` (by the same rows-per-file the job gets from
   its bins), in a local directory: ``baseline_rows_per_s``.
3. The compaction job (``python -m spark_apps.compact``, its start-up timed
   apart) compacts the shard: ``startup_s`` (new JVM, Spark session, warm
   workers) and ``rows_per_s`` (rows / the job in that session: plan, read,
   sort, write, one commit). ``ratio`` = rows_per_s / baseline_rows_per_s.
   The committed table must hold exactly ``rows`` rows in fewer files (else
   the bench fails).

The standalone's runner keeps its session, so a compaction there costs what
``rows_per_s`` measures.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import headrace.wal.local.message_id  # noqa: F401 - registers the local:<lsn> positions the commit uses
from headrace import errors
from headrace.bench import report
from headrace.bench.flush import SCHEMA, SparkJob, make_rows, ratio, run_job
from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, Checkpoint, FlushCommit, TableCatalog, TableChanges
from headrace.table.collections import CollectionSpec, CollectionStore
from headrace.table.records import WalRange

NAME = "bench"
COMPACT_JOB = SparkJob("spark_apps.compact", "the compaction job", "spark_apps.compact", "compact")
PCHANNEL = "pchannel-000"


@dataclasses.dataclass(frozen=True, slots=True)
class CompactBench:
    rows: int = 200_000
    files: int = 200
    target_file_mb: int = 32
    master: str = "local[2]"

    def __post_init__(self) -> None:
        if self.rows < 1 or self.files < 2 or self.target_file_mb < 1:
            raise errors.InvalidArgument(
                "--rows must be positive, --files at least 2, --target-file-mb positive"
            )


async def _prepare(config: CatalogConfig) -> None:
    keys = Keys(config.cluster)
    async with await open_metastore(config.metastore_url) as store:
        owner = Assignment(pchannel=PCHANNEL, state=AssignmentState.ASSIGNED, term=1, node="bench")
        await store.put(keys.pchannel(PCHANNEL), owner.to_json())
        await CollectionStore(store, keys).create(CollectionSpec(NAME, SCHEMA, "pk", 1))


def _write_files(config: CatalogConfig, options: CompactBench) -> list[str]:
    """``files`` Parquet files of the rows in random key order, committed."""
    keys = list(range(options.rows))
    random.shuffle(keys)
    rows = make_rows(0, options.rows).take(pa.array(keys))
    per_file = -(-options.rows // options.files)
    with TableCatalog.open(config) as catalog:
        catalog.create_table(NAME, SCHEMA, "pk")
        location = catalog.iceberg_table(NAME).location().removeprefix("file://")
        Path(location, "data").mkdir(parents=True, exist_ok=True)
        paths = []
        for index, offset in enumerate(range(0, options.rows, per_file)):
            path = f"{location}/data/flush-{PCHANNEL}-bench-{index:05d}.parquet"
            pq.write_table(rows.slice(offset, per_file), path)
            paths.append(path)
        catalog.commit_flush(
            FlushCommit(
                pchannel=PCHANNEL,
                launch_term=1,
                wal_range=WalRange("", "local:1"),
                checkpoint=Checkpoint("local:1", 1),
                tables=(TableChanges(NAME, tuple(f"file://{p}" for p in paths)),),
            )
        )
    return paths


def baseline(paths: list[str], target_file_bytes: int, root: Path) -> float:
    """Seconds pyarrow takes to read ``paths``, sort the rows by key and write
    them as files of about ``target_file_bytes`` (by the inputs' bytes per row)."""
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    rows = pa.concat_tables(pq.read_table(p) for p in paths).sort_by("pk")
    size = sum(os.path.getsize(p) for p in paths)
    per_file = max(1, int(rows.num_rows * target_file_bytes / max(size, 1)))
    for index, offset in enumerate(range(0, rows.num_rows, per_file)):
        pq.write_table(rows.slice(offset, per_file), root / f"part-{index:05d}.parquet")
    return time.perf_counter() - started


def _table_state(config: CatalogConfig) -> tuple[int, int]:
    """Rows and live data files of the table's current snapshot."""
    with TableCatalog.open(config) as catalog:
        snapshot = catalog.iceberg_table(NAME).current_snapshot()
    if snapshot is None or snapshot.summary is None:
        return 0, 0
    summary = snapshot.summary
    return int(summary.get("total-records") or 0), int(summary.get("total-data-files") or 0)


async def bench_compact(root: Path, options: CompactBench) -> dict[str, Any]:
    config = CatalogConfig(
        f"sqlite:///{root / 'meta.db'}", str((root / "warehouse").resolve()), "bench"
    )
    await _prepare(config)
    paths = await asyncio.to_thread(_write_files, config, options)
    target = options.target_file_mb * 2**20
    baseline_s = await asyncio.to_thread(baseline, paths, target, root / "baseline")
    job = await run_job(
        [
            "--metastore", config.metastore_url, "--cluster", config.cluster,
            "--warehouse", config.warehouse, "--collection", NAME, "--shard", "0",
            "--target-file-bytes", str(target), "--small-file-bytes", str(target),
            "--max-input-files", str(max(options.files, 2)), "--master", options.master,
        ],
        COMPACT_JOB,
    )  # fmt: skip
    rows, files = await asyncio.to_thread(_table_state, config)
    if rows != options.rows or not files < options.files:
        raise errors.HeadraceError(
            f"after the compaction the table holds {rows} rows in {files} files; expected "
            f"{options.rows} rows in fewer than {options.files} files"
        )
    rows_per_s = report.rate(options.rows, job["compact_s"])
    baseline_rows_per_s = report.rate(options.rows, baseline_s)
    return {
        "bench": "compact",
        "rows": options.rows,
        "input_files": options.files,
        "output_files": files,
        "target_file_mb": options.target_file_mb,
        "rows_per_s": round(rows_per_s, 1),
        "baseline_rows_per_s": round(baseline_rows_per_s, 1),
        "ratio": ratio(rows_per_s, baseline_rows_per_s),
        "startup_s": job["startup_s"],
        "compact_s": job["compact_s"],
        "baseline_s": round(baseline_s, 3),
        "outcome": job["outcome"],
        "job_log": job["log"],
        "master": options.master,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }

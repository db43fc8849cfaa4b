"""Cost of a flush's deletes on an Iceberg table (copy-on-write rewrites).

Writes ``--rows`` rows (an int64 key, a 128-float vector, a short string) in
``--files`` Parquet files into a local warehouse, commits them as one flush,
then commits a flush deleting one key (one file holds it) and one deleting
``--keys`` random keys (every file holds some). Prints one JSON object with
the seconds of each step; the check ``remaining_rows`` is read back with
pyiceberg. SQLite metastore, all in a temporary directory.

    python benchmarks/bench_table_deletes.py [--rows N] [--files F] [--keys K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.metastore.factory import open_metastore
from headrace.table import (
    CatalogConfig,
    Checkpoint,
    FlushCommit,
    TableCatalog,
    TableChanges,
    WalRange,
)

PCHANNEL = "pchannel-000"
SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vec", pa.list_(pa.float32(), 128)),
        pa.field("s", pa.string()),
    ]
)


async def assign(url: str) -> None:
    async with await open_metastore(url) as store:
        record = Assignment(pchannel=PCHANNEL, state=AssignmentState.ASSIGNED, term=1, node="n")
        await store.put(Keys().pchannel(PCHANNEL), record.to_json())


def batch(first: int, count: int) -> pa.Table:
    vectors = pa.FixedSizeListArray.from_arrays(pc.cast(pc.random(count * 128), pa.float32()), 128)
    names = pa.array([f"s{i % 1000}" for i in range(count)])
    keys = pa.array(range(first, first + count), pa.int64())
    return pa.table({"pk": keys, "vec": vectors, "s": names}, schema=SCHEMA)


def commit(catalog: TableCatalog, step: int, changes: TableChanges) -> None:
    start = f"local:{step - 1}" if step > 1 else ""
    catalog.commit_flush(
        FlushCommit(
            PCHANNEL, 1, WalRange(start, f"local:{step}"), Checkpoint(f"local:{step}"), (changes,)
        )
    )


def run(rows: int, files: int, keys: int, root: Path) -> dict[str, float | int]:
    url = f"sqlite:///{root / 'meta.db'}"
    asyncio.run(assign(url))
    with TableCatalog.open(CatalogConfig(url, str(root / "warehouse"))) as catalog:
        catalog.create_table("t", SCHEMA, "pk")
        per_file = rows // files
        started = time.monotonic()
        paths = tuple(
            catalog.write_data_file("t", batch(i * per_file, per_file), f"f{i}")
            for i in range(files)
        )
        written = time.monotonic()
        commit(catalog, 1, TableChanges("t", paths))
        committed = time.monotonic()
        commit(catalog, 2, TableChanges("t", deletes=(5,)))
        one_deleted = time.monotonic()
        victims = tuple(random.sample(range(6, per_file * files), keys))
        commit(catalog, 3, TableChanges("t", deletes=victims))
        many_deleted = time.monotonic()
        remaining = catalog.scan("t").num_rows
    return {
        "rows": per_file * files,
        "files": files,
        "write_files_s": round(written - started, 3),
        "commit_files_s": round(committed - written, 3),
        "delete_1_key_s": round(one_deleted - committed, 3),
        "delete_keys": keys,
        "delete_random_keys_s": round(many_deleted - one_deleted, 3),
        "remaining_rows": remaining,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--files", type=int, default=10)
    parser.add_argument("--keys", type=int, default=100)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-deletes-") as root:
        print(json.dumps(run(args.rows, args.files, args.keys, Path(root))))
    return 0


if __name__ == "__main__":
    sys.exit(main())

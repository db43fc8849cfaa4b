"""The demo's data-pipeline step: a collection written, flushed by the
standalone's Spark runner into an Iceberg table, and read back from the table.

Runs only when the ``pipeline`` extra is installed (pyspark, pyiceberg); the
table is read with pyiceberg through :class:`headrace.table.TableCatalog`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from headrace import standalone
from headrace.client import HeadraceClient

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
FLUSH_TIMEOUT_S = 600.0


def pipeline_missing() -> str | None:
    """Why the standalone cannot flush here (None: it can): Spark needs the
    ``pipeline`` extra and a Java runtime."""
    if not standalone.pipeline_installed():
        return "the pipeline extra (pyspark, pyiceberg) is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "Spark needs a Java runtime (java on PATH or JAVA_HOME)"
    return None


def rows(count: int) -> pa.Table:
    keys = pa.array(range(count), pa.int64())
    names = pc.binary_join_element_wise("row-", pc.cast(keys, pa.string()), "")
    return pa.table([keys, names], schema=SCHEMA)


async def demo_collection(url: str, data_dir: Path, count: int) -> bool:
    """Insert ``count`` rows into collection ``demo`` (2 shards), delete every
    tenth key, flush and wait, then read the Iceberg table: True if it holds
    exactly the rows not deleted."""
    deleted = list(range(0, count, 10))
    async with HeadraceClient(url) as client:
        demo = await client.create_collection("demo", SCHEMA, primary_key="pk", shards=2)
        async with client.producer() as producer:
            await producer.insert(demo, rows(count))
            await producer.delete(demo, deleted)
        print(
            f"demo: collection demo: inserted {count} rows, deleted {len(deleted)}; "
            "flushing (the first flush starts Spark)",
            flush=True,
        )
        start = time.monotonic()
        await client.flush("demo", wait=True, timeout=FLUSH_TIMEOUT_S)
        location = await client.table_location("demo")
    print(f"demo: flushed in {time.monotonic() - start:.1f}s into {location}", flush=True)
    keys = await asyncio.to_thread(_table_keys, url, data_dir / "warehouse")
    expected = sorted(set(range(count)) - set(deleted))
    same = keys == expected
    print(
        f"demo: Iceberg table demo holds {len(keys)} rows, exactly the rows not deleted: "
        f"{'yes' if same else 'NO'}",
        flush=True,
    )
    return same


def _table_keys(url: str, warehouse: Path) -> list[int]:
    from headrace.table import CatalogConfig, TableCatalog  # noqa: PLC0415 (pipeline extra)

    with TableCatalog.open(CatalogConfig(url, str(warehouse.resolve()))) as catalog:
        table = catalog.iceberg_table("demo").scan(selected_fields=("pk",)).to_arrow()
    return sorted(table.column("pk").to_pylist())

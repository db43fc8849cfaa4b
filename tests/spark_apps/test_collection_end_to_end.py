"""Issue #12's end-to-end check, through ``headrace standalone`` as a user runs it.

One million rows go into a 4-shard collection through the public client, with
deletes before and after a flush; one node is SIGKILLed right after a flush
request was acknowledged (its seals are in the log, nothing is committed yet)
and the flush runner is SIGKILLed while it writes files. DuckDB
(``iceberg_scan``, no Headrace code) then reads exactly the acknowledged rows
minus the deleted keys, each once, and the local WAL's oldest segment files
are gone (truncated below the flush checkpoints).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.status import status
from headrace.table import CatalogConfig, TableCatalog
from headrace.wal.local import files
from tests.cli.standalone_proc import Standalone
from tests.node.harness import until
from tests.table import duck

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROWS = 1_000_000
CHUNK = 50_000
PCHANNELS = 4
FLUSH_TIMEOUT = 900.0
SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("vec", pa.list_(pa.float32(), 4)),
        pa.field("name", pa.string()),
    ]
)


def chunk(start: int, count: int) -> pa.Table:
    pk = pa.array(range(start, start + count), pa.int64())
    values = pc.cast(
        pc.multiply(pa.array(range(4 * start, 4 * (start + count))), 0.5), pa.float32()
    )
    vec = pa.FixedSizeListArray.from_arrays(values, 4)
    name = pc.binary_join_element_wise("n", pc.cast(pk, pa.string()), "")
    return pa.table([pk, vec, name], schema=SCHEMA)


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    running = Standalone(
        tmp_path / "data",
        nodes=2,
        pchannels=PCHANNELS,
        extra=[
            *("--segment-bytes", str(2 * 1024 * 1024)),
            *("--truncate-margin-s", "0", "--truncate-margin-bytes", "0"),
            *("--housekeeping-interval-s", "1"),
        ],
    ).require_ready()
    yield running
    running.kill_all()


def segment_files(wal_dir: Path) -> dict[str, list[str]]:
    return {
        p.name: [str(name) for name in files.list_segments(str(p))]
        for p in sorted(wal_dir.iterdir())
        if p.is_dir()
    }


def table_keys(standalone: Standalone, cluster: str = "default") -> list[int]:
    """The primary keys DuckDB reads from the committed ``items`` table, sorted."""
    warehouse = str((standalone.data_dir / "warehouse").resolve())
    with TableCatalog.open(CatalogConfig(standalone.url, warehouse, cluster)) as catalog:
        location = catalog.table("items").metadata_location
    con = duck.connect()
    try:
        found = con.execute(
            "SELECT pk FROM iceberg_scan(?) ORDER BY pk", [location.removeprefix("file://")]
        ).fetchall()
    finally:
        con.close()
    return [row[0] for row in found]


async def test_a_million_rows_with_deletes_and_kills_read_back_exactly_by_duckdb(
    standalone: Standalone,
) -> None:
    wal_dir = standalone.data_dir / "wal"
    deleted: set[int] = set()
    async with HeadraceClient(standalone.url) as client:
        items = await client.create_collection("items", SCHEMA, primary_key="pk", shards=4)
        assert len({client.route(v) for v in items.vchannels}) == PCHANNELS
        async with client.producer(ProducerOptions(deadline=120.0)) as producer:
            for start in range(0, ROWS // 2, CHUNK):
                written = await producer.insert("items", chunk(start, CHUNK))
                assert written.rows == CHUNK
                if start == ROWS // 4:
                    # Deletes of rows still in the WAL (folded by the flush job).
                    keys = [k for k in range(0, start) if k % 10 == 0]
                    await producer.delete("items", keys)
                    deleted.update(keys)
            first = await client.flush("items", wait=True, timeout=FLUSH_TIMEOUT)
            assert first.waited
            before = segment_files(wal_dir)

            # Deletes of committed rows (the next commit rewrites their files).
            keys = [k for k in range(0, ROWS // 2) if k % 10 == 3]
            await producer.delete("items", keys)
            deleted.update(keys)
            for start in range(ROWS // 2, ROWS, CHUNK):
                await producer.insert("items", chunk(start, CHUNK))
            keys = [k for k in range(ROWS // 2, ROWS) if k % 10 == 7]
            await producer.delete("items", keys)
            deleted.update(keys)

        # A node killed right after its seals were acknowledged, before any
        # flush of them committed: the new owner keeps the range, nothing is lost.
        await client.flush("items", wait=False)
        (node0,) = standalone.children("--node-id node-0 ")
        os.kill(node0, signal.SIGKILL)

        # The flush runner killed while it writes Parquet files: the standalone
        # restarts it and the restarted runner commits the range once.
        table_dir = standalone.data_dir / "warehouse"
        known = set(table_dir.rglob("*.parquet"))
        await until(lambda: bool(set(table_dir.rglob("*.parquet")) - known), FLUSH_TIMEOUT)
        (runner,) = standalone.children("spark_apps.runner")
        os.kill(runner, signal.SIGKILL)

        last = await client.flush("items", wait=True, timeout=FLUSH_TIMEOUT)
        assert last.waited

    keys_read = table_keys(standalone)
    expected = sorted(set(range(ROWS)) - deleted)
    assert len(keys_read) == len(set(keys_read)), "a row was read twice"
    assert keys_read == expected

    # The WAL below the checkpoints is gone: every pchannel lost its oldest
    # segment files of before the first flush.
    def truncated() -> bool:
        after = segment_files(wal_dir)
        gone = {p: set(before[p]) - set(after.get(p, [])) for p in before if before[p]}
        return bool(gone) and all(gone.values())

    try:
        await until(truncated, 120.0)
    except TimeoutError:
        report = await status(standalone.url, "default")
        pytest.fail(f"not truncated: {before} -> {segment_files(wal_dir)}; {report['pchannels']}")
    log = (standalone.data_dir / "logs" / "flush-runner.log").read_text()
    assert log.count("headrace flush runner ready") >= 2, log

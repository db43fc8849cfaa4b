"""The property of issue #15: a reader reading a collection in a loop while
inserts, deletes, flushes, compactions (after every flush round, every shard)
and snapshot expiry with orphan collection run never sees a duplicate key, a
deleted row or a missing acknowledged row.

Each read is checked against the producer's own record: every acknowledged
insert and delete with the timetick the WAL gave it. A read at ``as_of``
must equal the state after exactly the operations at or before ``as_of``;
a "latest" read's ``as_of`` must be at or past every operation acknowledged
before the read began. Reads at an ``as_of`` older than the current
checkpoints go back to an older snapshot (or, once it is expired, to the WAL
alone); "latest" reads use the current snapshot and the tail after it.

Real streaming nodes and WAL, the real flush job and commit and the real
compaction job and its conditional commit (both run in-process,
``tests/client/reads.py``), the real expiry and orphan collection with the
reader pins, pyiceberg reading.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from headrace.client import HeadraceClient
from headrace.client.routing import shards_of
from headrace.table import CatalogConfig, TableCatalog
from headrace.table.expiry import RetentionOptions
from headrace.table.maintenance import maintain
from spark_apps.compact import CompactJob, Outcome, run_in
from spark_apps.compact_schedule import CompactionPolicy, Selection
from tests.client.reads import SerialSpark, flush_now
from tests.node.harness import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("v", pa.int64())])
SHARDS = 2
KEYS = 400
OPS = 300
EVERYTHING_GOES = RetentionOptions(max_snapshot_age_s=0, min_snapshots=1, orphan_grace_s=0)
SMALL_FILES = CompactionPolicy(target_file_bytes=2**20, small_file_bytes=2**20)


@dataclasses.dataclass(frozen=True)
class Acked:
    timetick: int
    keys: tuple[int, ...]
    version: int | None
    """None: a delete."""


@dataclasses.dataclass(frozen=True)
class Seen:
    as_of: int
    acked_before: int
    """The largest timetick acknowledged before the read began."""
    rows: dict[int, int]
    how: str


def expected_at(record: list[Acked], as_of: int) -> dict[int, int]:
    rows: dict[int, int] = {}
    for op in sorted(record, key=lambda o: o.timetick):
        if op.timetick > as_of:
            break
        for key in op.keys:
            if op.version is None:
                rows.pop(key, None)
            else:
                rows[key] = op.version
    return rows


def by_key(table: pa.Table, how: str) -> dict[int, int]:
    keys = table.column("pk").to_pylist()
    assert len(keys) == len(set(keys)), f"{how}: a key read twice"
    return dict(zip(keys, table.column("v").to_pylist(), strict=True))


async def produce(client: HeadraceClient, record: list[Acked], rng: random.Random) -> None:
    """Inserts of keys not live and deletes of live ones (a key comes back
    with a new version after its delete): an insert of a live key is not an
    upsert in the table (see docs/pipeline.md, "Snapshot reads")."""
    live: set[int] = set()
    async with client.producer() as producer:
        for version in range(1, OPS + 1):
            deleting = bool(live) and rng.random() < 0.35
            pool = sorted(live) if deleting else sorted(set(range(KEYS)) - live)
            keys = pa.array(rng.sample(pool, min(len(pool), rng.randint(1, 12))), pa.int64())
            shard = shards_of(keys, SHARDS)
            for s in range(SHARDS):
                mine = keys.filter(pc.equal(shard, s))
                if not len(mine):
                    continue
                if deleting:
                    written = await producer.delete("items", mine)
                    live.difference_update(mine.to_pylist())
                else:
                    rows = pa.table({"pk": mine, "v": pa.array([version] * len(mine))}, SCHEMA)
                    written = await producer.insert("items", rows)
                    live.update(mine.to_pylist())
                (result,) = written.results  # one message: its timetick is every key's
                value = None if deleting else version
                record.append(Acked(result.timetick, tuple(mine.to_pylist()), value))
            await asyncio.sleep(rng.random() * 0.02)


@dataclasses.dataclass
class Rounds:
    flushes: int = 0
    compactions: int = 0
    """Compactions that committed (merged files)."""


def compact_all(config: CatalogConfig) -> int:
    """Compact every shard of ``items`` (the real job, tasks run here); how
    many committed."""
    committed = 0
    for shard in range(SHARDS):
        job = CompactJob(
            catalog=config,
            collection="items",
            shard=shard,
            run_id=uuid.uuid4().hex[:12],
            selection=Selection.ALL,
            policy=SMALL_FILES,
        )
        result = run_in(SerialSpark(), job)  # type: ignore[arg-type]
        committed += result.outcome is Outcome.COMMITTED
    return committed


async def flush_compact_and_expire(
    cluster: Cluster, client: HeadraceClient, warehouse: Path, done: asyncio.Event
) -> Rounds:
    """Flush, compact every shard, then expire snapshots and collect orphans
    as fast as the pins allow, round after round until ``done``."""
    config = CatalogConfig(cluster.url, str(warehouse), cluster.keys.cluster)
    rounds = Rounds()
    with TableCatalog.open(config) as catalog:
        while not done.is_set():
            await flush_now(cluster, client, warehouse, "items")
            rounds.flushes += 1
            rounds.compactions += await asyncio.to_thread(compact_all, config)
            pins = await asyncio.to_thread(catalog.reader_pins)
            await asyncio.to_thread(
                maintain, catalog, "items", EVERYTHING_GOES, pins.get("items", frozenset())
            )
            await asyncio.sleep(0.3)
    return rounds


async def read_in_a_loop(
    client: HeadraceClient, record: list[Acked], done: asyncio.Event, rng: random.Random
) -> list[Seen]:
    seen: list[Seen] = []
    while not done.is_set():
        acked_before = max((op.timetick for op in record), default=0)
        choice = rng.random()
        if choice < 0.4 or not record:
            async with client.snapshot_read("items") as reading:
                rows = by_key(await reading.table(), "latest")
                seen.append(Seen(reading.planned.as_of, acked_before, rows, "latest"))
        elif choice < 0.7:
            as_of = rng.choice(record).timetick
            how = f"as_of={as_of}"
            seen.append(Seen(as_of, 0, by_key(await client.read("items", as_of=as_of), how), how))
        else:
            as_of = acked_before
            batches = [b async for b in client.read_batches("items", as_of=as_of)]
            how = f"batches as_of={as_of}"
            table = pa.Table.from_batches(batches, SCHEMA)
            seen.append(Seen(as_of, 0, by_key(table, how), how))
    return seen


async def test_a_reader_in_a_loop_matches_the_producers_record(
    served: Cluster, tmp_path: Path
) -> None:
    rng = random.Random(15)
    record: list[Acked] = []
    done = asyncio.Event()
    async with HeadraceClient(served.url, served.keys.cluster) as client:
        await client.create_collection("items", SCHEMA, "pk", shards=SHARDS)
        flusher = asyncio.create_task(
            flush_compact_and_expire(served, client, tmp_path / "wh", done)
        )
        reader = asyncio.create_task(read_in_a_loop(client, record, done, random.Random(1)))
        try:
            await produce(client, record, rng)
            await asyncio.sleep(1.0)
        finally:
            done.set()
        rounds = await flusher
        seen = await reader
        final = await client.read("items")

    assert rounds.flushes >= 3, f"only {rounds.flushes} flush rounds ran"
    assert rounds.compactions >= 1, "no compaction committed while the reader read"
    assert len(seen) >= 10, f"only {len(seen)} reads"
    for read in seen:
        assert read.as_of >= read.acked_before, f"{read.how}: as_of before an acknowledged op"
        expected = expected_at(record, read.as_of)
        missing = sorted(set(expected) - set(read.rows))
        extra = sorted(set(read.rows) - set(expected))
        stale = sorted(k for k in expected if k in read.rows and read.rows[k] != expected[k])
        assert not (missing or extra or stale), (
            f"{read.how}: missing acknowledged {missing[:10]}, deleted or never written "
            f"{extra[:10]}, old version {stale[:10]}"
        )
    assert by_key(final, "final") == expected_at(record, max(op.timetick for op in record))
    kinds = {read.how.split(" ")[0].split("=")[0] for read in seen}
    assert kinds == {"latest", "as_of", "batches"}, kinds

"""A table test bed for compaction: a SQLite metastore, a local warehouse, a
recorded collection and flush commits made directly through the catalog (no
nodes: the flush commit's guards are the real ones)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace.client.routing import shards_of, split_by_shard
from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.metastore.factory import open_metastore
from headrace.table import (
    CatalogConfig,
    Checkpoint,
    FlushCommit,
    SegmentRecord,
    TableCatalog,
    TableChanges,
    WalRange,
)
from headrace.table.collections import CollectionSpec, CollectionStore
from tests.table import duck

P = "pchannel-000"
NAME = "orders"
SCHEMA = pa.schema(
    [
        pa.field("pk", pa.int64(), nullable=False),
        pa.field("name", pa.string()),
        pa.field("score", pa.float64()),
    ]
)


def rows(pks: list[int], tag: str = "n") -> pa.Table:
    return pa.table(
        {"pk": pks, "name": [f"{tag}{pk}" for pk in pks], "score": [pk / 2 for pk in pks]},
        schema=SCHEMA,
    )


def shard_of(pk: int, shards: int) -> int:
    return int(shards_of(pa.array([pk], pa.int64()), shards)[0].as_py())


@dataclasses.dataclass
class Bed:
    config: CatalogConfig
    shards: int
    position: int = 0
    segment: int = 0

    @property
    def keys(self) -> Keys:
        return Keys(self.config.cluster)

    def open(self) -> TableCatalog:
        return TableCatalog.open(self.config)

    def flush(
        self, catalog: TableCatalog, inserts: pa.Table | None, deletes: tuple[int, ...] = ()
    ) -> str:
        """One flush: a file per shard of ``inserts``, ``deletes`` applied to
        the rows committed before; the table's metadata file after."""
        start = f"local:{self.position}" if self.position else ""
        self.position += 10
        changes_files: list[str] = []
        segments: list[SegmentRecord] = []
        parts = {} if inserts is None else split_by_shard(inserts, "pk", self.shards)
        for shard, part in parts.items():
            self.segment += 1
            name = f"flush-{P}-s{self.segment}-{uuid.uuid4().hex[:8]}"
            changes_files.append(catalog.write_data_file(NAME, part.sort_by("pk"), name))
            segments.append(
                SegmentRecord(
                    segment_id=self.segment,
                    vchannel=f"{NAME}-{shard}",
                    start=f"local:{self.position - 9}",
                    end=f"local:{self.position}",
                    rows=part.num_rows,
                )
            )
        commit = FlushCommit(
            pchannel=P,
            launch_term=1,
            wal_range=WalRange(start, f"local:{self.position}"),
            checkpoint=Checkpoint(f"local:{self.position}", timetick=self.position * 10),
            tables=(TableChanges(NAME, tuple(changes_files), deletes, tuple(segments)),),
        )
        catalog.commit_flush(commit)
        return catalog.table(NAME).metadata_location

    def many_files(self, catalog: TableCatalog, shard: int, files: int, per_file: int) -> list[int]:
        """``files`` tiny files of ``shard`` in one flush commit; their keys."""
        location = catalog.iceberg_table(NAME).location().removeprefix("file://")
        Path(location, "data").mkdir(parents=True, exist_ok=True)
        keys: list[int] = []
        candidate = 0
        paths = []
        for index in range(files):
            mine: list[int] = []
            while len(mine) < per_file:
                candidate += 1
                if shard_of(candidate, self.shards) == shard:
                    mine.append(candidate)
            keys.extend(mine)
            path = f"{location}/data/flush-{P}-many-{index:05d}-{uuid.uuid4().hex[:8]}.parquet"
            pq.write_table(rows(mine), path)
            paths.append(f"file://{path}")
        start = f"local:{self.position}" if self.position else ""
        self.position += 10
        self.segment += 1
        segment = SegmentRecord(
            segment_id=self.segment,
            vchannel=f"{NAME}-{shard}",
            start=f"local:{self.position - 9}",
            end=f"local:{self.position}",
            rows=len(keys),
        )
        catalog.commit_flush(
            FlushCommit(
                pchannel=P,
                launch_term=1,
                wal_range=WalRange(start, f"local:{self.position}"),
                checkpoint=Checkpoint(f"local:{self.position}", timetick=self.position * 10),
                tables=(TableChanges(NAME, tuple(paths), (), (segment,)),),
            )
        )
        return keys

    def duckdb(self, metadata_location: str) -> list[tuple[Any, ...]]:
        return duck.iceberg_rows(metadata_location)


async def _prepare(config: CatalogConfig, shards: int) -> None:
    keys = Keys(config.cluster)
    async with await open_metastore(config.metastore_url) as store:
        record = Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=1, node="node-1")
        await store.put(keys.pchannel(P), record.to_json())
        await CollectionStore(store, keys).create(CollectionSpec(NAME, SCHEMA, "pk", shards))


def make_bed(tmp_path: Path, shards: int = 2) -> Bed:
    config = CatalogConfig(
        f"sqlite:///{tmp_path / 'meta.db'}", str(tmp_path / "warehouse"), cluster="compact"
    )
    asyncio.run(_prepare(config, shards))
    bed = Bed(config, shards)
    with bed.open() as catalog:
        catalog.create_table(NAME, SCHEMA, "pk")
    return bed


def expected(named: dict[int, str]) -> list[tuple[Any, ...]]:
    """The rows of ``named``: key -> name."""
    return sorted((pk, name, pk / 2) for pk, name in named.items())

"""The operator's compaction run: one round over the shards whose vchannels
route to one pchannel, decided by the same policy as the flush runner's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from headrace.cluster import NEW_CLUSTER_ROUTING, ClusterConfig, route
from headrace.metastore.factory import open_metastore
from spark_apps import compact_pchannel
from spark_apps.compact import Outcome
from tests.spark_apps.compact_bed import NAME, Bed, expected, make_bed, shard_of

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PCHANNELS = [f"pchannel-{i:03d}" for i in range(8)]


async def _configure(bed: Bed) -> None:
    async with await open_metastore(bed.config.metastore_url) as store:
        config = ClusterConfig(pchannels=PCHANNELS, routing=NEW_CLUSTER_ROUTING)
        await store.put(bed.keys.config, config.to_json())


def test_a_round_compacts_only_the_shards_on_its_pchannel(
    spark: SparkSession, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bed = make_bed(tmp_path, 4)
    asyncio.run(_configure(bed))
    on = {s: route(f"{NAME}-{s}", PCHANNELS, NEW_CLUSTER_ROUTING) for s in range(4)}
    target = on[0]
    mine = {s for s, p in on.items() if p == target}
    keys: list[int] = []
    with bed.open() as catalog:
        for shard in range(4):
            keys += bed.many_files(catalog, shard, files=5, per_file=3)
    before = _files_per_shard(bed)
    assert all(count == 5 for count in before.values()), before
    argv = [
        "--metastore",
        bed.config.metastore_url,
        "--cluster",
        bed.config.cluster,
        "--pchannel",
        target,
        "--warehouse",
        bed.config.warehouse,
        "--master",
        "local[2]",
        "--min-small-files",
        "4",
        "--target-file-bytes",
        str(2**20),
        "--small-file-bytes",
        str(2**19),
    ]
    job, _master = compact_pchannel.parse_args(argv)
    # The session fixture's Spark, not main()'s own (main stops the session it made).
    results = compact_pchannel.run_round(job, lambda: spark)
    assert sorted(r.shard for r in results) == sorted(mine)
    assert {r.outcome for r in results} == {Outcome.COMMITTED}
    after = _files_per_shard(bed)
    assert after == {s: 1 if s in mine else 5 for s in range(4)}, (after, on)
    with bed.open() as catalog:
        location = catalog.table(NAME).metadata_location
    assert bed.duckdb(location) == expected({pk: f"n{pk}" for pk in keys})
    # Nothing due any more on that pchannel: a second round compacts nothing
    # (and, with nothing due, main() prints it without starting Spark at all).
    assert compact_pchannel.main(argv) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report == {"pchannel": target, "compactions": []}


def _files_per_shard(bed: Bed) -> dict[int, int]:
    """Shard -> its live data files (by the shard of each file's first key)."""
    counts: dict[int, int] = {}
    with bed.open() as catalog:
        for task in catalog.iceberg_table(NAME).scan().plan_files():
            path = task.file.file_path.removeprefix("file://")
            first = pq.read_table(path, columns=["pk"]).column("pk")[0].as_py()
            shard = shard_of(first, bed.shards)
            counts[shard] = counts.get(shard, 0) + 1
    return counts

"""The flush runner's compaction rounds: triggers read from a real table and
metastore, a ``headrace compact`` request served and marked DONE, the jobs run
in the runner's (shared) Spark session; DuckDB reads the result."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from headrace.client.compacting import request_compaction, wait_compacted
from headrace.metastore.factory import open_metastore
from headrace.table.records import CompactionState, ShardCompaction, shard_compaction_key
from spark_apps.compact import Outcome
from spark_apps.compact_schedule import (
    Compact,
    CompactionPolicy,
    Failures,
    Hold,
    Selection,
    next_compaction,
)
from spark_apps.compactor import CompactorOptions, read_facts, shard_states
from spark_apps.runner import FlushRunner, RunnerOptions
from tests.spark_apps.compact_bed import NAME, expected, make_bed, rows

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


async def test_a_request_is_served_and_the_small_file_trigger_fires(
    spark: SparkSession, tmp_path: Path
) -> None:
    bed = await asyncio.to_thread(make_bed, tmp_path, 2)
    with bed.open() as catalog:
        for batch in range(3):
            bed.flush(catalog, rows(list(range(batch * 20, batch * 20 + 20))))
        bed.flush(catalog, None, deletes=(4, 25))
    policy = CompactionPolicy(
        target_file_bytes=2**20, small_file_bytes=2**19, min_small_files=4, max_input_files=50
    )
    options = RunnerOptions(
        metastore_url=bed.config.metastore_url,
        warehouse=bed.config.warehouse,
        cluster=bed.config.cluster,
        compaction=CompactorOptions(interval_s=3600, policy=policy),
    )
    stop = asyncio.Event()
    async with await open_metastore(bed.config.metastore_url) as store:
        runner = FlushRunner(options, lambda: spark, store)

        async def round_() -> list[Outcome]:
            ran = await runner.compactor.round(
                runner.session, lambda work, group, what: runner.guarded(work, group, what, stop)
            )
            return [r.outcome for r in ran]

        # 3 small files per shard: below the trigger (4); nothing is compacted
        assert await round_() == []
        request = await request_compaction(store, runner.keys, NAME)
        assert await round_() == [Outcome.COMMITTED, Outcome.COMMITTED]
        assert await round_() == []  # nothing left: the request is DONE
        done = await wait_compacted(store, runner.keys, request, timeout=5)
        assert done.state is CompactionState.DONE
        with bed.open() as catalog:
            location = catalog.table(NAME).metadata_location
            assert bed.duckdb(location) == expected(
                {pk: f"n{pk}" for pk in range(60) if pk not in (4, 25)}
            )
            # four more flushes: the small-file trigger (4 files per shard) fires by itself
            for batch in range(3, 6):
                bed.flush(catalog, rows(list(range(batch * 20, batch * 20 + 20))))
        runner.compactor.due = 0.0
        assert await round_() == [Outcome.COMMITTED, Outcome.COMMITTED]
        with bed.open() as catalog:
            assert bed.duckdb(catalog.table(NAME).metadata_location) == expected(
                {pk: f"n{pk}" for pk in range(120) if pk not in (4, 25)}
            )


async def test_the_delete_ratio_counts_deletes_since_the_last_compaction(tmp_path: Path) -> None:
    """Rows deleted = rows the shard's flushes wrote - its live rows - that
    difference at its last compaction (no Spark: the states alone)."""
    bed = await asyncio.to_thread(make_bed, tmp_path, 1)
    with bed.open() as catalog:
        bed.flush(catalog, rows(list(range(100))))
        bed.flush(catalog, None, deletes=tuple(range(30)))
    async with await open_metastore(bed.config.metastore_url) as store:
        facts = await read_facts(store, bed.keys, {})
        with bed.open() as catalog:
            (state,) = shard_states(catalog, facts, CompactionPolicy(), {})
        assert (state.live_rows, state.deleted_rows) == (70, 30)
        step = next_compaction(state, CompactionPolicy(), Failures(), time.time(), 0.0)
        assert isinstance(step, Hold)  # one file: nothing to merge, whatever the ratio
        last = ShardCompaction(
            collection=NAME, shard=0, at=time.time(), snapshot_id=1, deleted=30, live_rows=70
        )
        await store.put(shard_compaction_key(bed.keys, NAME, 0), last.to_json())
        with bed.open() as catalog:
            bed.flush(catalog, rows(list(range(100, 110))), deletes=(50, 51, 52))
        facts = await read_facts(store, bed.keys, {})
        with bed.open() as catalog:
            (state,) = shard_states(catalog, facts, CompactionPolicy(), {})
        assert (state.files, state.live_rows, state.deleted_rows) == (2, 77, 3)
        step = next_compaction(
            state, CompactionPolicy(max_delete_ratio=0.03), Failures(), time.time(), 0.0
        )
        assert isinstance(step, Compact) and step.selection is Selection.ALL

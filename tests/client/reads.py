"""Helpers of the snapshot read tests: flushes run in-process.

:func:`flush_now` runs the real flush job (:func:`spark_apps.flush.run_in`:
the real range reads, fold, Parquet files and term-guarded commit) with
Spark's task distribution replaced by a loop in this process
(:class:`SerialSpark`), so that a test flushes in a second instead of
starting a JVM. The standalone's Spark runner is exercised by
``tests/spark_apps``.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from headrace.client import HeadraceClient
from headrace.cluster import Assignment
from headrace.table import CatalogConfig, CheckpointRecord, SealRecord
from headrace.table.records import seal_key
from spark_apps.flush import run_in
from spark_apps.shard import RangeJob
from tests.node.harness import Cluster


class _Mapped:
    def __init__(self, items: list[Any]) -> None:
        self.items = items

    def map(self, fn: Callable[[Any], Any]) -> _Mapped:
        return _Mapped([fn(item) for item in self.items])

    def collect(self) -> list[Any]:
        return self.items


class _Context:
    def setJobGroup(self, *args: object, **kwargs: object) -> None:
        return None

    def parallelize(self, items: Iterable[Any], slices: int) -> _Mapped:
        return _Mapped(list(items))


class SerialSpark:
    """What :func:`run_in` uses of a SparkSession, running each task here."""

    sparkContext = _Context()


async def flush_now(
    cluster: Cluster, client: HeadraceClient, warehouse: Path, collection: str
) -> None:
    """Seal ``collection``'s growing segments and flush every pchannel up to
    its seal record, like the standalone's runner."""
    outcome = await client.flush(collection, wait=False)
    keys = cluster.keys
    for pchannel, target in outcome.targets.items():
        async with asyncio.timeout(60):
            while True:
                kv = await cluster.metastore.get(seal_key(keys, pchannel))
                seal = None if kv is None else SealRecord.from_json(kv.value)
                if seal is not None and not seal.position_id() < target:
                    break
                await asyncio.sleep(0.02)
        kv = await cluster.metastore.get(keys.checkpoint(pchannel))
        start = "" if kv is None else CheckpointRecord.from_json(kv.value).position
        if start == seal.position:
            continue
        record = await cluster.record(pchannel)
        assert isinstance(record, Assignment)
        job = RangeJob(
            cluster=keys.cluster,
            metastore_url=cluster.url,
            pchannel=pchannel,
            term=record.term,
            start=start,
            end=seal.position,
            catalog=CatalogConfig(cluster.url, str(warehouse), keys.cluster),
            attempt=uuid.uuid4().hex[:12],
            read_idle_timeout_s=30.0,
        )
        await asyncio.to_thread(run_in, SerialSpark(), job)  # type: ignore[arg-type]

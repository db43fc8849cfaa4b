"""A collection on the Kafka WAL through ``headrace standalone``: the flush
commits the rows (DuckDB reads them back) and the owner then deletes the
flushed records from the topics (the low watermark moves)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace.client import HeadraceClient
from headrace.wal import registry
from headrace.wal.contract import Backend
from tests.cli.standalone_proc import Standalone
from tests.node.test_retention_node import kafka_low_watermark
from tests.spark_apps.test_collection_end_to_end import SCHEMA, chunk, table_keys

pytestmark = [pytest.mark.slow, pytest.mark.kafka, pytest.mark.timeout(900)]

PCHANNELS = 2


@pytest.fixture
def cluster_name() -> str:
    return f"kafkaflush{uuid.uuid4().hex[:8]}"


@pytest.fixture
def standalone(tmp_path: Path, kafka_bootstrap: str, cluster_name: str) -> Iterator[Standalone]:
    running = Standalone(
        tmp_path / "data",
        nodes=1,
        pchannels=PCHANNELS,
        extra=[
            *("--cluster", cluster_name, "--wal", "kafka", "--kafka-bootstrap", kafka_bootstrap),
            *("--truncate-margin-s", "0", "--truncate-margin-bytes", "0"),
            *("--housekeeping-interval-s", "1"),
        ],
    ).require_ready()
    yield running
    running.kill_all()


async def test_a_flushed_collection_moves_the_kafka_low_watermarks(
    standalone: Standalone, kafka_bootstrap: str, cluster_name: str
) -> None:
    backend: Backend = registry.create(
        "kafka", bootstrap_servers=kafka_bootstrap, cluster=cluster_name
    )
    async with HeadraceClient(standalone.url, cluster_name) as client:
        items = await client.create_collection("items", SCHEMA, shards=PCHANNELS)
        pchannels = sorted({client.route(v) for v in items.vchannels})
        assert len(pchannels) == PCHANNELS
        async with client.producer() as producer:
            for start in range(0, 20_000, 5_000):
                await producer.insert(items, chunk(start, 5_000))
            await producer.delete("items", list(range(0, 20_000, 7)))
        lows = {p: await asyncio.to_thread(kafka_low_watermark, backend, p) for p in pchannels}
        assert await client.flush("items", wait=True, timeout=600)
    expected = sorted(set(range(20_000)) - set(range(0, 20_000, 7)))
    assert table_keys(standalone, cluster_name) == expected

    async with asyncio.timeout(120):
        while True:
            now = {p: await asyncio.to_thread(kafka_low_watermark, backend, p) for p in pchannels}
            if all(now[p] > lows[p] for p in pchannels):
                break
            await asyncio.sleep(0.5)

"""Retention, truncation and back-pressure through a real streaming node.

The flush is simulated by writing the channel checkpoint with
:class:`headrace.coordinator.checkpoint.CheckpointWriter`, as the flush
commit does last.
"""

from __future__ import annotations

import asyncio
import dataclasses
import io
import uuid
from collections.abc import AsyncIterator
from contextlib import redirect_stdout
from pathlib import Path

import pyarrow as pa
import pytest

from headrace import errors
from headrace.cli.main import main as cli_main
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.status import status
from headrace.cluster import NEW_CLUSTER_ROUTING, Assignment, AssignmentState, ClusterConfig
from headrace.coordinator.checkpoint import CheckpointWriter
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.node.housekeeping import collections_on, owns
from headrace.node.server import NodeConfig, StreamingNode
from headrace.table import messages
from headrace.table.collections import Collection, CollectionSpec, CollectionStore, Dropped
from headrace.wal.api import AppendResult
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import LocalBackend, files
from headrace.wal.progress import RetentionOptions
from tests.node.harness import Cluster, make_cluster, scrape, until

P = "pchannel-000"
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("v", pa.string())])
FAST = RetentionOptions(
    max_age_s=0.001, max_bytes=None, margin_s=0, margin_bytes=0, pass_interval_s=0.05
)
"""Retention lets everything go at once: only the checkpoint holds data back."""


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


async def orders(cluster: Cluster) -> Collection:
    return await CollectionStore(cluster.metastore, cluster.keys).create(
        CollectionSpec("orders", SCHEMA, "pk", shards=1)
    )


def rows(start: int, count: int = 4) -> pa.Table:
    keys = list(range(start, start + count))
    return pa.table({"pk": pa.array(keys, pa.int64()), "v": [f"value-{k:06d}" * 4 for k in keys]})


async def start_node(
    cluster: Cluster,
    options: RetentionOptions,
    backend: Backend | None = None,
    metrics_listen: str = "",
) -> StreamingNode:
    if backend is None:
        return await cluster.start_node(
            "node-a", wal_options=WALOptions(timetick_interval_ms=20, retention=options)
        )
    config = NodeConfig(
        node_id="node-a",
        metastore_url=cluster.url,
        cluster=cluster.keys.cluster,
        wal_backend=backend.name,
        wal_options=WALOptions(timetick_interval_ms=20, retention=options),
        session_ttl=3.0,
        shutdown_grace=0.5,
        metrics_listen=metrics_listen,
    )
    node = StreamingNode(config, backend=backend)
    await node.start()
    cluster.nodes["node-a"] = node
    return node


def held(node: StreamingNode) -> WAL:
    assert node.manager is not None
    wal = node.manager.held[P]
    assert isinstance(wal, WAL)
    return wal


async def insert_many(wal: WAL, collection: Collection, count: int) -> list[AppendResult]:
    results = []
    for i in range(count):
        msg = messages.insert(collection, "orders-0", 1, rows(i * 4))
        results.append(await wal.append(msg))
    return results


async def checkpoint(cluster: Cluster, at: AppendResult, term: int = 1) -> None:
    writer = CheckpointWriter(cluster.metastore, cluster.keys.cluster, P, "node-a", term)
    await writer.write_checkpoint(at.id, at.timetick)


def reason(node: StreamingNode) -> str:
    assert node.housekeeper is not None
    decision = node.housekeeper.decisions.get(P)
    return decision.reason if decision is not None else ""


async def test_local_segments_below_the_checkpoint_are_deleted(
    cluster: Cluster, tmp_path: Path
) -> None:
    backend = LocalBackend(str(tmp_path / "wal"), segment_bytes=2048)
    await cluster.configure([P])
    collection = await orders(cluster)
    node = await start_node(cluster, FAST, backend, metrics_listen="127.0.0.1:0")
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    results = await insert_many(wal, collection, 60)
    directory = str(tmp_path / "wal" / P)
    before = files.list_segments(directory)
    assert len(before) > 5
    first = await backend.earliest(P)

    # A collection lives here and nothing was flushed: nothing goes.
    await until(lambda: "orders has a shard here and no checkpoint yet" in reason(node))
    await asyncio.sleep(0.2)
    assert set(before) <= set(files.list_segments(directory))  # ticks may add some
    assert await backend.earliest(P) == first

    target = results[40]
    await checkpoint(cluster, target)
    await until(lambda: "the checkpoint" in reason(node))
    await until(lambda: before[0] not in files.list_segments(directory))
    await moved(backend, first)
    await asyncio.sleep(0.2)  # the pass deletes the files in a thread
    earliest = await backend.earliest(P)
    assert earliest is not None and first is not None
    assert first < earliest <= target.id
    after = files.list_segments(directory)
    assert len(set(before) - set(after)) > 2, (before, after)
    # the segment holding the checkpoint is kept: a flush resumes right after it
    reader = await backend.open_reader(P, StartPosition.at(target.id))
    try:
        batch = await reader.next_batch(1, timeout=5)
    finally:
        await reader.close()
    assert batch[0].id == target.id

    report = await wait_status(cluster, lambda row: row["truncated_below"] == str(target.id))
    assert report["checkpoint"] == str(target.id)
    # Unflushed bytes are counted from the first sample at or after the
    # checkpoint (samples are >= 50 ms apart, so the 60 quick inserts above may
    # share one): data appended later always counts.
    await asyncio.sleep(0.1)
    await insert_many(wal, collection, 3)
    report = await wait_status(
        cluster, lambda row: isinstance(row["unflushed_bytes"], int) and row["unflushed_bytes"] > 0
    )

    out = io.StringIO()
    with redirect_stdout(out):
        code = await asyncio.to_thread(
            cli_main, ["status", "--metastore", cluster.url, "--cluster", cluster.keys.cluster]
        )
    assert code == 0
    text = out.getvalue()
    assert "CHECKPOINT" in text and "UNFLUSHED" in text and "TRUNCATED_BELOW" in text
    assert str(target.id) in text
    await check_scraped(node)


async def check_scraped(node: StreamingNode) -> None:
    """The node's metrics say what ``headrace status`` says: truncated, unflushed."""
    assert node.metrics_server is not None
    samples = await asyncio.to_thread(scrape, node.metrics_server.address)
    on_p = (("pchannel", P),)
    assert samples[("headrace_wal_truncations_total", on_p)] >= 1
    assert samples[("headrace_wal_unflushed_bytes", on_p)] > 0
    assert samples[("headrace_flush_lag_seconds", on_p)] >= 0


async def moved(backend: Backend, first: MessageID | None) -> MessageID | None:
    """The backend's earliest id once it is past ``first`` (a pass is under way)."""
    async with asyncio.timeout(20):
        while True:
            earliest = await backend.earliest(P)
            if earliest != first:
                return earliest
            await asyncio.sleep(0.05)


async def wait_status(cluster: Cluster, condition: object) -> dict[str, object]:
    assert callable(condition)
    async with asyncio.timeout(20):
        while True:
            report = await status(cluster.url, cluster.keys.cluster)
            rows_ = report["pchannels"]
            assert isinstance(rows_, list)
            row = next(r for r in rows_ if r["pchannel"] == P)
            if condition(row):
                return dict(row)
            await asyncio.sleep(0.05)


DEFAULT_RETENTION = RetentionOptions(margin_s=0, margin_bytes=0, pass_interval_s=0.05)
"""The default retention (opaque data kept 7 days), no safety margin, quick passes."""


async def test_collection_only_pchannel_is_truncated_below_the_checkpoint_by_default(
    cluster: Cluster, tmp_path: Path
) -> None:
    """Issue #12: a pchannel carrying only collection data is truncated below
    its flush checkpoint with the default 7-day retention of opaque data."""
    backend = LocalBackend(str(tmp_path / "wal"), segment_bytes=2048)
    await cluster.configure([P])
    collection = await orders(cluster)
    node = await start_node(cluster, DEFAULT_RETENTION, backend)
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    results = await insert_many(wal, collection, 60)
    directory = str(tmp_path / "wal" / P)
    before = files.list_segments(directory)
    first = await backend.earliest(P)

    target = results[40]
    await checkpoint(cluster, target)
    await until(lambda: "the checkpoint" in reason(node))
    await moved(backend, first)
    await asyncio.sleep(0.2)  # the pass deletes the files in a thread
    earliest = await backend.earliest(P)
    assert earliest is not None and first is not None
    assert first < earliest <= target.id
    assert before[0] not in files.list_segments(directory)


async def test_an_opaque_record_holds_truncation_back_until_retention_lets_it_go(
    cluster: Cluster, tmp_path: Path
) -> None:
    """One opaque record amid collection data: the pchannel is not truncated
    past it while it is younger than the retention age, then it goes."""
    backend = LocalBackend(str(tmp_path / "wal"), segment_bytes=2048)
    await cluster.configure([P])
    collection = await orders(cluster)
    max_age_s = 4.0
    options = dataclasses.replace(DEFAULT_RETENTION, max_age_s=max_age_s)
    node = await start_node(cluster, options, backend)
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    await insert_many(wal, collection, 10)
    opaque = await wal.append(Message(MessageType.INSERT, "logs-0", b"x" * 500))
    written = asyncio.get_running_loop().time()
    results = await insert_many(wal, collection, 50)

    target = results[40]
    await checkpoint(cluster, target)
    await until(lambda: f"opaque record {opaque.id}" in reason(node))
    assert asyncio.get_running_loop().time() - written < max_age_s, "the machine was too slow"
    earliest = await backend.earliest(P)
    assert earliest is not None and earliest <= opaque.id
    assert node.housekeeper is not None
    held_at = node.housekeeper.decisions[P].below
    assert held_at is None or held_at <= opaque.id

    await until(lambda: "the checkpoint" in reason(node))
    await moved(backend, earliest)
    await asyncio.sleep(0.2)  # the pass deletes the files in a thread
    gone = await backend.earliest(P)
    assert gone is not None and opaque.id < gone <= target.id


async def test_opaque_pchannel_is_truncated_by_retention_bytes(cluster: Cluster) -> None:
    """No collection on the pchannel: retention alone bounds it (here: keep
    the newest 4 KiB), and its appends are never slowed or refused."""
    await cluster.configure([P])
    options = RetentionOptions(
        max_age_s=None,
        max_bytes=4096,
        margin_s=0,
        margin_bytes=0,
        pass_interval_s=0.05,
        soft_bytes=1,
        hard_bytes=2,
    )
    node = await start_node(cluster, options)
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    results = []
    for _ in range(40):
        results.append(await wal.append(Message(MessageType.INSERT, "logs-0", b"x" * 500)))
        await asyncio.sleep(0.06)  # past the position log's gap: every append is sampled
    assert node.housekeeper is not None
    decisions = node.housekeeper.decisions

    def truncating() -> bool:
        below = decisions[P].below if P in decisions else None
        return below is not None and below > results[0].id

    await until(truncating)
    below = decisions[P].below
    assert below is not None and below < results[-1].id
    assert node.manager is not None
    assert await moved(node.manager.backend, results[0].id) >= below
    # What stays starts at the truncation point itself (it keeps ``below``).
    assert await bytes_from(node, below) >= 4096  # the newest 4 KiB stay


async def test_an_unreachable_metastore_truncates_nothing(cluster: Cluster) -> None:
    await cluster.configure([P])
    await orders(cluster)
    node = await start_node(cluster, FAST)
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    assert node.housekeeper is not None
    housekeeper = node.housekeeper

    class Down:
        async def txn(self, *args: object, **kwargs: object) -> None:
            raise errors.Unavailable("metastore at 127.0.0.1:1 does not answer")

    housekeeper.metastore = Down()  # type: ignore[assignment]
    housekeeper.decisions.clear()
    results = [
        await wal.append(Message(MessageType.INSERT, "logs-0", b"x" * 100)) for _ in range(10)
    ]
    await checkpoint(cluster, results[-2])
    await housekeeper.run_pass()
    assert P not in housekeeper.decisions
    assert node.manager is not None
    assert await node.manager.backend.earliest(P) is not None
    first = await node.manager.backend.earliest(P)
    assert first is not None and first < results[0].id


async def test_appends_of_collection_data_slow_then_fail_until_the_checkpoint_moves(
    cluster: Cluster,
) -> None:
    await cluster.configure([P])
    collection = await orders(cluster)
    options = RetentionOptions(
        max_age_s=None,
        max_bytes=None,
        soft_bytes=2000,
        hard_bytes=6000,
        max_delay_s=0.05,
        pass_interval_s=0.05,
    )
    node = await start_node(cluster, options)
    await cluster.assign(P, "node-a", 1)
    wal = held(node)
    await until(lambda: "no checkpoint yet" in reason(node))

    outcomes = await wal.append_many(
        [messages.insert(collection, "orders-0", 1, rows(i * 4)) for i in range(60)]
    )
    assert all(isinstance(o, AppendResult) for o in outcomes)  # one batch: admitted whole
    assert wal.progress.unflushed_bytes() >= options.hard_bytes
    refused = await wal.append_many(
        [
            messages.insert(collection, "orders-0", 1, rows(1000)),
            Message(MessageType.INSERT, "logs-0", b"opaque"),
            messages.flush_request(collection, "orders-0"),
        ]
    )
    assert isinstance(refused[0], errors.FlushBehind)
    assert refused[0].retryable and refused[0].code is errors.ErrorCode.FLUSH_BEHIND
    assert "flush of pchannel pchannel-000 is behind" in refused[0].message
    # opaque data and seals pass: the flush must be able to catch up
    assert isinstance(refused[1], AppendResult) and isinstance(refused[2], AppendResult)

    async with (
        HeadraceClient(cluster.url, cluster.keys.cluster) as client,
        client.producer(ProducerOptions(deadline=60.0)) as producer,
    ):
        msg = messages.insert(collection, "orders-0", 1, rows(2000))
        send = asyncio.ensure_future(
            producer.send(msg.vchannel, msg.payload, properties=msg.properties)
        )
        await asyncio.sleep(1.0)
        assert not send.done()  # retrying: nothing was written meanwhile
        assert wal.progress.unflushed_bytes() >= options.hard_bytes
        tail = refused[2]
        assert isinstance(tail, AppendResult)
        await checkpoint(cluster, tail)
        result = await asyncio.wait_for(send, 30)
    assert result.id > tail.id
    found = await count_payloads(node, tail.id, msg.payload)
    assert found == 1


async def bytes_from(node: StreamingNode, position: MessageID) -> int:
    """Bytes of the records stored from ``position`` on (itself included)."""
    assert node.manager is not None
    reader = await node.manager.backend.open_reader(P, StartPosition.at(position))
    total = 0
    try:
        while batch := await reader.next_batch(256, timeout=0.5):
            total += sum(len(record.data) for record in batch)
    finally:
        await reader.close()
    return total


async def count_payloads(node: StreamingNode, after: MessageID, payload: bytes) -> int:
    assert node.manager is not None
    reader = await node.manager.backend.open_reader(P, StartPosition.after(after))
    count = 0
    try:
        while batch := await reader.next_batch(256, timeout=0.5):
            count += sum(payload in record.data for record in batch)
    finally:
        await reader.close()
    return count


def kafka_low_watermark(backend: Backend, pchannel: str = P) -> int:
    """The broker's log start offset of ``pchannel``'s topic (blocking)."""
    from headrace.wal.kafka import client as kafka_client  # noqa: PLC0415
    from headrace.wal.kafka.backend import KafkaBackend  # noqa: PLC0415

    assert isinstance(backend, KafkaBackend)
    scan = kafka_client.Scan(backend.settings, backend.settings.topic(pchannel))
    try:
        return scan.watermarks()[0]
    finally:
        scan.close()


@pytest.mark.kafka
@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_kafka_low_watermark_moves_once_a_checkpoint_is_written(
    cluster: Cluster, kafka_bootstrap: str
) -> None:
    from headrace.wal import registry  # noqa: PLC0415
    from headrace.wal.kafka.message_id import KafkaMessageID  # noqa: PLC0415

    backend = registry.create(
        "kafka",
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"headrace.retention-{uuid.uuid4().hex[:10]}.",
    )
    await cluster.configure([P])
    collection = await orders(cluster)
    await start_node(cluster, FAST, backend)
    node = cluster.nodes["node-a"]
    await cluster.assign(P, "node-a", 1)
    results = await insert_many(held(node), collection, 20)
    low = await asyncio.to_thread(kafka_low_watermark, backend)
    await until(lambda: "orders has a shard here and no checkpoint yet" in reason(node))
    assert await asyncio.to_thread(kafka_low_watermark, backend) == low

    target = results[12]
    assert isinstance(target.id, KafkaMessageID)
    await checkpoint(cluster, target)
    async with asyncio.timeout(60):
        while True:
            moved_to = await asyncio.to_thread(kafka_low_watermark, backend)
            if moved_to != low:
                break
            await asyncio.sleep(0.1)
    assert low < moved_to <= target.id.offset
    first = await backend.earliest(P)
    assert first is not None and first <= target.id


@pytest.mark.pulsar
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_pulsar_earliest_moves_once_a_checkpoint_is_written(
    cluster: Cluster, pulsar_url: str
) -> None:
    """Pulsar's own truncation: the backend's mark and the subscription's
    cursor move (the broker's retention then drops whole ledgers below it)."""
    from headrace.wal import registry  # noqa: PLC0415

    backend = registry.create(
        "pulsar", service_url=pulsar_url, topic_prefix=f"retention-{uuid.uuid4().hex[:10]}-"
    )
    await cluster.configure([P])
    collection = await orders(cluster)
    node = await start_node(cluster, FAST, backend)
    await cluster.assign(P, "node-a", 1)
    results = await insert_many(held(node), collection, 20)
    first = await backend.earliest(P)
    await until(lambda: "orders has a shard here and no checkpoint yet" in reason(node))
    assert await backend.earliest(P) == first

    target = results[12]
    await checkpoint(cluster, target)
    async with asyncio.timeout(60):
        while True:
            earliest = await backend.earliest(P)
            if earliest != first:
                break
            await asyncio.sleep(0.1)
    assert first is not None and earliest is not None
    assert first < earliest <= target.id


@pytest.mark.parametrize(
    ("state", "node", "term", "expected"),
    [
        (AssignmentState.ASSIGNED, "node-a", 3, True),
        (AssignmentState.ASSIGNING, "node-a", 3, True),
        (AssignmentState.UNASSIGNING, "node-a", 3, False),
        (AssignmentState.UNASSIGNED, "node-a", 3, False),
        (AssignmentState.ASSIGNED, "node-b", 3, False),
        (AssignmentState.ASSIGNED, "node-a", 4, False),
        (AssignmentState.ASSIGNED, "node-a", 2, False),
    ],
)
def test_only_the_owner_under_the_wal_term_truncates(
    state: AssignmentState, node: str, term: int, expected: bool
) -> None:
    record = Assignment(pchannel=P, state=state, term=term, node=node)
    assert owns(record, "node-a", 3) is expected
    assert owns(None, "node-a", 3) is False


def test_a_dropped_collection_holds_no_pchannel_back() -> None:
    config = ClusterConfig(pchannels=["p-0", "p-1"], routing=NEW_CLUSTER_ROUTING)
    spec = CollectionSpec("orders", pa.schema([pa.field("pk", pa.int64(), nullable=False)]))
    live = Collection(spec, collection_id=1)
    pchannel = config.route(live.vchannels[0])
    assert collections_on(pchannel, (live,), config) == ("orders",)
    dropped = dataclasses.replace(live, dropped=Dropped(at=1.0))
    assert collections_on(pchannel, (dropped,), config) == ()

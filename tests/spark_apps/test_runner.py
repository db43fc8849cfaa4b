"""The flush runner end to end: real streaming nodes, a SQLite metastore, real
local Spark, DuckDB reading the committed table.

The test writes collection messages with :mod:`headrace.table.messages`
(inserts and flush requests); the owner node stamps segments, writes the seals
and the :class:`SealRecord` the runner watches.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from headrace import errors
from headrace.table.records import SealRecord, seal_key, segments_prefix
from spark_apps.runner import FlushRunner, RunnerOptions, read_channels
from spark_apps.schedule import Attempts, Launch, Outcome, RetryPolicy, after, next_step
from tests.node.harness import Cluster, make_cluster
from tests.spark_apps.test_flush_job import (
    P,
    checkpoint,
    create,
    deletes,
    expected,
    inserts,
    seals,
    table_rows,
    write,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DEADLINE = 600.0


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path, name="runner"):
        await c.configure([P])
        await c.start_node("n1")
        await c.assign(P, "n1", term=1)
        yield c


async def sealed_at(cluster: Cluster, position: str, term: int = 1) -> None:
    """Wait for the owner node's SealRecord at ``position`` (the node writes it
    once the seals a flush request asked for are acknowledged)."""
    async with asyncio.timeout(60):
        while True:
            kv = await cluster.metastore.get(seal_key(cluster.keys, P))
            if kv is not None:
                record = SealRecord.from_json(kv.value)
                if record.position == position:
                    assert record.term == term
                    return
            await asyncio.sleep(0.05)


class RunnerProcess:
    """``python -m spark_apps.runner`` in a process group of its own."""

    def __init__(self, cluster: Cluster, warehouse: Path, log: Path, *extra: str) -> None:
        self.args = [
            sys.executable, "-m", "spark_apps.runner", "--metastore", cluster.url,
            "--cluster", cluster.keys.cluster, "--warehouse", str(warehouse), "--poll", "1",
            "--read-idle-timeout", "120", *extra,
        ]  # fmt: skip
        self.log = log
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=out, stderr=out, start_new_session=True
            )

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)

    async def stop(self) -> int:
        assert self.proc is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.proc.wait(), 120)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return code

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


async def until_checkpoint(cluster: Cluster, runner: RunnerProcess, position: str) -> None:
    async with asyncio.timeout(DEADLINE):
        while await checkpoint(cluster) != position:
            assert runner.alive(), runner.log.read_text()
            await asyncio.sleep(0.2)


async def test_the_runner_flushes_each_new_seal_including_more_segments_than_one_commit(
    cluster: Cluster, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster)
    # 2 shards x 70 segments = 140 segments: more than one commit holds (120).
    # Each flush request seals both shards' growing segments.
    steps = []
    for segment in range(70):
        pks = list(range(segment * 10, segment * 10 + 10))
        steps += [inserts(orders, pks)]
        if segment == 69:
            steps += [deletes(orders, [3, 699])]
        steps += [seals(orders)]
    written = await write(cluster, *steps)
    end1 = str(written[-1].id)
    # Records of other pchannels that do not decode stop only those pchannels.
    await cluster.metastore.put(seal_key(cluster.keys, "pch-garbage"), b"{not json")
    alien = SealRecord(pchannel="pch-alien", position="nosuchbackend:7", term=1)
    await cluster.metastore.put(seal_key(cluster.keys, "pch-alien"), alien.to_json())
    await sealed_at(cluster, end1)  # the whole range is sealed before the runner looks
    runner = RunnerProcess(cluster, warehouse, tmp_path / "runner.log")
    await runner.start()
    try:
        await until_checkpoint(cluster, runner, end1)
        kept = set(range(700)) - {3, 699}
        assert table_rows(cluster, warehouse) == expected(kept)
        recorded = await cluster.metastore.get_prefix(segments_prefix(cluster.keys, P))
        assert len(recorded) == 140
        # A second seal: flushed from the checkpoint on, by the same session.
        second = await write(cluster, inserts(orders, [900, 3]), seals(orders))
        end2 = str(second[-1].id)
        await sealed_at(cluster, end2)
        await until_checkpoint(cluster, runner, end2)
        assert table_rows(cluster, warehouse) == expected(kept | {900, 3})
    finally:
        code = await runner.stop()
    assert code == 0, runner.log.read_text()
    text = runner.log.read_text()
    assert "headrace flush runner ready" in text
    assert "2 commit(s)" in text, text
    assert "pch-garbage: waiting: its records cannot be read: CORRUPT" in text, text
    assert "pch-alien: waiting: its records cannot be read" in text, text
    # A new runner starts with a checkpoint already there (it compares ids at once).
    third = await write(cluster, inserts(orders, [901]), seals(orders))
    end3 = str(third[-1].id)
    await sealed_at(cluster, end3)
    again = RunnerProcess(cluster, warehouse, tmp_path / "runner2.log")
    await again.start()
    try:
        await until_checkpoint(cluster, again, end3)
    finally:
        assert await again.stop() == 0, again.log.read_text()
    assert table_rows(cluster, warehouse) == expected(kept | {900, 3, 901})


async def test_a_runner_killed_mid_flush_is_resumed_by_the_next_without_duplicates(
    cluster: Cluster, tmp_path: Path
) -> None:
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster)
    pks = list(range(6000))
    steps = [inserts(orders, pks[i : i + 500]) for i in range(0, 6000, 500)]
    written = await write(cluster, *steps, deletes(orders, [7, 4001]), seals(orders))
    end = str(written[-1].id)
    await sealed_at(cluster, end)
    log = tmp_path / "runner.log"
    first = RunnerProcess(cluster, warehouse, log, "--rows-per-file", "50")
    await first.start()
    async with asyncio.timeout(DEADLINE):
        while not list(warehouse.rglob("*.parquet")):
            assert first.alive(), log.read_text()
            await asyncio.sleep(0.05)
    first.kill()
    await first.stop()
    assert await checkpoint(cluster) is None, "the flush committed before the runner was killed"
    second = RunnerProcess(cluster, warehouse, log, "--rows-per-file", "50")
    await second.start()
    try:
        await until_checkpoint(cluster, second, end)
    finally:
        await second.stop()
    assert table_rows(cluster, warehouse) == expected(set(pks) - {7, 4001})


async def test_fenced_then_the_new_term_and_a_hung_job_past_its_deadline(
    cluster: Cluster, tmp_path: Path, spark: SparkSession
) -> None:
    """In-process runner: a flush launched under a term the pchannel left is
    FENCED, the next decision uses the new owner's term and commits; a flush
    that never ends (its range ends past anything written) is cancelled at
    its deadline and retried later."""
    warehouse = tmp_path / "warehouse"
    orders = await create(cluster, shards=1)
    written = await write(cluster, inserts(orders, [1, 2, 3]), seals(orders))
    end = str(written[-1].id)
    await sealed_at(cluster, end)
    await cluster.start_node("n2")
    assert (await cluster.move(P, "n2")).term == 2
    options = RunnerOptions(
        cluster.url, str(warehouse), cluster.keys.cluster, deadline_s=20.0, read_idle_timeout_s=120
    )
    runner = FlushRunner(options, lambda: spark, cluster.metastore)
    stop = asyncio.Event()
    policy = RetryPolicy()

    fenced = await runner.flush(Launch(P, 1, "", end), stop)
    assert fenced.outcome is Outcome.FAILED
    assert fenced.error is not None and fenced.error.code is errors.ErrorCode.FENCED
    assert await checkpoint(cluster) is None
    history = after(Attempts(), fenced, time.monotonic(), policy)
    (channel,) = await read_channels(cluster.metastore, cluster.keys)
    step = next_step(channel, history, time.monotonic())
    assert step == Launch(P, 2, "", end)
    assert isinstance(step, Launch)
    assert (await runner.flush(step, stop)).outcome is Outcome.COMMITTED
    assert table_rows(cluster, warehouse) == expected({1, 2, 3})

    # A range whose end was never written: the read never ends; the deadline cancels it.
    beyond = f"{end.split(':', maxsplit=1)[0]}:{int(end.split(':')[1]) + 10_000}"
    started = time.monotonic()
    hung = await runner.flush(Launch(P, 2, end, beyond), stop)
    assert hung.outcome is Outcome.TIMED_OUT
    assert time.monotonic() - started < options.deadline_s + options.abandon_grace_s
    assert await checkpoint(cluster) == end
    retry = after(history, hung, time.monotonic(), policy)
    assert retry.failures == 1 and retry.retry_at > time.monotonic()
    # The session still works after the cancellation.
    more = await write(cluster, inserts(orders, [4]), seals(orders))
    result = await runner.flush(Launch(P, 2, end, str(more[-1].id)), stop)
    assert result.outcome is Outcome.COMMITTED, result.error
    assert table_rows(cluster, warehouse) == expected({1, 2, 3, 4})

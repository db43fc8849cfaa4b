"""``headrace bench flush-lag``: ``flush_lag_p99_s`` under a steady ingest.

1. A standalone in this process (one node, one pchannel, local WAL) **with
   its flush runner** (the long-lived Spark session of ``spark_apps.runner``).
2. Warm-up, not measured: a collection is created, a few rows inserted and
   ``client.flush(wait=True)`` waited for, so the runner's Spark session is
   up (its start-up, ``warmup_s``, is paid once in a standalone's life).
3. Steady ingest: rows of an int64 key, a 128-float32 vector and a short
   string (the rows of ``headrace bench flush``), ``batch_rows`` per
   ``producer.insert``, paced by a token bucket at ``rate_bytes_s`` (Arrow
   bytes of the rows) for ``duration_s``. Seals come from the node's own
   :class:`~headrace.wal.interceptors.segments.SegmentPolicy` (at 10 MB/s
   the 64 MiB size trigger; ``segment_lifetime_s`` sets the node's
   ``--segment-lifetime-s``), or also from ``client.flush(wait=False)`` every
   ``flush_every_s`` if set (a low rate never reaches the size trigger);
   the runner flushes each seal. The ingest goes on
   past the measured window, unmeasured, until every measured row is visible
   (or ``drain_timeout_s``), so the last rows are sealed as the others were.
4. Lag of an insert = first moment the pchannel's ``CheckpointRecord`` is at
   or past the insert's largest acknowledged id (checkpoint and snapshot are
   committed in one metastore transaction, so the row is then in the table's
   current snapshot) minus the moment its acknowledgement came back; the
   checkpoint is polled every ``poll_s``. Every insert carries the same
   number of rows, so the percentiles over inserts are those over rows. A row
   not visible by the end counts as ``drain_timeout_s`` past its insert
   (``invisible_inserts`` says how many).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import math
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headrace import cluster, errors, standalone
from headrace.bench import report
from headrace.bench.flush import SCHEMA, make_rows, ready
from headrace.client.client import HeadraceClient
from headrace.client.flushing import caught_up, read_checkpoints
from headrace.client.producer import Producer
from headrace.message.ids import MessageID
from headrace.metastore.contract import Metastore

TARGET_P99_S = 30.0
_FLUSHED = re.compile(r": flushed to \S+ in ([0-9.]+)s")


@dataclasses.dataclass(frozen=True, slots=True)
class LagOptions:
    duration_s: float = 120.0
    rate_bytes_s: float = 10e6
    batch_rows: int = 2000
    shards: int = 1
    poll_s: float = 0.1
    drain_timeout_s: float = 180.0
    master: str = "local[2]"
    flush_every_s: float | None = None
    """Also ``client.flush(wait=False)`` this often (None: seals come from
    the node's segment policy alone)."""
    segment_lifetime_s: float | None = None
    """The node's ``--segment-lifetime-s`` (None: the policy's default)."""

    def __post_init__(self) -> None:
        for name in (
            "duration_s",
            "rate_bytes_s",
            "poll_s",
            "drain_timeout_s",
            "flush_every_s",
            "segment_lifetime_s",
        ):
            value = getattr(self, name)
            if value is None and name in {"flush_every_s", "segment_lifetime_s"}:
                continue
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise errors.InvalidArgument(f"{name} must be a positive number, got {value!r}")
        if self.batch_rows < 1 or self.shards < 1:
            raise errors.InvalidArgument("--batch-rows and --shards must be positive")


@dataclasses.dataclass(frozen=True, slots=True)
class Acked:
    """One acknowledged insert: its last id and when its acknowledgement came."""

    last_id: MessageID
    acked_at: float


def lags(acked: list[Acked], visible: dict[int, float], unseen_lag_s: float) -> list[float]:
    """Seconds from each insert's acknowledgement to its visibility (pure);
    an insert never seen visible counts ``unseen_lag_s``."""
    return [visible[i] - a.acked_at if i in visible else unseen_lag_s for i, a in enumerate(acked)]


def newly_visible(
    acked: list[Acked], first_pending: int, checkpoint_covers: Callable[[MessageID], bool]
) -> int:
    """Index of the first insert the checkpoint does not cover yet, from
    ``first_pending`` (pure; ids grow with the inserts on one pchannel)."""
    index = first_pending
    while index < len(acked) and checkpoint_covers(acked[index].last_id):
        index += 1
    return index


def runner_flush_seconds(log_text: str) -> list[float]:
    """Seconds of each committed flush in the runner's log (pure)."""
    return [float(m.group(1)) for m in _FLUSHED.finditer(log_text)]


class _Watch:
    """Polls the pchannel's checkpoint and marks inserts visible."""

    def __init__(self, store: Metastore, keys: cluster.Keys, pchannel: str) -> None:
        self.store = store
        self.keys = keys
        self.pchannel = pchannel
        self.acked: list[Acked] = []
        self.visible: dict[int, float] = {}
        self.pending = 0
        self.checkpoints: list[tuple[float, str]] = []
        self.wanted: int | None = None
        self.reached = asyncio.Event()

    async def poll(self) -> None:
        checkpoint = (await read_checkpoints(self.store, self.keys, [self.pchannel]))[self.pchannel]
        now = time.monotonic()
        if checkpoint is not None and (
            not self.checkpoints or self.checkpoints[-1][1] != checkpoint.position
        ):
            self.checkpoints.append((now, checkpoint.position))
        covered = newly_visible(
            self.acked, self.pending, lambda target: caught_up(checkpoint, target)
        )
        for index in range(self.pending, covered):
            self.visible[index] = now
        self.pending = covered
        if self.wanted is not None and covered >= self.wanted:
            self.reached.set()

    async def run(self, poll_s: float) -> None:
        """Poll every ``poll_s`` until cancelled."""
        while True:
            await self.poll()
            await asyncio.sleep(poll_s)

    async def drained(self, measured: int, timeout_s: float) -> None:
        """Until the first ``measured`` inserts are visible or ``timeout_s``."""
        self.wanted = measured
        waiting = asyncio.create_task(self.reached.wait())
        await asyncio.wait({waiting}, timeout=timeout_s)
        waiting.cancel()


async def _ingest(
    producer: Producer, watch: _Watch, options: LagOptions, stop: asyncio.Event
) -> tuple[int, int, float]:
    """Insert at the token bucket's pace until ``stop``: rows, bytes, seconds."""
    rows = nbytes = 0
    started = time.monotonic()
    next_batch = asyncio.create_task(asyncio.to_thread(make_rows, 1_000_000, options.batch_rows))
    while not stop.is_set():
        table = await next_batch
        # The next batch is made in a thread while this one is sent: the
        # standalone's coordinator runs on this event loop.
        next_batch = asyncio.create_task(
            asyncio.to_thread(make_rows, 1_000_000 + rows + table.num_rows, options.batch_rows)
        )
        due = started + nbytes / options.rate_bytes_s
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        result = await producer.insert("bench", table)
        watch.acked.append(Acked(max(r.id for r in result.results), time.monotonic()))
        rows += table.num_rows
        nbytes += table.nbytes
    next_batch.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await next_batch
    return rows, nbytes, time.monotonic() - started


async def _flush_every(client: HeadraceClient, every_s: float) -> None:
    """Ask for a flush (seal) every ``every_s`` until cancelled."""
    while True:
        await asyncio.sleep(every_s)
        await client.flush("bench", wait=False)


async def bench_flush_lag(root: Path, options: LagOptions) -> dict[str, Any]:
    cfg = standalone.StandaloneConfig(
        data_dir=root / "data",
        nodes=1,
        pchannels=1,
        flush=True,
        lease_ttl_s=15.0,
        spark_master=options.master,
        node_args=(
            ()
            if options.segment_lifetime_s is None
            else ("--segment-lifetime-s", str(options.segment_lifetime_s))
        ),
    )
    if not cfg.runs_flush:
        raise errors.InvalidArgument("bench flush-lag needs pyspark (the pipeline extra)")
    (pchannel,) = cluster.default_pchannels(1)
    stop = asyncio.Event()
    task = asyncio.create_task(standalone.run_standalone(cfg, stop, announce=False))
    store = None
    try:
        store = await ready(cfg, task)
        watch = _Watch(store, cluster.Keys(cfg.cluster), pchannel)
        async with HeadraceClient(cfg.metastore_url, cfg.cluster) as client:
            await client.create_collection("bench", SCHEMA, "pk", options.shards)
            warm = time.monotonic()
            async with client.producer() as producer:
                await producer.insert("bench", await asyncio.to_thread(make_rows, 0, 100))
            await client.flush("bench", wait=True, timeout=600)
            warmup_s = time.monotonic() - warm
            await watch.poll()
            flushes_before = len(watch.checkpoints)
            async with client.producer() as producer:
                done = asyncio.Event()
                polling = asyncio.create_task(watch.run(options.poll_s))
                ingest = asyncio.create_task(_ingest(producer, watch, options, done))
                flushing = [
                    asyncio.create_task(_flush_every(client, every))
                    for every in (options.flush_every_s,)
                    if every is not None
                ]
                await asyncio.sleep(options.duration_s)
                measured = len(watch.acked)
                await watch.drained(measured, options.drain_timeout_s)
                done.set()
                rows, nbytes, ingest_s = await ingest
                for helper in (polling, *flushing):
                    helper.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await helper
            if measured == 0:
                raise errors.HeadraceError("no insert was acknowledged in the measured window")
        log_text = (cfg.log_dir / "flush-runner.log").read_text(errors="replace")
    finally:
        stop.set()
        if store is not None:
            await store.close()
        with contextlib.suppress(errors.HeadraceError):
            await task
    run = Run(measured, Ingested(rows, nbytes, ingest_s), warmup_s, flushes_before)
    return summarize(watch, run, options, runner_flush_seconds(log_text))


@dataclasses.dataclass(frozen=True, slots=True)
class Ingested:
    rows: int
    nbytes: int
    seconds: float


@dataclasses.dataclass(frozen=True, slots=True)
class Run:
    measured: int
    """Inserts acknowledged in the measured window (the first ones)."""
    ingested: Ingested
    warmup_s: float
    flushes_before: int
    """Checkpoint changes seen before the window (the warm-up's flush)."""


def summarize(
    watch: _Watch, run: Run, options: LagOptions, runner_flushes: list[float]
) -> dict[str, Any]:
    """The printed report (pure but for the load average)."""
    measured, ingested = run.measured, run.ingested
    measured_acked = watch.acked[:measured]
    samples = lags(measured_acked, watch.visible, options.drain_timeout_s)
    advances = [t for t, _ in watch.checkpoints[run.flushes_before :]]
    intervals = [b - a for a, b in itertools.pairwise(advances)]
    steady = runner_flushes[1:]  # the first one is the warm-up's flush
    p99 = report.percentile(samples, 0.99)
    return {
        "bench": "flush-lag",
        "flush_lag_p50_s": round(report.percentile(samples, 0.50), 3),
        "flush_lag_p99_s": round(p99, 3),
        "flush_lag_max_s": round(max(samples), 3),
        "target_p99_s": TARGET_P99_S,
        "met": p99 <= TARGET_P99_S,
        "measured_inserts": measured,
        "measured_rows": measured * options.batch_rows,
        "invisible_inserts": sum(1 for i in range(measured) if i not in watch.visible),
        "duration_s": options.duration_s,
        "target_mb_per_s": round(options.rate_bytes_s / 1e6, 3),
        "achieved_mb_per_s": round(report.rate(ingested.nbytes, ingested.seconds) / 1e6, 3),
        "rows_per_s": round(report.rate(ingested.rows, ingested.seconds), 1),
        "rows_total": ingested.rows,
        "shards": options.shards,
        "flush_every_s": options.flush_every_s,
        "segment_lifetime_s": options.segment_lifetime_s,
        "batch_rows": options.batch_rows,
        "warmup_s": round(run.warmup_s, 2),
        "checkpoint_advances": len(advances),
        "checkpoint_interval_s": [round(x, 1) for x in intervals],
        "runner_flushes": len(steady),
        "runner_flush_s": steady,
        "master": options.master,
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }

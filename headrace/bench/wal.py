"""WAL append and scan benchmark, against a baseline measured in the same run.

The baseline is the least any durable log must do: a plain loop that writes
the same encoded messages to a file and fsyncs after every batch. The
framework WAL appends the same messages in batches of the same size with
``append_many`` from one producer (interceptors, timeticks, group commit, the
backend's framing and fsync, one backend append per batch) and the ratio of
the two rates, the median of the rounds' own ratios, is the figure of merit.
Baseline and WAL alternate round by round. Each round also runs the WAL with
two producers (``*_2p`` fields), whose batches share backend appends.

The scan reads the written log back through a backend scanner (no
write-ahead buffer) on a freshly opened backend, in batches
(``Scanner.next_many``), as the node's consume path does.

On Kafka and Pulsar (``backend="kafka"``/``"pulsar"``) the baseline is the
broker's raw client producer instead, on the same broker, with the same
messages and batches and the writer's own producer settings, in the same
run, alternating with the WAL round by round (see
:mod:`headrace.bench.broker`). ``producers`` batches are in flight on both
sides: the WAL runs that many producers (with the product's default
``WALOptions``, so queued batches share a backend append), the baseline keeps
that many batches outstanding on its one producer. The two-producer figures
(``*_2p``) then have their own two-in-flight baseline, and the per-batch
latencies of both sides are reported (``baseline_p99_ms``,
``p99_overhead_ms``). On Kafka each round also measures a second baseline,
the raw producer with transactions (one per group of in-flight batches, as
the fencing requirement imposes on the writer), and reports the WAL against
it too (``*_txn`` and ``*_vs_txn`` fields): that comparison leaves out the
broker's transaction cost and shows the WAL layer's own overhead.

The process runs with the product's collector tuning
(:func:`headrace.runtime.tune_process`, ``gc_tuned``), as the node and the
standalone server do. To show where time goes, the same run also measures
the backend writer alone (the same pre-encoded batches), the backend reader
alone, and ``codec.decode`` alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import secrets
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from typing import Any

from headrace import errors, runtime
from headrace.bench import broker
from headrace.message import codec
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.api import ReadOptions
from headrace.wal.contract import Backend, StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.scanner import open_backend_scanner

VCHANNEL = "bench-v0"
_STALL_S = 10.0
_SCAN_BATCH = 1024
_EXTRA_PRODUCERS = 2


@dataclasses.dataclass(frozen=True)
class _Round:
    """What one round needs: the backend to create and fresh pchannel names."""

    backend: str
    settings: Mapping[str, Any]
    root: str
    pchannel: str
    raw_pchannel: str
    batch: int
    producers: int
    options: WALOptions

    def create(self) -> Backend:
        if self.backend == "local":
            return registry.create("local", root=self.root, fsync="batch", **self.settings)
        return registry.create(self.backend, **self.settings)


def _messages(count: int, size: int) -> list[Message]:
    block = os.urandom(max(size, 1))
    return [Message(MessageType.INSERT, VCHANNEL, block[:size]) for _ in range(count)]


def _encoded(msgs: list[Message]) -> list[bytes]:
    return [codec.encode(m.with_stamp(i + 1, 1)) for i, m in enumerate(msgs)]


def _rate(count: int, elapsed: float) -> float:
    return count / elapsed if elapsed > 0 else 0.0


def _percentile(samples: list[float], q: float) -> float:
    if not samples:
        return 0.0
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def baseline_rate(path: str, msgs: list[Message], batch: int) -> float:
    """Messages per second of a plain write+fsync loop over the same bytes."""
    encoded = _encoded(msgs)
    chunks = [b"".join(encoded[i : i + batch]) for i in range(0, len(encoded), batch)]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for chunk in chunks:
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
    return _rate(len(msgs), elapsed)


def decode_rate(msgs: list[Message]) -> float:
    """Messages per second :func:`codec.decode` alone manages on these messages."""
    encoded = _encoded(msgs)
    decode = codec.decode
    start = time.perf_counter()
    for data in encoded:
        decode(data)
    return _rate(len(encoded), time.perf_counter() - start)


async def _backend_append(rnd: _Round, backend: Backend, msgs: list[Message]) -> float:
    """The backend writer alone, with the same pre-encoded batches."""
    encoded = _encoded(msgs)
    chunks = [encoded[i : i + rnd.batch] for i in range(0, len(encoded), rnd.batch)]
    writer = await backend.open_writer(rnd.raw_pchannel, 1)
    try:
        start = time.perf_counter()
        for chunk in chunks:
            await writer.append(chunk)
        elapsed = time.perf_counter() - start
    finally:
        await writer.close()
    return _rate(len(msgs), elapsed)


async def _wal_append(
    rnd: _Round, backend: Backend, msgs: list[Message], producers: int, pchannel: str
) -> tuple[float, list[float]]:
    wal = await WAL.open(backend, pchannel, 1, tso=LocalTSO(), options=rnd.options)
    batches = [msgs[i : i + rnd.batch] for i in range(0, len(msgs), rnd.batch)]
    latencies: list[float] = []

    async def produce(mine: list[list[Message]]) -> None:
        for chunk in mine:
            t0 = time.perf_counter()
            results = await wal.append_many(chunk)
            latencies.append(time.perf_counter() - t0)
            for result in results:
                if isinstance(result, errors.HeadraceError):
                    raise result

    try:
        start = time.perf_counter()
        await asyncio.gather(*(produce(batches[k::producers]) for k in range(producers)))
        elapsed = time.perf_counter() - start
    finally:
        await wal.close()
    return _rate(len(msgs), elapsed), latencies


async def _scan(rnd: _Round, backend: Backend, expected: int) -> float:
    options = ReadOptions(types=[MessageType.INSERT])
    scanner = await open_backend_scanner(backend, rnd.pchannel, options, batch_size=_SCAN_BATCH)
    seen = 0
    try:
        start = time.perf_counter()
        while seen < expected:
            entries = await scanner.next_many(_SCAN_BATCH, timeout=_STALL_S)
            if not entries:
                raise errors.Unavailable(f"scan stalled after {seen} of {expected} messages")
            seen += len(entries)
        elapsed = time.perf_counter() - start
    finally:
        await scanner.close()
    return _rate(seen, elapsed)


async def _raw_scan(rnd: _Round, backend: Backend) -> float:
    """Records per second the backend reader alone delivers (no decoding)."""
    last = await backend.last_record(rnd.pchannel)
    if last is None:
        return 0.0
    reader = await backend.open_reader(rnd.pchannel, StartPosition.earliest())
    count = 0
    try:
        start = time.perf_counter()
        while True:
            records = await reader.next_batch(1024, timeout=_STALL_S)
            if not records:
                raise errors.Unavailable(f"raw scan stalled after {count} records")
            count += len(records)
            if records[-1].id >= last.id:
                break
        elapsed = time.perf_counter() - start
    finally:
        await reader.close()
    return _rate(count, elapsed)


async def _one_round(rnd: _Round, msgs: list[Message]) -> tuple[dict[str, float], list[float]]:
    figures: dict[str, float] = {}
    writer_backend = rnd.create()
    # Cold scans on a freshly created backend that opens the log again; the
    # memory backend keeps its log in the instance, so it is scanned as is.
    fresh = rnd.backend != "memory"
    try:
        figures["backend"] = await _backend_append(rnd, writer_backend, msgs)
        figures["msgs_per_s"], latencies = await _wal_append(
            rnd, writer_backend, msgs, rnd.producers, rnd.pchannel
        )
        if rnd.producers != _EXTRA_PRODUCERS:
            figures["msgs_per_s_2p"], _ = await _wal_append(
                rnd, writer_backend, msgs, _EXTRA_PRODUCERS, f"{rnd.pchannel}-2p"
            )
        if not fresh:
            figures["scan"] = await _scan(rnd, writer_backend, len(msgs))
            figures["scan_backend"] = await _raw_scan(rnd, writer_backend)
    finally:
        await writer_backend.close()
    if fresh:
        reader_backend = rnd.create()
        try:
            figures["scan"] = await _scan(rnd, reader_backend, len(msgs))
        finally:
            await reader_backend.close()
        reader_backend = rnd.create()
        try:
            figures["scan_backend"] = await _raw_scan(rnd, reader_backend)
        finally:
            await reader_backend.close()
    return figures, latencies


async def bench_wal(
    backend: str = "local",
    messages: int = 20_000,
    size: int = 1024,
    batch: int = 64,
    root: str | os.PathLike[str] | None = None,
    *,
    producers: int = 1,
    rounds: int = 5,
    settings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Run the benchmark; a JSON-ready dict of rates, ratio and latencies.

    ``settings`` go to the backend factory (e.g. Kafka's bootstrap servers).
    Baseline and WAL alternate for ``rounds`` rounds on fresh files and fresh
    pchannels. Rates are the best round's (noise only ever slows a round
    down); ``ratio`` is the median of the rounds' own WAL/baseline ratios
    (``ratio_2p`` likewise with two producers, unless ``producers`` is 2).
    The per-round figures come alongside. ``p50_ms``/``p99_ms`` are the
    per-batch ``append_many`` latencies of the fastest WAL round.
    ``loadavg`` is the machine's load average before and after the run.

    On Kafka and Pulsar the baseline is the raw client producer
    (:mod:`headrace.bench.broker`) with ``producers`` batches in flight;
    ``baseline_p50_ms``/``baseline_p99_ms`` are its per-batch latencies in its
    fastest round, ``p99_overhead_ms`` is ``p99_ms - baseline_p99_ms`` (each
    round's own difference is among the round's figures), and
    ``baseline_msgs_per_s_2p`` is the best two-in-flight baseline that
    ``ratio_2p`` is measured against. On Kafka the transactional baseline
    adds ``baseline_txn_msgs_per_s`` (best round), ``ratio_vs_txn`` (median
    of the rounds' own ratios), ``baseline_txn_p50_ms``/``baseline_txn_p99_ms``
    (its fastest round) and ``p99_overhead_vs_txn_ms`` (see
    :func:`txn_summary`); ``ratio`` and ``p99_overhead_ms`` stay against the
    non-transactional baseline.
    """
    if min(messages, batch, producers, rounds) < 1 or size < 0:
        raise errors.InvalidArgument(
            "messages, batch, producers and rounds must be positive, size non-negative"
        )
    setup = _Setup(backend, messages, size, batch, producers, rounds, dict(settings or {}))
    with runtime.process_tuning() as gc_settings:
        return await _bench(setup, root, gc_settings)


@dataclasses.dataclass(frozen=True)
class _Setup:
    backend: str
    messages: int
    size: int
    batch: int
    producers: int
    rounds: int
    settings: Mapping[str, Any]


def _ms(seconds: float) -> float:
    return seconds * 1000


def _wal_options(setup: _Setup) -> WALOptions:
    if setup.backend in broker.BROKERS:
        # The product's defaults: batches queued meanwhile share a backend
        # append (the raw producer, too, sends what is in flight together).
        return WALOptions()
    # One backend append (and fsync) per batch, as in the file baseline; a
    # sync tick may ride along with a batch.
    return WALOptions(max_batch_messages=setup.batch + 1)


async def _raw(
    setup: _Setup, pchannel: str, msgs: list[Message], inflight: int, *, transactional: bool = False
) -> tuple[float, list[float]]:
    run = broker.RawRun(
        setup.backend, setup.settings, pchannel, setup.batch, inflight, transactional
    )
    return await broker.raw_producer(run, _encoded(msgs))


@dataclasses.dataclass(frozen=True)
class _Measured:
    """One round's figures and per-batch latencies (seconds) of each side."""

    figures: dict[str, float]
    latencies: list[float]
    base_latencies: list[float] = dataclasses.field(default_factory=list)
    txn_latencies: list[float] = dataclasses.field(default_factory=list)


def txn_round_figures(
    msgs_per_s: float, p99_ms: float, txn_rate: float, txn_latencies: list[float]
) -> dict[str, float]:
    """One round's figures against the transactional baseline (rates in msgs/s)."""
    txn_p99_ms = _ms(_percentile(txn_latencies, 0.99))
    return {
        "baseline_txn": txn_rate,
        "ratio_vs_txn": msgs_per_s / txn_rate if txn_rate else 0.0,
        "baseline_txn_p99_ms": txn_p99_ms,
        "p99_overhead_vs_txn_ms": p99_ms - txn_p99_ms,
    }


async def _measure_round(
    setup: _Setup, rnd: _Round, msgs: list[Message], base_path: str
) -> _Measured:
    """One round: figures, the WAL's and the baselines' per-batch latencies."""
    if setup.backend not in broker.BROKERS:
        baseline = baseline_rate(base_path, msgs, setup.batch)
        figures, latencies = await _one_round(rnd, msgs)
        figures["baseline"] = baseline
        return _Measured(figures, latencies)
    baseline, base_latencies = await _raw(setup, f"{rnd.pchannel}-base", msgs, setup.producers)
    txn: tuple[float, list[float]] | None = None
    if setup.backend == "kafka":
        txn = await _raw(
            setup, f"{rnd.pchannel}-base-txn", msgs, setup.producers, transactional=True
        )
    figures, latencies = await _one_round(rnd, msgs)
    figures["baseline"] = baseline
    if "msgs_per_s_2p" in figures:
        figures["baseline_2p"], _ = await _raw(
            setup, f"{rnd.pchannel}-base-2p", msgs, _EXTRA_PRODUCERS
        )
    figures["p99_ms"] = _ms(_percentile(latencies, 0.99))
    figures["baseline_p99_ms"] = _ms(_percentile(base_latencies, 0.99))
    figures["p99_overhead_ms"] = figures["p99_ms"] - figures["baseline_p99_ms"]
    if txn is None:
        return _Measured(figures, latencies, base_latencies)
    figures.update(txn_round_figures(figures["msgs_per_s"], figures["p99_ms"], *txn))
    return _Measured(figures, latencies, base_latencies, txn[1])


async def _bench(
    setup: _Setup, root: str | os.PathLike[str] | None, gc_settings: runtime.GCSettings
) -> dict[str, Any]:
    load_before = os.getloadavg()
    own_root = root is None
    workdir = tempfile.mkdtemp(prefix="headrace-bench-") if root is None else os.fspath(root)
    token = secrets.token_hex(4)
    per_round: list[dict[str, float]] = []
    best_latencies: list[float] = []
    best_base_latencies: list[float] = []
    best_txn_latencies: list[float] = []
    try:
        os.makedirs(workdir, exist_ok=True)
        msgs = _messages(setup.messages, setup.size)
        for r in range(setup.rounds):
            base_path = os.path.join(workdir, f"baseline-{r}.log")
            rnd = _Round(
                backend=setup.backend,
                settings=setup.settings,
                root=os.path.join(workdir, f"wal-{r}"),
                pchannel=f"bench-{token}-{r}",
                raw_pchannel=f"bench-{token}-{r}-raw",
                batch=setup.batch,
                producers=setup.producers,
                options=_wal_options(setup),
            )
            try:
                measured = await _measure_round(setup, rnd, msgs, base_path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(base_path)
                shutil.rmtree(rnd.root, ignore_errors=True)
            figures = measured.figures
            if not per_round or figures["msgs_per_s"] > max(x["msgs_per_s"] for x in per_round):
                best_latencies = measured.latencies
            if not per_round or figures["baseline"] > max(x["baseline"] for x in per_round):
                best_base_latencies = measured.base_latencies
            if measured.txn_latencies and (
                not per_round or figures["baseline_txn"] > max(x["baseline_txn"] for x in per_round)
            ):
                best_txn_latencies = measured.txn_latencies
            figures["decode"] = decode_rate(msgs)
            per_round.append(figures)
    finally:
        if own_root:
            shutil.rmtree(workdir, ignore_errors=True)
    described: dict[str, Any] = {
        "backend": setup.backend,
        "messages": setup.messages,
        "size": setup.size,
        "batch": setup.batch,
        "producers": setup.producers,
        "gc_tuned": runtime.gc_tuned(),
        "gc_thresholds": list(gc_settings.thresholds),
        "loadavg": [round(x, 2) for x in (*load_before, *os.getloadavg())],
    }
    if setup.backend in broker.BROKERS:
        described["baseline"] = broker.describe(setup.backend, setup.batch, setup.producers)
    if setup.backend == "kafka":
        described["baseline_txn"] = broker.describe_txn(setup.batch, setup.producers)
    summary = _summary(described, per_round, best_latencies)
    if best_base_latencies:
        summary.update(_broker_summary(per_round, best_base_latencies, summary["p99_ms"]))
    if best_txn_latencies:
        summary.update(txn_summary(per_round, best_txn_latencies, summary["p99_ms"]))
    return summary


def txn_summary(
    per_round: list[dict[str, float]], txn_latencies: list[float], summary_p99: float
) -> dict[str, float]:
    """The WAL against Kafka's transactional baseline.

    ``per_round`` holds each round's :func:`txn_round_figures`;
    ``txn_latencies`` are the batch latencies (s) of the fastest transactional
    baseline round and ``summary_p99`` the reported WAL p99 (ms). The rate is
    the best round's, ``ratio_vs_txn`` the median of the rounds' own ratios,
    ``p99_overhead_vs_txn_ms`` the WAL's p99 minus the baseline's.
    """
    txn_p99 = round(_ms(_percentile(txn_latencies, 0.99)), 3)
    return {
        "baseline_txn_msgs_per_s": round(max(x["baseline_txn"] for x in per_round), 1),
        "ratio_vs_txn": round(statistics.median(x["ratio_vs_txn"] for x in per_round), 3),
        "baseline_txn_p50_ms": round(_ms(statistics.median(txn_latencies)), 3),
        "baseline_txn_p99_ms": txn_p99,
        "p99_overhead_vs_txn_ms": round(summary_p99 - txn_p99, 3),
    }


def _broker_summary(
    per_round: list[dict[str, float]], base_latencies: list[float], summary_p99: float
) -> dict[str, Any]:
    """The raw producer's latencies (fastest baseline round), and the WAL's
    p99 overhead over them (each round's own difference is in ``rounds``)."""
    base_p99 = round(_ms(_percentile(base_latencies, 0.99)), 3)
    extra: dict[str, Any] = {
        "baseline_p50_ms": round(_ms(statistics.median(base_latencies)), 3),
        "baseline_p99_ms": base_p99,
        "p99_overhead_ms": round(summary_p99 - base_p99, 3),
    }
    if all("baseline_2p" in x for x in per_round):
        extra["baseline_msgs_per_s_2p"] = round(max(x["baseline_2p"] for x in per_round), 1)
    return extra


def _summary(
    setup: dict[str, Any], per_round: list[dict[str, float]], latencies: list[float]
) -> dict[str, Any]:
    def best(key: str) -> float:
        return max(x[key] for x in per_round)

    # Each round's ratio compares runs made back to back (the disk's speed
    # drifts on a shared machine); the median round is reported.
    for x in per_round:
        x["ratio"] = x["msgs_per_s"] / x["baseline"] if x["baseline"] else 0.0
        if "msgs_per_s_2p" in x:
            # Brokers measure a two-in-flight baseline of their own.
            base = x.get("baseline_2p", x["baseline"])
            x["ratio_2p"] = x["msgs_per_s_2p"] / base if base else 0.0
    extra: dict[str, float] = {}
    if all("ratio_2p" in x for x in per_round):
        extra["msgs_per_s_2p"] = round(best("msgs_per_s_2p"), 1)
        extra["ratio_2p"] = round(statistics.median(x["ratio_2p"] for x in per_round), 3)
    return {
        **setup,
        "msgs_per_s": round(best("msgs_per_s"), 1),
        "baseline_msgs_per_s": round(best("baseline"), 1),
        "ratio": round(statistics.median(x["ratio"] for x in per_round), 3),
        **extra,
        "p50_ms": round(statistics.median(latencies) * 1000, 3) if latencies else 0.0,
        "p99_ms": round(_percentile(latencies, 0.99) * 1000, 3),
        "scan_msgs_per_s": round(best("scan"), 1),
        "backend_append_msgs_per_s": round(best("backend"), 1),
        "backend_scan_records_per_s": round(best("scan_backend"), 1),
        "decode_msgs_per_s": round(best("decode"), 1),
        "rounds": [
            {
                k: round(v, 3 if k.startswith("ratio") or k.endswith("_ms") else 1)
                for k, v in x.items()
            }
            for x in per_round
        ],
    }

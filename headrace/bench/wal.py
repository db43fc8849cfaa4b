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
write-ahead buffer) on a freshly opened backend, in batches, as the node's
consume path does (``Scanner.next_units``: a record batch goes on whole,
``scan_msgs_per_s``), and decoded into one entry per message
(``Scanner.next_many``, ``scan_decoded_msgs_per_s``).

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
the fencing of a message format 1 log imposes on its writer), and reports
the WAL against it too (``*_txn`` and ``*_vs_txn`` fields): for format 1
that comparison leaves out the broker's transaction cost and shows the WAL
layer's own overhead (a format 2 log's writer runs no transactions).

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
import queue
import secrets
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

from headrace import errors, runtime
from headrace.bench import broker, report
from headrace.message import batch as batches
from headrace.message import codec
from headrace.message.records import BatchEntry
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


def client_batches(msgs: list[Message], batch: int) -> list[bytes]:
    """``msgs`` as format 2 record batches of ``batch`` messages, as a client sends them."""
    info = batches.BatchInfo(VCHANNEL)
    return [batches.encode(msgs[i : i + batch], info) for i in range(0, len(msgs), batch)]


def _stamped_batches(msgs: list[Message], batch: int) -> list[bytes]:
    """The batches as the WAL stores them (stamped)."""
    out = []
    for i, data in enumerate(client_batches(msgs, batch)):
        stamped = bytearray(data)
        batches.stamp(stamped, 1 + i * batch, 1)
        out.append(bytes(stamped))
    return out


def _records(msgs: list[Message], batch: int, message_format: int) -> list[list[bytes]]:
    """The records one backend append per batch stores: ``batch`` format 1
    messages, or one format 2 batch."""
    if message_format == batches.FORMAT_VERSION:
        return [[data] for data in _stamped_batches(msgs, batch)]
    encoded = _encoded(msgs)
    return [encoded[i : i + batch] for i in range(0, len(encoded), batch)]


def baseline_rate(path: str, msgs: list[Message], batch: int, message_format: int = 1) -> float:
    """Messages per second of a plain write+fsync loop over the same bytes."""
    chunks = [b"".join(chunk) for chunk in _records(msgs, batch, message_format)]
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
    return report.rate(len(msgs), elapsed)


async def offloop_baseline_rate(
    path: str, msgs: list[Message], batch: int, message_format: int = 1
) -> float:
    """Messages per second of the same write+fsync loop when each batch's
    write and fsync run on a thread of their own and the event loop awaits
    them one at a time: the loop of :func:`baseline_rate` plus one hand-off
    to a thread and one back per batch and nothing else, so the ceiling of
    any writer that keeps its fsync off the event loop (as the node must,
    which serves every other pchannel from that loop meanwhile)."""
    chunks = [b"".join(chunk) for chunk in _records(msgs, batch, message_format)]
    loop = asyncio.get_running_loop()
    jobs: queue.SimpleQueue[tuple[bytes, asyncio.Future[None]] | None] = queue.SimpleQueue()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)

    def write_and_sync() -> None:
        while (job := jobs.get()) is not None:
            view = memoryview(job[0])
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
            loop.call_soon_threadsafe(job[1].set_result, None)

    thread = threading.Thread(target=write_and_sync, name="bench-offloop", daemon=True)
    thread.start()
    try:
        start = time.perf_counter()
        for chunk in chunks:
            done: asyncio.Future[None] = loop.create_future()
            jobs.put((chunk, done))
            await done
        elapsed = time.perf_counter() - start
    finally:
        jobs.put(None)
        await asyncio.to_thread(thread.join)
        os.close(fd)
    return report.rate(len(msgs), elapsed)


def decode_rate(msgs: list[Message], batch: int, message_format: int = 1) -> float:
    """Messages per second the codec alone decodes these messages at
    (:func:`codec.decode` per message, or :func:`batch.messages` per batch)."""
    if message_format == batches.FORMAT_VERSION:
        stamped = _stamped_batches(msgs, batch)
        start = time.perf_counter()
        for data in stamped:
            batches.messages(data)
        return report.rate(len(msgs), time.perf_counter() - start)
    encoded = _encoded(msgs)
    decode = codec.decode
    start = time.perf_counter()
    for data in encoded:
        decode(data)
    return report.rate(len(encoded), time.perf_counter() - start)


def encode_rate(msgs: list[Message], batch: int) -> float:
    """Messages per second a client encodes these messages into batches at."""
    start = time.perf_counter()
    client_batches(msgs, batch)
    return report.rate(len(msgs), time.perf_counter() - start)


async def _backend_append(rnd: _Round, backend: Backend, msgs: list[Message]) -> float:
    """The backend writer alone (the one the WAL's message format gets), with the
    same pre-encoded batches."""
    chunks = _records(msgs, rnd.batch, rnd.options.message_format)
    writer = await backend.open_writer_for(rnd.raw_pchannel, 1, rnd.options.message_format)
    try:
        start = time.perf_counter()
        for chunk in chunks:
            await writer.append(chunk)
        elapsed = time.perf_counter() - start
    finally:
        await writer.close()
    return report.rate(len(msgs), elapsed)


async def _wal_append(
    rnd: _Round, backend: Backend, msgs: list[Message], producers: int, pchannel: str
) -> tuple[float, list[float]]:
    wal = await WAL.open(backend, pchannel, 1, tso=LocalTSO(), options=rnd.options)
    latencies: list[float] = []

    async def produce(mine: list[list[Message]]) -> None:
        for chunk in mine:
            t0 = time.perf_counter()
            results = await wal.append_many(chunk)
            latencies.append(time.perf_counter() - t0)
            for result in results:
                if isinstance(result, errors.HeadraceError):
                    raise result

    async def produce_batches(mine: list[bytes]) -> None:
        for data in mine:
            t0 = time.perf_counter()
            (result,) = await wal.append_batches([data])
            latencies.append(time.perf_counter() - t0)
            if isinstance(result, errors.HeadraceError):
                raise result

    # Format 2: the client's encoding happens before, as the baseline's does.
    encoded = (
        client_batches(msgs, rnd.batch)
        if rnd.options.message_format == batches.FORMAT_VERSION
        else None
    )
    chunks = [msgs[i : i + rnd.batch] for i in range(0, len(msgs), rnd.batch)]
    try:
        start = time.perf_counter()
        if encoded is not None:
            await asyncio.gather(
                *(produce_batches(encoded[k::producers]) for k in range(producers))
            )
        else:
            await asyncio.gather(*(produce(chunks[k::producers]) for k in range(producers)))
        elapsed = time.perf_counter() - start
    finally:
        await wal.close()
    return report.rate(len(msgs), elapsed), latencies


async def _scan(rnd: _Round, backend: Backend, expected: int, *, units: bool) -> float:
    """Messages/s read back through a backend scanner: as the node's Consume
    reads (``units``: a record batch whole, as it goes on the wire), or
    decoded into one entry per message (``next_many``)."""
    options = ReadOptions(types=[MessageType.INSERT])
    scanner = await open_backend_scanner(backend, rnd.pchannel, options, batch_size=_SCAN_BATCH)
    seen = 0
    try:
        start = time.perf_counter()
        while seen < expected:
            if units:
                got = await scanner.next_units(_SCAN_BATCH, timeout=_STALL_S)
                count = sum(g.count if isinstance(g, BatchEntry) else 1 for g in got)
            else:
                count = len(await scanner.next_many(_SCAN_BATCH, timeout=_STALL_S))
            if not count:
                raise errors.Unavailable(f"scan stalled after {seen} of {expected} messages")
            seen += count
        elapsed = time.perf_counter() - start
    finally:
        await scanner.close()
    return report.rate(seen, elapsed)


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
    return report.rate(count, elapsed)


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
            figures["scan"] = await _scan(rnd, writer_backend, len(msgs), units=True)
            figures["scan_decoded"] = await _scan(rnd, writer_backend, len(msgs), units=False)
            figures["scan_backend"] = await _raw_scan(rnd, writer_backend)
    finally:
        await writer_backend.close()
    if fresh:
        for key, units in (("scan", True), ("scan_decoded", False)):
            reader_backend = rnd.create()
            try:
                figures[key] = await _scan(rnd, reader_backend, len(msgs), units=units)
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
    message_format: int = 1,
) -> dict[str, Any]:
    """Run the benchmark; a JSON-ready dict of rates, ratio and latencies.

    ``message_format`` 2 writes record batches: each producer batch is one
    client-encoded format 2 batch (encoded before the clock starts, as the
    baseline's bytes are; ``encode`` reports what the encoding costs),
    appended with ``WAL.append_batches`` and stored as one backend record, and
    the baseline writes the same batches.

    ``settings`` go to the backend factory (e.g. Kafka's bootstrap servers).
    Baseline and WAL alternate for ``rounds`` rounds on fresh files and fresh
    pchannels. Rates are the best round's (noise only ever slows a round
    down); ``ratio`` is the median of the rounds' own WAL/baseline ratios
    (``ratio_2p`` likewise with two producers, unless ``producers`` is 2).
    The per-round figures come alongside. ``p50_ms``/``p99_ms`` are the
    per-batch ``append_many`` latencies of the fastest WAL round.
    ``loadavg`` is the machine's load average before and after the run.
    ``ratio_backend`` is the backend writer alone (the same batches, already
    encoded and stamped, one ``append`` at a time, no framework) against the
    same baseline, the median of the rounds' own ratios: what the backend's
    append path costs, apart from the framework's. On the file backends
    ``ratio_offloop`` is the baseline loop itself with each batch's write and
    fsync handed to a thread and awaited (:func:`offloop_baseline_rate`)
    against the baseline, likewise: the ceiling of ``ratio`` for a writer
    that keeps fsync off the event loop.

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
    if message_format not in (1, batches.FORMAT_VERSION):
        raise errors.InvalidArgument(f"message_format is 1 or 2, not {message_format}")
    setup = _Setup(
        backend, messages, size, batch, producers, rounds, dict(settings or {}), message_format
    )
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
    message_format: int = 1


def _wal_options(setup: _Setup) -> WALOptions:
    if setup.backend in broker.BROKERS:
        # The product's defaults: batches queued meanwhile share a backend
        # append (the raw producer, too, sends what is in flight together).
        return WALOptions(message_format=setup.message_format)
    # One backend append (and fsync) per batch, as in the file baseline; a
    # sync tick may ride along with a batch.
    return WALOptions(max_batch_messages=setup.batch + 1, message_format=setup.message_format)


async def _raw(
    setup: _Setup, pchannel: str, msgs: list[Message], inflight: int, *, transactional: bool = False
) -> tuple[float, list[float]]:
    run = broker.RawRun(
        setup.backend, setup.settings, pchannel, setup.batch, inflight, transactional
    )
    # Format 2 or not, the baseline sends the same messages one record each
    # (with its own batching, as configured): the WAL may beat it by sending
    # fewer, larger records.
    return await broker.raw_producer(run, _encoded(msgs))


@dataclasses.dataclass(frozen=True)
class _Measured:
    """One round's figures and per-batch latencies (seconds) of each side."""

    figures: dict[str, float]
    latencies: list[float]
    base_latencies: list[float] = dataclasses.field(default_factory=list)
    txn_latencies: list[float] = dataclasses.field(default_factory=list)


async def _measure_round(
    setup: _Setup, rnd: _Round, msgs: list[Message], base_path: str
) -> _Measured:
    """One round: figures, the WAL's and the baselines' per-batch latencies."""
    if setup.backend not in broker.BROKERS:
        baseline = baseline_rate(base_path, msgs, setup.batch, setup.message_format)
        figures, latencies = await _one_round(rnd, msgs)
        figures["baseline"] = baseline
        figures["baseline_offloop"] = await offloop_baseline_rate(
            base_path, msgs, setup.batch, setup.message_format
        )
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
    figures["p99_ms"] = report.ms(report.percentile(latencies, 0.99))
    figures["baseline_p99_ms"] = report.ms(report.percentile(base_latencies, 0.99))
    figures["p99_overhead_ms"] = figures["p99_ms"] - figures["baseline_p99_ms"]
    if txn is None:
        return _Measured(figures, latencies, base_latencies)
    figures.update(report.txn_round_figures(figures["msgs_per_s"], figures["p99_ms"], *txn))
    return _Measured(figures, latencies, base_latencies, txn[1])


async def _bench(
    setup: _Setup, root: str | os.PathLike[str] | None, gc_settings: runtime.GCSettings
) -> dict[str, Any]:
    load_before = os.getloadavg()
    own_root = root is None
    workdir = tempfile.mkdtemp(prefix="headrace-bench-") if root is None else os.fspath(root)
    token = secrets.token_hex(4)
    measured_rounds: list[_Measured] = []
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
            measured.figures["decode"] = decode_rate(msgs, setup.batch, setup.message_format)
            if setup.message_format == batches.FORMAT_VERSION:
                measured.figures["encode"] = encode_rate(msgs, setup.batch)
            measured_rounds.append(measured)
    finally:
        if own_root:
            shutil.rmtree(workdir, ignore_errors=True)
    described: dict[str, Any] = {
        "backend": setup.backend,
        "messages": setup.messages,
        "size": setup.size,
        "batch": setup.batch,
        "producers": setup.producers,
        "message_format": setup.message_format,
        "gc_tuned": runtime.gc_tuned(),
        "gc_thresholds": list(gc_settings.thresholds),
        "loadavg": [round(x, 2) for x in (*load_before, *os.getloadavg())],
    }
    if setup.backend in broker.BROKERS:
        described["baseline"] = broker.describe(setup.backend, setup.batch, setup.producers)
    if setup.backend == "kafka":
        described["baseline_txn"] = broker.describe_txn(setup.batch, setup.producers)
    per_round = [m.figures for m in measured_rounds]
    for x in per_round:
        x["ratio_backend"] = x["backend"] / x["baseline"] if x["baseline"] else 0.0
        if "baseline_offloop" in x:
            x["ratio_offloop"] = x["baseline_offloop"] / x["baseline"] if x["baseline"] else 0.0

    def fastest(key: str) -> _Measured:
        """The first round with the highest ``key`` (its latencies are reported)."""
        return max(measured_rounds, key=lambda m: m.figures.get(key, 0.0))

    latencies = fastest("msgs_per_s").latencies
    summary = report.summary(described, per_round, latencies)
    summary["ratio_backend"] = round(statistics.median(x["ratio_backend"] for x in per_round), 3)
    if all("ratio_offloop" in x for x in per_round):
        summary["ratio_offloop"] = round(
            statistics.median(x["ratio_offloop"] for x in per_round), 3
        )
    # Overheads from unrounded p99s, as each round's own, so that one round's
    # figures and the summary agree to the last digit.
    p99 = report.ms(report.percentile(latencies, 0.99))
    base_latencies = fastest("baseline").base_latencies
    if base_latencies:
        summary.update(report.broker_summary(per_round, base_latencies, p99))
    txn_latencies = fastest("baseline_txn").txn_latencies
    if txn_latencies:
        summary.update(report.txn_summary(per_round, txn_latencies, p99))
    return summary

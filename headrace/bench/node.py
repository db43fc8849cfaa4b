"""``headrace bench node``: messages through a node over loopback vs in-process.

Both sides append the same 1 KiB messages to the local backend (fsync every
batch) in the same shape: ``producers`` tasks each sending chunks of
``chunk`` messages. The baseline appends them to a framework WAL in this
process; the measured side sends them with the client to one streaming-node
process over gRPC on 127.0.0.1 (the node gets the pchannel from a coordinator
running here). ``tail_p99_ms`` is the time from handing a message to the
producer to its delivery to a consumer tailing the vchannel from its own
process (:mod:`headrace.bench.tailprobe`), with the producer paced at half of
the measured maximum rate.

The tail's load is open-loop and paced by schedule, as latency-at-throughput
tools do (kafka-producer-perf-test ``--throughput``, wrk2): every ``step``
(1 ms) the producer is handed what the time since the start calls for
(:func:`due`), so a late wake sends more rather than stretching the period,
and the rate reported (``tail_rate_msgs_per_s``) is the one achieved, sent
over the time the sending took (``tail_requested_rate_msgs_per_s`` is half the
maximum). Pacing by sleeping a fixed step after each send ran below the rate
it reported, by the step's own work. Small steps spread the load as evenly
as an asyncio sender can; ``tail_burst5ms_*`` is the same run in 5 ms steps
(bursts of 5 ms of traffic at once, about 500 messages at 100k msgs/s), kept
as a diagnostic of how a burst drains. ``*_ack_*`` are each step's time from
its first stamp to the producer's acknowledgement of all of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import signal
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from headrace import cluster, errors, runtime
from headrace.bench import report, tailprobe
from headrace.bench.certs import make_certs
from headrace.client.client import ClientOptions, HeadraceClient
from headrace.coordinator import coordinator as coord_mod
from headrace.message import batch
from headrace.message.formats import RELEASE_FORMATS
from headrace.message.types import Message, MessageType
from headrace.metastore import factory
from headrace.tls import ENV_CA, ENV_CERT, ENV_KEY, ENV_SERVER_NAME, ClientTLS, ServerTLS
from headrace.tso import LocalTSO
from headrace.wal import registry
from headrace.wal.framework import WAL, WALOptions

PCHANNEL = "bench-000"
VCHANNEL = "bench-vchannel"


def _chunks(total: int, chunk: int) -> list[int]:
    return [min(chunk, total - start) for start in range(0, total, chunk)]


async def _run_producers(producers: int, sizes: list[int], send: Any) -> tuple[float, list[float]]:
    """Run ``send(n)`` for every chunk size from ``producers`` tasks; elapsed, latencies."""
    queue: asyncio.Queue[int] = asyncio.Queue()
    for n in sizes:
        queue.put_nowait(n)
    latencies: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            n = queue.get_nowait()
            t0 = time.perf_counter()
            await send(n)
            latencies.append((time.perf_counter() - t0) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(producers)))
    return time.perf_counter() - start, latencies


async def baseline(
    root: Path, load: Load, message_format: int = max(RELEASE_FORMATS.writes)
) -> float:
    """Messages/s appended to a framework WAL on the local backend, in process.

    In format 2 each chunk is encoded as one record batch (in the clock, as
    the client does it on the other side) and appended with ``append_batches``.
    """
    backend = registry.create("local", root=str(root), fsync="batch")
    options = WALOptions(message_format=message_format)
    wal = await WAL.open(backend, PCHANNEL, 1, tso=LocalTSO(), options=options)
    msg = Message(MessageType.INSERT, VCHANNEL, load.payload)
    info = batch.BatchInfo(VCHANNEL)

    async def send(n: int) -> None:
        for outcome in await wal.append_many([msg] * n):
            if isinstance(outcome, errors.HeadraceError):
                raise outcome

    async def send_batch(n: int) -> None:
        (outcome,) = await wal.append_batches([batch.encode([msg] * n, info)])
        if isinstance(outcome, errors.HeadraceError):
            raise outcome

    sender = send_batch if message_format == batch.FORMAT_VERSION else send
    try:
        elapsed, _ = await _run_producers(
            load.producers, _chunks(load.messages, load.chunk), sender
        )
    finally:
        await wal.close()
        await backend.close()
    return load.messages / elapsed


def node_rss_mib(pid: int, field: str = "VmHWM") -> float:
    """Resident memory of process ``pid`` in MiB, 0 if unknown: its peak so far
    (``VmHWM``), or ``VmRSS`` now."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith(f"{field}:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


class _Cluster:
    """A one-node cluster: the node as a child process, the coordinator here."""

    def __init__(self, root: Path, setup: NodeSetup | None = None) -> None:
        self.root = root
        self.setup = setup or NodeSetup()
        self.url = f"sqlite:///{(root / 'meta.db').resolve()}"
        self.stop = asyncio.Event()
        self.proc: asyncio.subprocess.Process | None = None
        self.coord_task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        store = await factory.open_metastore(self.url)
        coordinator = coord_mod.Coordinator(
            store,
            cluster.DEFAULT_CLUSTER,
            coord_mod.CoordinatorConfig(
                pchannels=[PCHANNEL],
                coordinator_id="bench",
                message_format=self.setup.message_format,
            ),
        )
        self._store = store
        self.coord_task = asyncio.create_task(coordinator.run(self.stop))
        log = (self.root / "node.log").open("ab")
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "headrace.cli",
            "node",
            "--node-id",
            "bench-node",
            "--metastore",
            self.url,
            "--wal",
            "local",
            "--wal-dir",
            str(self.root / "wal"),
            "--listen",
            "127.0.0.1:0",
            *self.setup.node_flags(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
        )
        log.close()

    def rss_mib(self, field: str = "VmHWM") -> float:
        """The node process's resident memory in MiB (see :func:`node_rss_mib`)."""
        return 0.0 if self.proc is None else node_rss_mib(self.proc.pid, field)

    async def close(self) -> None:
        self.stop.set()
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 20)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self.coord_task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.coord_task, 10)
        await self._store.close()


async def _through_node(
    client: HeadraceClient, messages: int, payload: bytes, chunk: int, producers: int
) -> tuple[float, list[float]]:
    producer = client.producer()
    msg = Message(MessageType.INSERT, VCHANNEL, payload)

    async def send(n: int) -> None:
        for outcome in await producer.send_many([msg] * n):
            if isinstance(outcome, errors.HeadraceError):
                raise outcome

    try:
        elapsed, latencies = await _run_producers(producers, _chunks(messages, chunk), send)
    finally:
        await producer.close()
    return messages / elapsed, latencies


async def _tail_latency(
    client: HeadraceClient,
    url: str,
    pacing: Pacing,
    duration: float,
    size: int,
    *,
    env: dict[str, str] | None = None,
) -> Tail:
    """Append as ``pacing`` says while a tailing consumer process measures delivery delay."""
    probe = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "headrace.bench.tailprobe",
        url,
        VCHANNEL,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        env=env,
    )
    assert probe.stdin is not None and probe.stdout is not None
    try:
        ready = await asyncio.wait_for(probe.stdout.readline(), 60)
        if ready.strip() != b"ready":
            raise errors.Unavailable(f"tail probe did not start: {ready!r}")
        await asyncio.sleep(0.2)
        sent, rate, acks = await _paced_send(client, pacing, duration, size)
        probe.stdin.write(f"{sent}\n".encode())
        await probe.stdin.drain()
        out = await asyncio.wait_for(probe.stdout.read(), 60)
        if await probe.wait() != 0:
            raise errors.Unavailable(f"tail probe exited with {probe.returncode}")
    finally:
        if probe.returncode is None:
            probe.kill()
            await probe.wait()
    delays: list[float] = json.loads(out)
    return Tail(delays, sent, rate, pacing.step, acks)


@dataclasses.dataclass(frozen=True)
class Tail:
    """What one tail-latency run measured."""

    delays: list[float]
    """Milliseconds from each message's stamp to its delivery to the probe."""
    sent: int
    rate: float
    """Messages/s achieved: sent over the time the sending took."""
    step: float
    """Seconds between the producer's sends."""
    acks: list[float]
    """Diagnostic: milliseconds from each step's first stamp to the producer's
    acknowledgement of all its messages (the append's share of ``delays``)."""

    def fields(self, prefix: str) -> dict[str, Any]:
        """The report's fields of this run, named ``{prefix}_…``."""
        return {
            f"{prefix}_rate_msgs_per_s": round(self.rate, 1),
            f"{prefix}_step_ms": round(self.step * 1000, 3),
            f"{prefix}_sent": self.sent,
            f"{prefix}_samples": len(self.delays),
            f"{prefix}_p50_ms": round(report.percentile(self.delays, 0.5), 3),
            f"{prefix}_p99_ms": round(report.percentile(self.delays, 0.99), 3),
            f"{prefix}_ack_p50_ms": round(report.percentile(self.acks, 0.5), 3),
            f"{prefix}_ack_p99_ms": round(report.percentile(self.acks, 0.99), 3),
        }


@dataclasses.dataclass(frozen=True)
class Pacing:
    """How the tail run's producer spreads its load: ``rate`` msgs/s asked
    for, sent every ``step`` seconds by schedule."""

    rate: float
    step: float = 0.001


BURST_STEP = 0.005
"""The step of the diagnostic run (``tail_burst5ms_*``): bursts of 5 ms of
traffic at once, how long one burst takes to drain."""


def due(rate: float, elapsed: float, sent: int) -> int:
    """Messages an open-loop sender at ``rate`` msgs/s owes ``elapsed`` s after
    its start, having sent ``sent`` (pure): the schedule, not the sender's
    own speed, says what is due, so a late wake sends more, not later."""
    return max(0, int(rate * elapsed) - sent)


async def _paced_send(
    client: HeadraceClient, pacing: Pacing, duration: float, size: int
) -> tuple[int, float, list[float]]:
    """Send at ``pacing.rate`` msgs/s for ``duration`` s: at every step, what the
    time since the start calls for (:func:`due`). How many were sent, the rate
    achieved (sent over the time the sending took), and each step's time from
    its first stamp to its acknowledgement (ms)."""
    producer = client.producer()
    sent = 0
    step = pacing.step
    start = time.perf_counter()
    pending: list[asyncio.Future[Any]] = []
    acks: list[float] = []
    padding = bytes(max(0, size - 8))

    def acked(stamped: int, _: asyncio.Future[Any]) -> None:
        acks.append((time.monotonic_ns() - stamped) / 1e6)

    try:
        while (elapsed := time.perf_counter() - start) < duration:
            n = due(pacing.rate, elapsed, sent)
            if n:
                stamped = time.monotonic_ns()
                burst = [
                    Message(
                        MessageType.INSERT,
                        VCHANNEL,
                        tailprobe.STAMP.pack(time.monotonic_ns()) + padding,
                    )
                    for _ in range(n)
                ]
                sending = asyncio.ensure_future(producer.send_many(burst))
                sending.add_done_callback(functools.partial(acked, stamped))
                pending.append(sending)
                sent += n
            wake = start + (elapsed // step + 1) * step
            await asyncio.sleep(max(0.0, wake - time.perf_counter()))
        took = time.perf_counter() - start
        await asyncio.gather(*pending)
    finally:
        await producer.close()
    return sent, sent / took, acks


async def bench_node(
    *,
    messages: int = 50_000,
    size: int = 1024,
    root: Path,
    chunk: int = 256,
    producers: int = 4,
    tail_seconds: float = 5.0,
    message_format: int = max(RELEASE_FORMATS.writes),
) -> dict[str, Any]:
    """The node's rate against the in-process WAL's (same format), its tail
    latency at half that rate, its peak RSS (``node_rss_mib``) and its RSS
    once its pchannel is ready, before any message (``node_idle_rss_mib``:
    start-up, imports; the rest of the peak is the write-ahead buffer and
    what the traffic holds)."""
    if messages < chunk or size < 8:
        raise errors.InvalidArgument(f"need messages >= {chunk} and size >= 8")
    runtime.tune_process()
    payload = bytes(size)
    setup = NodeSetup(message_format=message_format)
    load = Load(messages, payload, chunk, producers)
    base_rate = await baseline(root / "baseline", load, message_format)
    node_cluster = _Cluster(root, setup)
    await node_cluster.start()
    try:
        async with HeadraceClient(node_cluster.url) as client:
            await client.wait_ready(PCHANNEL, timeout=60)
            idle_rss = node_cluster.rss_mib("VmRSS")
            rate, latencies = await _through_node(client, messages, payload, chunk, producers)
            tail = await _tail_latency(
                client, node_cluster.url, Pacing(rate / 2), tail_seconds, size
            )
            burst = await _tail_latency(
                client, node_cluster.url, Pacing(rate / 2, BURST_STEP), tail_seconds, size
            )
            rss = node_cluster.rss_mib()
    finally:
        await node_cluster.close()
    return {
        "message_format": message_format,
        "node_rss_mib": rss,
        "node_idle_rss_mib": idle_rss,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "messages": messages,
        "size": size,
        "chunk": chunk,
        "producers": producers,
        "msgs_per_s": round(rate, 1),
        "baseline_msgs_per_s": round(base_rate, 1),
        "ratio": round(rate / base_rate, 3),
        "append_p50_ms": round(report.percentile(latencies, 0.5), 3),
        "append_p99_ms": round(report.percentile(latencies, 0.99), 3),
        "tail_requested_rate_msgs_per_s": round(rate / 2, 1),
        **tail.fields("tail"),
        **burst.fields("tail_burst5ms"),
        "timetick_interval_ms": 10.0,
    }


@dataclasses.dataclass(frozen=True)
class Load:
    """What each side of a comparison sends: ``messages`` of ``payload`` in
    chunks of ``chunk`` from ``producers`` tasks."""

    messages: int
    payload: bytes
    chunk: int = 256
    producers: int = 4


@dataclasses.dataclass(frozen=True)
class NodeSetup:
    """How a benchmark's node runs: metrics endpoint, TLS; and its client's TLS."""

    metrics_listen: str = ""
    tls: ServerTLS | None = None
    client_tls: ClientTLS | None = None
    message_format: int = max(RELEASE_FORMATS.writes)
    """The cluster's message format (2: record batches)."""

    def node_flags(self) -> list[str]:
        flags = ["--metrics-listen", self.metrics_listen] if self.metrics_listen else []
        if self.tls is not None:
            flags += ["--tls-cert", str(self.tls.cert), "--tls-key", str(self.tls.key)]
            if self.tls.client_ca is not None:
                flags += ["--tls-client-ca", str(self.tls.client_ca)]
        return flags

    def client_options(self) -> ClientOptions:
        return ClientOptions(tls=self.client_tls)

    def client_env(self) -> dict[str, str]:
        """The environment of a client process (the tail probe) with this TLS."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEADRACE_TLS_")}
        tls = self.client_tls
        if tls is not None:
            env[ENV_CA] = str(tls.ca)
            if tls.cert is not None and tls.key is not None:
                env[ENV_CERT], env[ENV_KEY] = str(tls.cert), str(tls.key)
            if tls.server_name:
                env[ENV_SERVER_NAME] = tls.server_name
        return env


async def _rate_through_node(root: Path, setup: NodeSetup, load: Load) -> float:
    """Messages/s through a fresh one-node cluster run as ``setup`` says."""
    metrics_listen = setup.metrics_listen
    node_cluster = _Cluster(root, setup)
    await node_cluster.start()
    try:
        async with HeadraceClient(node_cluster.url, options=setup.client_options()) as client:
            await client.wait_ready(PCHANNEL, timeout=60)
            rate, _ = await _through_node(
                client, load.messages, load.payload, load.chunk, load.producers
            )
            if metrics_listen:
                appended = await asyncio.to_thread(scraped_appends, metrics_listen)
                if appended != load.messages:
                    raise errors.HeadraceError(
                        f"the node's metrics count {appended} appended messages, "
                        f"not {load.messages}"
                    )
    finally:
        await node_cluster.close()
    return rate


def scraped_appends(address: str) -> float:
    """``headrace_append_messages_total`` summed over pchannels, scraped from ``address``."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "headrace_append_messages_total"
    )


async def bench_metrics(
    *,
    messages: int = 50_000,
    size: int = 1024,
    root: Path,
    rounds: int = 3,
    chunk: int = 256,
    producers: int = 4,
) -> dict[str, Any]:
    """Throughput of a node with metrics on over the same node with them off,
    alternating in ``rounds`` (each round a fresh node per side); the ratio is
    the median of the rounds' ratios, so load that drifts over the run cancels."""
    if messages < chunk or size < 8 or rounds < 1:
        raise errors.InvalidArgument(f"need messages >= {chunk}, size >= 8 and rounds >= 1")
    runtime.tune_process()
    load = Load(messages, bytes(size), chunk, producers)
    off: list[float] = []
    on: list[float] = []
    for r in range(rounds):
        off.append(await _rate_through_node(root / f"{r}-off", NodeSetup(), load))
        listen = NodeSetup(metrics_listen=f"127.0.0.1:{free_port()}")
        on.append(await _rate_through_node(root / f"{r}-on", listen, load))
    ratios = sorted(b / a for a, b in zip(off, on, strict=True))
    return {
        "messages": messages,
        "size": size,
        "rounds": rounds,
        "msgs_per_s_metrics_off": [round(x, 1) for x in off],
        "msgs_per_s_metrics_on": [round(x, 1) for x in on],
        "metrics_ratio": round(ratios[len(ratios) // 2], 3),
        "metrics_ratio_per_round": [round(b / a, 3) for a, b in zip(off, on, strict=True)],
    }


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def bench_tls(
    *,
    messages: int = 50_000,
    size: int = 1024,
    root: Path,
    rounds: int = 3,
    tail_seconds: float = 5.0,
) -> dict[str, Any]:
    """Throughput of a node with mutual TLS over the same node in plaintext,
    alternating in ``rounds`` (fresh nodes; the median ratio), then the tail
    latency over mutual TLS at half the TLS rate."""
    if messages < 256 or size < 8 or rounds < 1:
        raise errors.InvalidArgument("need messages >= 256, size >= 8 and rounds >= 1")
    runtime.tune_process()
    certs = make_certs(root / "certs")
    mutual = NodeSetup(
        tls=ServerTLS(certs.path("server.crt"), certs.path("server.key"), certs.path("ca.crt")),
        client_tls=ClientTLS(
            certs.path("ca.crt"), certs.path("client.crt"), certs.path("client.key")
        ),
    )
    load = Load(messages, bytes(size))
    plain: list[float] = []
    tls: list[float] = []
    for r in range(rounds):
        plain.append(await _rate_through_node(root / f"{r}-plain", NodeSetup(), load))
        tls.append(await _rate_through_node(root / f"{r}-tls", mutual, load))
    node_cluster = _Cluster(root / "tail", mutual)
    await node_cluster.start()
    try:
        async with HeadraceClient(node_cluster.url, options=mutual.client_options()) as client:
            await client.wait_ready(PCHANNEL, timeout=60)
            rate = statistics.median(tls) / 2
            tail = await _tail_latency(
                client, node_cluster.url, Pacing(rate), tail_seconds, size, env=mutual.client_env()
            )
    finally:
        await node_cluster.close()
    ratios = [b / a for a, b in zip(plain, tls, strict=True)]
    return {
        "messages": messages,
        "size": size,
        "rounds": rounds,
        "msgs_per_s_plaintext": [round(x, 1) for x in plain],
        "msgs_per_s_tls": [round(x, 1) for x in tls],
        "tls_ratio": round(statistics.median(ratios), 3),
        "tls_ratio_per_round": [round(x, 3) for x in ratios],
        "tls_tail_requested_rate_msgs_per_s": round(rate, 1),
        **tail.fields("tls_tail"),
    }

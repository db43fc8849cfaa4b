"""``headrace bench scale``: what idle pchannels and many vchannels cost a node.

One streaming-node process (a child, ``python -m headrace.cli node``) serves
``pchannels`` pchannels of the local backend; the coordinator runs in this
process (:class:`headrace.bench.procs.ProcCluster`).

* ``idle_cpu_pct``: once every pchannel is served and the node has settled,
  the node process's own CPU time (user + system, ``/proc/<pid>/stat``) over
  a window of ``idle_window_s`` seconds while nobody writes or reads, in
  percent of one core.
* ``vchannels_ratio``: append throughput through the node (the client, 1 KiB
  messages, ``producers`` tasks each sending chunks of ``chunk``) when the
  messages are spread round-robin over ``vchannels`` vchannels, against the
  same messages on a single vchannel: the median of the ratios of
  interleaved rounds of the same run (rates: medians of the rounds).
  Every vchannel of both sides routes to the same pchannel, so the ratio is
  the cost of the vchannel count alone, not of spreading over pchannels.
* ``node_cpu_us_per_msg`` and ``client_cpu_us_per_msg`` (``single`` and
  ``many``): CPU time per message of each side's rounds (medians), the node
  process's from ``/proc`` and this process's (the client; the coordinator in
  it is idle meanwhile): which side a rate is bound by, on a machine others
  share.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import statistics
import time
from pathlib import Path
from typing import Any

from headrace import errors, runtime
from headrace.bench import procs
from headrace.client.client import HeadraceClient
from headrace.cluster import ClusterConfig
from headrace.message.types import Message, MessageType


@dataclasses.dataclass(frozen=True)
class ScaleOptions:
    pchannels: int = 256
    idle_settle_s: float = 5.0
    """Time after every pchannel is served before the idle window starts."""
    idle_window_s: float = 10.0
    vchannels: int = 1000
    messages: int = 20_000
    """Messages per side and round."""
    size: int = 1024
    chunk: int = 256
    producers: int = 4
    rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("pchannels", "vchannels", "messages", "size", "chunk", "producers", "rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.InvalidArgument(f"bench scale: {name} must be a positive integer")
        for name in ("idle_settle_s", "idle_window_s"):
            if not getattr(self, name) > 0:
                raise errors.InvalidArgument(f"bench scale: {name} must be positive")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process ``pid`` has used (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError as exc:
        raise errors.Unavailable(f"cannot read the CPU time of process {pid}: {exc}") from None
    # After the command name: state is field 3, utime 14 and stime 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_pct(cpu_before: float, cpu_after: float, elapsed_s: float) -> float:
    """CPU used over ``elapsed_s`` seconds, in percent of one core (pure)."""
    return 0.0 if elapsed_s <= 0 else 100.0 * (cpu_after - cpu_before) / elapsed_s


def same_pchannel_names(config: ClusterConfig, pchannel: str, count: int) -> list[str]:
    """``count`` vchannel names that route to ``pchannel`` under ``config`` (pure)."""
    names: list[str] = []
    candidate = 0
    limit = count * len(config.pchannels) * 64
    while len(names) < count:
        if candidate > limit:
            raise errors.InvalidArgument(f"found no {count} vchannels routed to {pchannel}")
        name = f"scale-v{candidate}"
        candidate += 1
        if config.route(name) == pchannel:
            names.append(name)
    return names


@dataclasses.dataclass(frozen=True)
class Round:
    """One side's round: its rate and the CPU each process spent per message."""

    msgs_per_s: float
    node_cpu_us: float
    client_cpu_us: float


async def _round(
    client: HeadraceClient, node_pid: int, names: list[str], opts: ScaleOptions
) -> Round:
    """:func:`_send_rate`, with the CPU time the node and this process spent on it."""
    node_before, client_before = cpu_seconds(node_pid), time.process_time()
    rate = await _send_rate(client, names, opts)
    node_cpu = cpu_seconds(node_pid) - node_before
    client_cpu = time.process_time() - client_before
    per_msg = 1e6 / opts.messages
    return Round(rate, node_cpu * per_msg, client_cpu * per_msg)


def _median_us(rounds: list[Round], field: str) -> float:
    return round(float(statistics.median(getattr(r, field) for r in rounds)), 2)


async def _send_rate(client: HeadraceClient, names: list[str], opts: ScaleOptions) -> float:
    """Messages/s of ``opts.messages`` sent round-robin over ``names``."""
    payload = bytes(opts.size)
    chunks = [
        [
            Message(MessageType.INSERT, names[(start + i) % len(names)], payload)
            for i in range(min(opts.chunk, opts.messages - start))
        ]
        for start in range(0, opts.messages, opts.chunk)
    ]
    queue: asyncio.Queue[list[Message]] = asyncio.Queue()
    for chunk in chunks:
        queue.put_nowait(chunk)
    producer = client.producer()

    async def worker() -> None:
        while not queue.empty():
            for outcome in await producer.send_many(queue.get_nowait()):
                if isinstance(outcome, errors.HeadraceError):
                    raise outcome

    try:
        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(opts.producers)))
        elapsed = time.perf_counter() - start
    finally:
        await producer.close()
    return opts.messages / elapsed


async def _idle_cpu(node: procs.NodeProc, opts: ScaleOptions) -> float:
    assert node.proc is not None
    pid = node.proc.pid
    await asyncio.sleep(opts.idle_settle_s)
    t0, c0 = time.monotonic(), cpu_seconds(pid)
    await asyncio.sleep(opts.idle_window_s)
    return cpu_pct(c0, cpu_seconds(pid), time.monotonic() - t0)


async def bench_scale(root: Path, opts: ScaleOptions) -> dict[str, Any]:
    runtime.tune_process()
    spec = procs.ClusterSpec(
        root=root, nodes=1, pchannels=opts.pchannels, lease_ttl_s=10.0, ready_timeout_s=300.0
    )
    async with procs.ProcCluster(spec) as cluster:
        (node,) = cluster.nodes.values()
        idle = await _idle_cpu(node, opts)
        config = (await cluster.snapshot()).config
        assert config is not None
        target = config.pchannels[0]
        many = same_pchannel_names(config, target, opts.vchannels)
        assert node.proc is not None
        pid = node.proc.pid
        single_rounds: list[Round] = []
        many_rounds: list[Round] = []
        async with HeadraceClient(spec.metastore_url) as client:
            await client.wait_ready(target, timeout=60)
            await _send_rate(client, many[:1], dataclasses.replace(opts, messages=opts.chunk))
            for _ in range(opts.rounds):
                single_rounds.append(await _round(client, pid, many[:1], opts))
                many_rounds.append(await _round(client, pid, many, opts))
    single = [r.msgs_per_s for r in single_rounds]
    spread = [r.msgs_per_s for r in many_rounds]
    single_rate, many_rate = statistics.median(single), statistics.median(spread)
    ratios = [m / s for s, m in zip(single, spread, strict=True)]
    return {
        "pchannels": opts.pchannels,
        "idle_window_s": opts.idle_window_s,
        "idle_cpu_pct": round(idle, 2),
        "vchannels": opts.vchannels,
        "messages": opts.messages,
        "size": opts.size,
        "rounds": opts.rounds,
        "single_vchannel_msgs_per_s": round(single_rate, 1),
        "many_vchannels_msgs_per_s": round(many_rate, 1),
        "vchannels_ratio": round(statistics.median(ratios), 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "node_cpu_us_per_msg": {
            "single": _median_us(single_rounds, "node_cpu_us"),
            "many": _median_us(many_rounds, "node_cpu_us"),
        },
        "client_cpu_us_per_msg": {
            "single": _median_us(single_rounds, "client_cpu_us"),
            "many": _median_us(many_rounds, "client_cpu_us"),
        },
    }

"""Chaos mode: real node processes under faults, checked for exactly-once order.

:func:`run_chaos` starts a :class:`~headrace.bench.procs.ProcCluster` (node
processes, the coordinator in this process), then runs for ``duration_s``:

* one producer per vchannel, sending ``<vchannel>:<seq>`` payloads at a steady
  rate with the client's retries (so a retried message is deduplicated by the
  node); each acknowledged seq is recorded, a send that finally fails counts
  as ``failed`` (never as lost);
* one consumer per vchannel from the earliest position, recording every
  delivered message;
* a seeded fault injector: SIGKILL a node and start it again after a moment
  (as a supervisor would), SIGSTOP a node for longer than the lease TTL then
  SIGCONT it, and graceful moves with ``ClusterAdmin.request_move``. Faults
  may overlap; a kill or pause only happens while another node is healthy.
  Given a :class:`~headrace.bench.broker_faults.BrokerControl`, it also stalls
  the broker (SIGSTOP for seconds) and restarts it, one broker fault at a time.

Afterwards the faults stop, the producers finish, the consumers get a bounded
time to deliver every acknowledged message, the nodes stop, and every
pchannel's WAL is read from the backend directly. The result counts:

* ``lost``: acknowledged seqs never consumed; ``duplicates``: seqs consumed
  more than once; ``reordered``: consumed seqs lower than one consumed before
  on the same vchannel;
* ``stale_term_appends``: records of the full WAL read whose term is lower
  than that of a FENCE before them (including fences of a lower term);
* ``timetick_regressions``: records whose timetick is not above the previous
  record's (timeticks strictly increase in log order); ``rewritten_records``
  tells how many of them repeat an earlier record exactly (a resend that the
  backend stored twice);
* ``max_unavailable_ms``: the longest time a producer had messages
  outstanding without any acknowledgement.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import random
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from headrace import errors
from headrace.bench.broker_faults import BrokerControl
from headrace.bench.procs import (
    BROKER_FAULT_KINDS,
    FAULT_KINDS,
    ClusterSpec,
    FaultInjector,
    FaultTimings,
    ProcCluster,
    read_log,
)
from headrace.client.client import HeadraceClient
from headrace.client.producer import Producer, ProducerOptions
from headrace.guarded import cancel_and_settle, settle
from headrace.message.types import LogEntry, Message, MessageType

log = logging.getLogger(__name__)

INVARIANTS = ("lost", "duplicates", "reordered", "stale_term_appends", "timetick_regressions")
"""Counters of a chaos result that must all be zero."""
_TICK_S = 0.05
_MAX_OUTSTANDING = 2000


@dataclasses.dataclass(frozen=True)
class ChaosTimings:
    """Pacing of the run; the defaults suit a 20 s run as well as a 10 min one."""

    rate: float = 40.0
    """Messages per second per vchannel."""
    faults: FaultTimings = dataclasses.field(default_factory=FaultTimings)
    send_deadline_s: float = 30.0
    catchup_timeout_s: float = 90.0


def pchannel_prefix(backend: str) -> str:
    """Prefix of a run's pchannel names: fresh per run on a broker backend.

    The metastore is new on every run but a broker keeps its topics, and a
    topic written by an earlier run holds that run's terms, which fence the
    new run's writers. Local WALs live under the run's own directory.
    """
    return "chaos" if backend == "local" else f"chaos-{secrets.token_hex(4)}"


def violations(result: Mapping[str, Any]) -> dict[str, int]:
    """The invariant counters of a :func:`run_chaos` result that are not zero."""
    return {name: int(result[name]) for name in INVARIANTS if result[name]}


def parse_seq(payload: bytes, vchannel: str) -> int | None:
    """The seq of a ``<vchannel>:<seq>`` payload, None if it is not one."""
    name, sep, number = payload.decode(errors="replace").rpartition(":")
    if not sep or name != vchannel or not number.isdigit():
        return None
    return int(number)


def check_delivery(
    acked: Mapping[str, Iterable[int]], consumed: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """Lost, duplicated, reordered and unacknowledged-but-consumed seqs (pure)."""
    lost = duplicates = reordered = unacked = 0
    for vchannel, acked_seqs in acked.items():
        wanted = set(acked_seqs)
        seen: set[int] = set()
        highest = -1
        for seq in consumed.get(vchannel, ()):
            if seq in seen:
                duplicates += 1
            seen.add(seq)
            if seq < highest:
                reordered += 1
            highest = max(highest, seq)
        lost += len(wanted - seen)
        unacked += len(seen - wanted)
    return {
        "lost": lost,
        "duplicates": duplicates,
        "reordered": reordered,
        "consumed_unacked": unacked,
    }


def audit_log(entries: Sequence[LogEntry]) -> dict[str, int]:
    """Stale-term records and timetick regressions of one pchannel's full log (pure)."""
    fence_term = 0
    last_tick = -1
    stale = regressions = 0
    for entry in entries:
        msg = entry.message
        if msg.term < fence_term:
            stale += 1
        if msg.type is MessageType.FENCE:
            fence_term = max(fence_term, msg.term)
        if msg.timetick <= last_tick:
            regressions += 1
        last_tick = max(last_tick, msg.timetick)
    return {"stale_term_appends": stale, "timetick_regressions": regressions}


def count_rewritten(entries: Iterable[LogEntry]) -> int:
    """How many records of a log equal an earlier record of it (pure).

    Every append gets a new timetick, so such a record was written twice: a
    client resent what the broker had already stored. Telling these apart from
    real regressions says where to look when ``timetick_regressions`` is not 0.
    """
    seen: set[tuple[MessageType, str, int, int, bytes]] = set()
    rewritten = 0
    for entry in entries:
        msg = entry.message
        key = (msg.type, msg.vchannel, msg.term, msg.timetick, msg.payload)
        if key in seen:
            rewritten += 1
        seen.add(key)
    return rewritten


def seqs_in_log(entries: Iterable[LogEntry], vchannels: Iterable[str]) -> dict[str, list[int]]:
    """The seqs of the data messages of ``vchannels`` found in a log, in log order."""
    wanted = set(vchannels)
    found: dict[str, list[int]] = collections.defaultdict(list)
    for entry in entries:
        msg = entry.message
        if msg.vchannel in wanted and not msg.type.is_system:
            seq = parse_seq(msg.payload, msg.vchannel)
            if seq is not None:
                found[msg.vchannel].append(seq)
    return found


class ProducerStats:
    """What one producer sent, got acknowledged, and how long it went unanswered."""

    def __init__(self, vchannel: str) -> None:
        self.vchannel = vchannel
        self.sent = 0
        self.acked: list[int] = []
        self.failed: collections.Counter[str] = collections.Counter()
        self.examples: dict[str, str] = {}
        """The first error message seen per failure code."""
        self.outstanding = 0
        self._since = 0.0
        self.max_gap_s = 0.0
        self.max_gap_at = (0.0, 0.0)
        """(start, end) of the longest gap, :func:`time.monotonic` times."""

    def on_send(self, count: int, now: float) -> None:
        if self.outstanding == 0:
            self._since = now
        self.outstanding += count
        self.sent += count

    def on_outcome(self, seq: int, outcome: object, now: float) -> None:
        self.outstanding -= 1
        if isinstance(outcome, errors.HeadraceError):
            self.failed[outcome.code.value] += 1
            self.examples.setdefault(outcome.code.value, str(outcome))
            if self.outstanding == 0:
                self._gap(now)
            return
        self.acked.append(seq)
        self._gap(now)
        self._since = now

    def finish(self, now: float) -> None:
        if self.outstanding:
            self._gap(now)

    def _gap(self, now: float) -> None:
        if now - self._since > self.max_gap_s:
            self.max_gap_s = now - self._since
            self.max_gap_at = (self._since, now)


async def _produce(
    producer: Producer, stats: ProducerStats, stop: asyncio.Event, rate: float
) -> None:
    """Send numbered messages at ``rate``/s until ``stop``; wait for every outcome."""
    per_tick = max(1, round(rate * _TICK_S))
    pending: set[asyncio.Task[None]] = set()
    seq = 0

    async def send(seqs: list[int]) -> None:
        batch = [
            Message(MessageType.INSERT, stats.vchannel, f"{stats.vchannel}:{s}".encode())
            for s in seqs
        ]
        try:
            outcomes: list[object] = list(await producer.send_many(batch))
        except errors.HeadraceError as exc:
            outcomes = [exc] * len(seqs)
        now = time.monotonic()
        for s, outcome in zip(seqs, outcomes, strict=True):
            stats.on_outcome(s, outcome, now)

    next_tick = time.monotonic()
    while not stop.is_set():
        if stats.outstanding < _MAX_OUTSTANDING:
            seqs = list(range(seq + 1, seq + 1 + per_tick))
            seq += per_tick
            stats.on_send(len(seqs), time.monotonic())
            task = asyncio.create_task(send(seqs))
            pending.add(task)
            task.add_done_callback(pending.discard)
        next_tick += _TICK_S
        await asyncio.sleep(max(0.0, next_tick - time.monotonic()))
    await asyncio.gather(*pending)
    stats.finish(time.monotonic())


@dataclasses.dataclass
class ConsumerLog:
    """Every message one consumer delivered: (seq, id, term, timetick)."""

    vchannel: str
    delivered: list[tuple[int, str, int, int]] = dataclasses.field(default_factory=list)
    seen: set[int] = dataclasses.field(default_factory=set)
    foreign: int = 0
    """Deliveries that were not this vchannel's numbered payloads."""
    error: str = ""

    @property
    def seqs(self) -> list[int]:
        return [d[0] for d in self.delivered]


async def _consume(client: HeadraceClient, record: ConsumerLog) -> None:
    try:
        async with client.consume(record.vchannel, start="earliest") as consumer:
            async for entry in consumer:
                msg = entry.message
                seq = parse_seq(msg.payload, record.vchannel)
                if seq is None or msg.vchannel != record.vchannel:
                    record.foreign += 1
                    continue
                record.delivered.append((seq, str(entry.id), msg.term, msg.timetick))
                record.seen.add(seq)
    except errors.HeadraceError as exc:
        record.error = str(exc)
        log.error("consumer of %s failed: %s", record.vchannel, exc)


async def _wait_caught_up(
    stats: Sequence[ProducerStats], logs: Mapping[str, ConsumerLog], timeout: float
) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        missing = sum(len(set(s.acked) - logs[s.vchannel].seen) for s in stats)
        if missing == 0:
            return True
        if time.monotonic() >= deadline:
            log.error("consumers still miss %d acknowledged messages after %gs", missing, timeout)
            return False
        await asyncio.sleep(0.2)


async def _audit_wal(procs: ProcCluster, vchannels: Sequence[str]) -> dict[str, Any]:
    backend = procs.open_backend()
    totals: collections.Counter[str] = collections.Counter()
    in_log: dict[str, list[int]] = collections.defaultdict(list)
    try:
        for pchannel in procs.spec.pchannel_names:
            entries = await read_log(backend, pchannel)
            totals.update(audit_log(entries))
            totals["rewritten_records"] += count_rewritten(entries)
            totals["wal_records"] += len(entries)
            for vchannel, seqs in seqs_in_log(entries, vchannels).items():
                in_log[vchannel].extend(seqs)
    finally:
        await backend.close()
    return {"counts": dict(totals), "in_log": in_log}


async def run_chaos(
    root: Path,
    duration_s: float,
    *,
    nodes: int = 3,
    pchannels: int = 8,
    vchannels: int = 8,
    lease_ttl_s: float = 2.0,
    seed: int | None = None,
    backend: str = "local",
    backend_settings: Mapping[str, Any] | None = None,
    timings: ChaosTimings | None = None,
    broker: BrokerControl | None = None,
) -> dict[str, Any]:
    """Run the chaos workload for ``duration_s`` seconds of faults; the findings.

    ``broker``: the broker of a Kafka or Pulsar run, to stall and restart too.
    """
    if duration_s <= 0 or vchannels < 1:
        raise errors.InvalidArgument("need a positive duration and at least one vchannel")
    if broker is not None and backend == "local":
        raise errors.InvalidArgument("broker faults need a broker backend (kafka or pulsar)")
    timings = timings or ChaosTimings()
    if seed is None:
        seed = random.SystemRandom().randrange(1 << 32)
    spec = ClusterSpec(
        root=Path(root),
        nodes=nodes,
        pchannels=pchannels,
        lease_ttl_s=lease_ttl_s,
        backend=backend,
        backend_settings=dict(backend_settings or {}),
        pchannel_prefix=pchannel_prefix(backend),
    )
    names = [f"chaos-v{i}" for i in range(vchannels)]
    started = time.monotonic()
    procs = ProcCluster(spec)
    try:
        await procs.start()
        injector = FaultInjector(procs, random.Random(seed), timings.faults, broker)
        outcome = await _workload(procs, names, duration_s, injector, timings)
        await procs.stop_nodes()
        audit = await _audit_wal(procs, names)
    finally:
        await procs.close()
    stats: list[ProducerStats] = outcome["stats"]
    logs: dict[str, ConsumerLog] = outcome["logs"]
    acked = {s.vchannel: s.acked for s in stats}
    worst = max(stats, key=lambda s: s.max_gap_s)
    delivery = check_delivery(acked, {v: logs[v].seqs for v in names})
    in_log = audit["in_log"]
    failed: collections.Counter[str] = collections.Counter()
    examples: dict[str, str] = {}
    for s in stats:
        failed.update(s.failed)
        examples = {**s.examples, **examples}
    return {
        "acked": sum(len(s.acked) for s in stats),
        "consumed": sum(len(logs[v].delivered) for v in names),
        "lost": delivery["lost"],
        "duplicates": delivery["duplicates"],
        "reordered": delivery["reordered"],
        "stale_term_appends": audit["counts"].get("stale_term_appends", 0),
        "timetick_regressions": audit["counts"].get("timetick_regressions", 0),
        "max_unavailable_ms": round(worst.max_gap_s * 1000, 1),
        "faults": {
            kind: injector.counts[kind]
            for kind in (*FAULT_KINDS, *(BROKER_FAULT_KINDS if broker is not None else ()))
        },
        "fault_errors": injector.fault_errors,
        "duration_s": duration_s,
        "seed": seed,
        "max_unavailable_where": {
            "vchannel": worst.vchannel,
            "from_s": round(worst.max_gap_at[0] - outcome["origin"], 1),
            "faults_around": injector.around(*worst.max_gap_at, origin=outcome["origin"]),
        },
        "failed": sum(failed.values()),
        "failed_by_code": dict(failed),
        "failed_examples": examples,
        "consumed_unacked": delivery["consumed_unacked"],
        "acked_missing_from_wal": sum(len(set(acked[v]) - set(in_log.get(v, ()))) for v in names),
        "duplicates_in_wal": sum(len(seqs) - len(set(seqs)) for seqs in in_log.values()),
        "rewritten_records": audit["counts"].get("rewritten_records", 0),
        "wal_records": audit["counts"].get("wal_records", 0),
        "caught_up": outcome["caught_up"],
        "consumer_errors": [f"{v}: {logs[v].error}" for v in names if logs[v].error],
        "foreign_deliveries": sum(logs[v].foreign for v in names),
        "moves_requested": injector.moves_requested,
        "faults_skipped": injector.skipped,
        "node_starts": {n.node_id: n.starts for n in procs.nodes.values()},
        "nodes": nodes,
        "pchannels": pchannels,
        "vchannels": vchannels,
        "lease_ttl_s": lease_ttl_s,
        "backend": backend,
        "pchannel_prefix": spec.pchannel_prefix,
        "rate_per_vchannel": timings.rate,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


async def _workload(
    procs: ProcCluster,
    names: Sequence[str],
    duration_s: float,
    injector: FaultInjector,
    timings: ChaosTimings,
) -> dict[str, Any]:
    """Producers, consumers and faults; then the bounded catch-up."""
    stop = asyncio.Event()
    stats = [ProducerStats(v) for v in names]
    logs = {v: ConsumerLog(v) for v in names}
    options = ProducerOptions(deadline=timings.send_deadline_s)
    async with HeadraceClient(procs.spec.metastore_url, procs.spec.cluster) as client:
        consumers = [asyncio.create_task(_consume(client, logs[v])) for v in names]
        producers = [client.producer(options) for _ in names]
        sending = [
            asyncio.create_task(_produce(p, s, stop, timings.rate))
            for p, s in zip(producers, stats, strict=True)
        ]
        origin = time.monotonic()
        try:
            await injector.run(duration_s)
            await injector.settle()
            stop.set()
            await asyncio.gather(*sending)
            await asyncio.gather(*(p.close() for p in producers))
            await procs.wait_assigned(timings.catchup_timeout_s)
            caught_up = await _wait_caught_up(stats, logs, timings.catchup_timeout_s)
        finally:
            stop.set()
            await cancel_and_settle([*consumers, *sending], what="chaos clients", logger=log)
            await settle((p.close() for p in producers), what="closing producers", logger=log)
    return {
        "stats": stats,
        "logs": logs,
        "caught_up": caught_up,
        "origin": origin,
    }

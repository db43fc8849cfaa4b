"""``headrace bench handoff``: how long a pchannel is unavailable when it moves.

A 3-node cluster of real node processes (coordinator in this process, local
WAL, balancing suspended so only the measured moves happen). A probe producer
appends to one vchannel of the measured pchannel without pause, one append in
flight at a time, and records when each was sent and acknowledged and under
which term.

* Graceful move: ``ClusterAdmin.request_move`` to the next node. The
  unavailability of a move is the probe's gap between the last acknowledgement
  under the old term and the first under the new one. With one append in
  flight, the old owner's first refusal comes after its last acknowledgement,
  so this bounds the refusal-to-first-append time from above.
* Crash failover: SIGKILL the owner; the unavailability is the time from the
  kill to the probe's first acknowledgement under a new term. The killed node
  is started again (and awaited) before the next round.

Each round also splits its time by the assignment records' ``updated_at``
stamps (written by the coordinator and the nodes): for a move, ``react``
(request to UNASSIGNING), ``release`` (old owner drains and closes),
``reassign`` (UNASSIGNED to ASSIGNING), ``open`` (new owner opens and fences,
ASSIGNING to ASSIGNED) and ``client`` (ASSIGNED to the first acknowledged
append); for a failover, ``detect`` (kill to ASSIGNING: session expiry plus
the coordinator's reaction), ``open`` and ``client``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from headrace import errors
from headrace.bench.procs import ClusterSpec, ProcCluster
from headrace.client.client import HeadraceClient
from headrace.cluster import NEW_CLUSTER_ROUTING, Assignment, AssignmentState, Routing, route
from headrace.coordinator.snapshot import ClusterSnapshot, wait_for
from headrace.guarded import cancel_and_settle
from headrace.metastore.contract import EventType

PCHANNELS = 3
ROUND_TIMEOUT_S = 60.0


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (0 for no values)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, min(len(ordered), math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def probe_vchannel(
    pchannel: str, pchannels: Sequence[str], routing: Routing = NEW_CLUSTER_ROUTING
) -> str:
    """A vchannel name that routes to ``pchannel`` (in a cluster this bench created)."""
    for i in range(100_000):
        name = f"probe-{i}"
        if route(name, pchannels, routing) == pchannel:
            return name
    raise errors.InvalidArgument(f"no probe vchannel routes to {pchannel}")


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    sent: float
    acked: float
    term: int


class Probe:
    """Sequential appends to one vchannel; every acknowledgement with its term."""

    def __init__(self, client: HeadraceClient, vchannel: str, interval_s: float = 0.002) -> None:
        self.client = client
        self.vchannel = vchannel
        self.interval_s = interval_s
        """Pause after each acknowledgement (the probe's resolution)."""
        self.samples: list[Sample] = []
        self.failures = 0
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="handoff-probe")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_settle([self._task], what="stopping the handoff probe")

    async def _run(self) -> None:
        async with self.client.producer() as producer:
            seq = 0
            while True:
                seq += 1
                sent = time.time()
                try:
                    result = await producer.send(self.vchannel, str(seq).encode())
                except errors.HeadraceError:
                    self.failures += 1
                    continue
                self.samples.append(Sample(sent, time.time(), result.term))
                self._changed.set()
                self._changed = asyncio.Event()
                await asyncio.sleep(self.interval_s)

    async def first_above(self, term: int, timeout: float) -> tuple[Sample, Sample | None]:
        """The first sample with a term above ``term``, and the last one before it."""
        deadline = time.monotonic() + timeout
        while True:
            for i, sample in enumerate(self.samples):
                if sample.term > term:
                    return sample, (self.samples[i - 1] if i else None)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.Unavailable(f"no append was acknowledged above term {term}")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._changed.wait()

    async def wait_samples(self, count: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        target = len(self.samples) + count
        while len(self.samples) < target:
            if time.monotonic() >= deadline:
                raise errors.Unavailable("the probe makes no progress")
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(deadline - time.monotonic()):
                    await self._changed.wait()


class History:
    """Every version of one assignment record, as the metastore watch saw them."""

    def __init__(self) -> None:
        self.records: list[Assignment] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self, procs: ProcCluster, pchannel: str) -> None:
        key = procs.keys.pchannel(pchannel)
        watch = await procs.metastore.watch_prefix(key)

        async def follow() -> None:
            try:
                async for event in watch:
                    if event.type is EventType.PUT and event.kv.key == key:
                        self.records.append(Assignment.from_json(event.kv.value))
            finally:
                await watch.close()

        self._task = asyncio.create_task(follow(), name="handoff-history")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_settle([self._task], what="stopping the assignment history")

    def stamp(self, state: AssignmentState, term: int, *, above: bool = False) -> float | None:
        """``updated_at`` of the first record in ``state`` with ``term`` (or any above)."""
        for record in self.records:
            if record.state is state and (record.term > term if above else record.term == term):
                return record.updated_at
        return None


def _ms(later: float | None, earlier: float | None) -> float | None:
    if later is None or earlier is None:
        return None
    return round((later - earlier) * 1000, 1)


async def _landed(
    procs: ProcCluster, pchannel: str, old: Assignment, target: str | None
) -> Assignment:
    def done(snap: ClusterSnapshot) -> bool:
        now = snap.assignments.get(pchannel)
        return (
            now is not None
            and now.state is AssignmentState.ASSIGNED
            and now.term > old.term
            and (now.node == target if target else now.node != old.node)
        )

    snap = await wait_for(procs.metastore, procs.spec.cluster, done, ROUND_TIMEOUT_S)
    return snap.assignments[pchannel]


async def _current(procs: ProcCluster, pchannel: str) -> Assignment:
    def ready(snap: ClusterSnapshot) -> bool:
        record = snap.assignments.get(pchannel)
        return record is not None and record.state is AssignmentState.ASSIGNED

    snap = await wait_for(procs.metastore, procs.spec.cluster, ready, ROUND_TIMEOUT_S)
    return snap.assignments[pchannel]


async def _graceful(
    procs: ProcCluster, probe: Probe, history: History, pchannel: str
) -> dict[str, Any]:
    old = await _current(procs, pchannel)
    nodes = sorted(procs.nodes)
    target = nodes[(nodes.index(old.node) + 1) % len(nodes)]
    requested = time.time()
    await procs.admin.request_move(pchannel, target)
    new = await _landed(procs, pchannel, old, target)
    first, before = await probe.first_above(old.term, ROUND_TIMEOUT_S)
    unassigning = history.stamp(AssignmentState.UNASSIGNING, old.term)
    unassigned = history.stamp(AssignmentState.UNASSIGNED, old.term)
    assigning = history.stamp(AssignmentState.ASSIGNING, new.term)
    assigned = history.stamp(AssignmentState.ASSIGNED, new.term)
    return {
        "kind": "move",
        "from": old.node,
        "to": new.node,
        "target": target,
        "old_term": old.term,
        "term": new.term,
        "unavailable_ms": _ms(first.acked, before.acked if before else requested),
        "react_ms": _ms(unassigning, requested),
        "release_ms": _ms(unassigned, unassigning),
        "reassign_ms": _ms(assigning, unassigned),
        "open_ms": _ms(assigned, assigning),
        "client_ms": _ms(first.acked, assigned),
    }


async def _failover(
    procs: ProcCluster, probe: Probe, history: History, pchannel: str
) -> dict[str, Any]:
    old = await _current(procs, pchannel)
    node = procs.nodes[old.node]
    killed = time.time()
    await node.kill()
    new = await _landed(procs, pchannel, old, None)
    first, _ = await probe.first_above(old.term, ROUND_TIMEOUT_S)
    assigning = history.stamp(AssignmentState.ASSIGNING, old.term, above=True)
    assigned = history.stamp(AssignmentState.ASSIGNED, new.term)
    await node.start()
    await wait_for(
        procs.metastore, procs.spec.cluster, lambda s: old.node in s.nodes, ROUND_TIMEOUT_S
    )
    return {
        "kind": "failover",
        "from": old.node,
        "to": new.node,
        "old_term": old.term,
        "term": new.term,
        "unavailable_ms": _ms(first.acked, killed),
        "detect_ms": _ms(assigning, killed),
        "open_ms": _ms(assigned, assigning),
        "client_ms": _ms(first.acked, assigned),
    }


def _p50(rounds: Sequence[dict[str, Any]], field: str) -> float | None:
    values = [r[field] for r in rounds if r.get(field) is not None]
    return round(statistics.median(values), 1) if values else None


async def bench_handoff(
    root: Path, moves: int = 20, failovers: int = 5, lease_ttl_s: float = 3.0
) -> dict[str, Any]:
    """Measure ``moves`` graceful moves and ``failovers`` crash failovers."""
    if moves < 0 or failovers < 0 or moves + failovers == 0:
        raise errors.InvalidArgument("need at least one move or failover")
    spec = ClusterSpec(
        root=Path(root),
        nodes=3,
        pchannels=PCHANNELS,
        lease_ttl_s=lease_ttl_s,
        pchannel_prefix="handoff",
    )
    pchannel = spec.pchannel_names[0]
    rounds: list[dict[str, Any]] = []
    history = History()
    async with ProcCluster(spec) as procs:
        await procs.admin.suspend_balance(True)
        await history.start(procs, pchannel)
        async with HeadraceClient(spec.metastore_url, spec.cluster) as client:
            probe = Probe(client, probe_vchannel(pchannel, spec.pchannel_names))
            probe.start()
            try:
                await probe.wait_samples(20, ROUND_TIMEOUT_S)
                for _ in range(moves):
                    rounds.append(await _graceful(procs, probe, history, pchannel))
                    await probe.wait_samples(20, ROUND_TIMEOUT_S)
                for _ in range(failovers):
                    rounds.append(await _failover(procs, probe, history, pchannel))
                    await probe.wait_samples(20, ROUND_TIMEOUT_S)
            finally:
                await probe.stop()
                await history.stop()
    graceful = [r for r in rounds if r["kind"] == "move"]
    crashes = [r for r in rounds if r["kind"] == "failover"]
    graceful_ms = [r["unavailable_ms"] for r in graceful]
    failover_ms = [r["unavailable_ms"] for r in crashes]
    lease_ttl_ms = round(lease_ttl_s * 1000, 1)
    return {
        "graceful_p50_ms": percentile(graceful_ms, 0.5),
        "graceful_p99_ms": percentile(graceful_ms, 0.99),
        "failover_p50_ms": percentile(failover_ms, 0.5),
        "failover_p99_ms": percentile(failover_ms, 0.99),
        "lease_ttl_ms": lease_ttl_ms,
        "moves": len(graceful),
        "failovers": len(crashes),
        "graceful_target_p99_ms": 500.0,
        "failover_target_p99_ms": lease_ttl_ms + 1000.0,
        "graceful_breakdown_p50_ms": {
            part: _p50(graceful, f"{part}_ms")
            for part in ("react", "release", "reassign", "open", "client")
        },
        "failover_breakdown_p50_ms": {
            part: _p50(crashes, f"{part}_ms") for part in ("detect", "open", "client")
        },
        "probe_acks": len(probe.samples),
        "probe_failures": probe.failures,
        "rounds": rounds,
    }

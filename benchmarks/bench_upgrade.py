"""Upgrade benchmark (issue #13): a Rolling UpgradePlan under load on the real API server.

Starts the test bed of :mod:`benchmarks.operator_bed` (kube-apiserver,
kube-controller-manager, the process runner standing in for the kubelet, an
etcd for the metastore, the operator process), applies a StreamingCluster
(local WAL, lease TTL 3 s) and waits until it is Ready. Then, against it:

* a **load producer** sends numbered messages round-robin over one vchannel
  per pchannel (``load-0`` .. ``load-<n-1>``: the cluster's routing puts them
  on consecutive pchannels), ``--batch`` at a time, paced to ``--rate``
  messages/s;
* a **probe** per pchannel appends to a vchannel routed to it, one message in
  flight at a time, pausing ``--probe-interval`` after each acknowledgement,
  recording when each was acknowledged and under which term;
* a **tailing consumer** per load vchannel reads from the earliest message,
  concurrently, until the end marker written after the run;
* the metastore's assignment history is watched.

Once the balancer has finished spreading the new cluster (every pchannel
ASSIGNED, no assignment record written for 3 s) and every probe has
``--warmup`` acknowledgements, the UpgradePlan (Rolling, ``maxUnavailable:
1``) is applied; the run waits for Succeeded or Failed (a Blocked plan waits
for its gate; each Blocked message is reported under ``blocked`` with the
seconds after the apply it was first seen), keeps the load ``--after``
seconds more, stops it, writes the end markers and reads them.

Reported (one JSON object on stdout; progress on stderr):

* ``failed_writes``: messages the load producer or a probe got an error for
  (target 0); ``lost``: acknowledged load messages the consumers never read;
  ``duplicates``: load messages read more than once (targets 0); ``reordered``;
* ``max_stall_ms``: the longest time any producer (the load producer or a
  probe) went without an acknowledgement in the measured window, from the
  plan's apply until the load stops ``--after`` seconds past Succeeded
  (target <= 1000);
* ``seconds_per_node``: the plan's wall time from apply to Succeeded divided
  by the nodes; ``node_seconds``: per node, from the first poll that shows it
  past Pending to the first that shows it Done;
* ``move_unavailable_p50/p99/max_ms`` (target p99 <= 500): for every change
  of term a probe saw in the window, the gap between its last acknowledgement
  under the old term and its first under the new one (that pchannel's
  unavailability to a writer during the move, to within the probe interval);
  ``move_gaps`` lists them (pchannel, new term, seconds after the apply, ms);
  ``moves_measured`` is their number, ``moves`` the new terms the metastore
  recorded in the window (``updated_at``), ``failovers`` the records that took
  a pchannel from a node still holding it (0 when every move was a graceful
  handoff); ``move_breakdown_p50_ms``/``_max_ms`` split the gaps by the
  assignment records' stamps (:data:`PHASES`);
* ``loadavg_start``/``loadavg_end`` (1-minute load average) and the options.

    python benchmarks/bench_upgrade.py [--nodes 3] [--pchannels 16] [--rate 400]
        [--soak 5] [--workdir DIR]

``headrace bench upgrade --json`` runs this script.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO / "operator", REPO / "scripts", REPO):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

import headrace  # noqa: E402
from benchmarks.operator_bed import OperatorBed, control_plane, operator_in  # noqa: E402
from e2e.harness import (  # noqa: E402
    API_VERSION,
    CLUSTER_LABEL,
    cluster_manifest,
    condition,
    is_ready,
    live_pods,
    pod_ready,
    until,
)
from e2e.streams import AssignmentHistory, Traffic, consume, seal  # noqa: E402
from headrace.bench.handoff import Probe, Sample, percentile, probe_vchannel  # noqa: E402
from headrace.client import HeadraceClient, ProducerOptions  # noqa: E402
from headrace.cluster import Assignment, AssignmentState, ClusterConfig, Keys  # noqa: E402
from headrace.message.types import Message, MessageType  # noqa: E402
from headrace.metastore.factory import open_metastore  # noqa: E402
from headrace.wal.api import AppendResult  # noqa: E402

NAME = "upgrade"
PLAN = "upgrade-next"
TARGET_IMAGE = "headrace-node:bench-next"
QUIET_S = 3.0


@dataclasses.dataclass(frozen=True)
class UpgradeOptions:
    nodes: int = 3
    pchannels: int = 16
    rate: float = 400.0
    """Messages per second of the load producer."""
    batch: int = 16
    probe_interval_s: float = 0.02
    warmup: int = 20
    """Acknowledgements every probe has before the plan starts."""
    after_s: float = 3.0
    soak_s: int = 5
    drain_timeout_s: int = 120
    lease_ttl_s: int = 3
    resync_s: float = 2.0
    limit_s: float = 900.0
    """Longest the plan may take before the run gives up."""

    def validate(self) -> None:
        if self.nodes < 2:
            raise SystemExit("bench upgrade: --nodes must be at least 2 (one node moves at a time)")
        if self.pchannels < 1 or self.rate <= 0 or self.batch < 1:
            raise SystemExit("bench upgrade: --pchannels, --rate and --batch must be positive")


def log(message: str) -> None:
    print(f"bench upgrade: {message}", file=sys.stderr, flush=True)


class LoadProducer:
    """Numbered messages over ``vchannels``, paced; when each batch was acknowledged."""

    def __init__(self, vchannels: list[str], opts: UpgradeOptions) -> None:
        self.vchannels = vchannels
        self.opts = opts
        self.traffic = Traffic()
        self.acked_at: list[float] = []

    async def run(self, client: HeadraceClient, stop: asyncio.Event) -> None:
        interval = self.opts.batch / self.opts.rate
        options = ProducerOptions(max_batch_messages=self.opts.batch, deadline=60.0)
        traffic = self.traffic
        async with client.producer(options) as producer:
            next_at = time.monotonic()
            while not stop.is_set():
                numbered = [
                    (self.vchannels[(traffic.sent + i) % len(self.vchannels)], traffic.sent + i)
                    for i in range(self.opts.batch)
                ]
                traffic.sent += len(numbered)
                messages = [
                    Message(MessageType.INSERT, v, f"{v}:{n}".encode()) for v, n in numbered
                ]
                outcomes = await producer.send_many(messages)
                self.acked_at.append(time.time())
                for (vchannel, number), outcome in zip(numbered, outcomes, strict=True):
                    if isinstance(outcome, AppendResult):
                        traffic.acked.setdefault(vchannel, []).append(number)
                    else:
                        traffic.failed.append(f"{vchannel}:{number}: {outcome}")
                next_at += interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))


def max_gap_ms(stamps: list[float], start: float, end: float) -> float:
    """The longest time without an acknowledgement within ``[start, end]``."""
    inside = [start, *(t for t in stamps if start <= t <= end), end]
    return round(max(b - a for a, b in itertools.pairwise(inside)) * 1000, 1)


@dataclasses.dataclass(frozen=True)
class MoveGap:
    """A change of term a probe saw: last ack under the old term to first under the new."""

    pchannel: str
    term: int
    at: float
    """When the first acknowledgement under the new term came (epoch seconds)."""
    ms: float
    old_term: int = 0
    last_ack: float = 0.0
    """The last acknowledgement under the old term (epoch seconds)."""


PHASES = ("ack_to_unassigning", "release", "reassign", "open", "client")
"""Where a move's gap goes, by the assignment records' ``updated_at`` stamps:
the probe's last ack to the old owner's UNASSIGNING (the drain starting),
UNASSIGNING to UNASSIGNED (the old owner finishes in-flight appends and closes),
UNASSIGNED to ASSIGNING (the coordinator picks the next owner), ASSIGNING to
ASSIGNED (the new owner opens and fences the WAL), ASSIGNED to the probe's
first ack (the client learns the owner and reconnects)."""


def breakdown_ms(gap: MoveGap, records: list[Assignment]) -> dict[str, float | None]:
    """The gap split into :data:`PHASES` (None where a stamp is missing, e.g.
    no UNASSIGNING/UNASSIGNED after a failover)."""

    def stamp(state: AssignmentState, term: int) -> float | None:
        for record in records:
            if record.pchannel == gap.pchannel and record.state is state and record.term == term:
                return record.updated_at
        return None

    points = [
        gap.last_ack,
        stamp(AssignmentState.UNASSIGNING, gap.old_term),
        stamp(AssignmentState.UNASSIGNED, gap.old_term),
        stamp(AssignmentState.ASSIGNING, gap.term),
        stamp(AssignmentState.ASSIGNED, gap.term),
        gap.at,
    ]
    return {
        phase: None if a is None or b is None else round((b - a) * 1000, 1)
        for phase, a, b in zip(PHASES, points, points[1:], strict=False)
    }


def move_gaps(pchannel: str, samples: list[Sample], start: float, end: float) -> list[MoveGap]:
    """The changes of term in a probe's samples whose new term was first acknowledged within
    ``[start, end]``."""
    return [
        MoveGap(
            pchannel,
            after.term,
            after.acked,
            round((after.acked - before.acked) * 1000, 1),
            before.term,
            before.acked,
        )
        for before, after in itertools.pairwise(samples)
        if after.term != before.term and start <= after.acked <= end
    ]


@dataclasses.dataclass
class PlanClock:
    """When the plan started, finished, and when each node was first seen moving and Done."""

    applied: float = 0.0
    finished: float = 0.0
    stopped: float = 0.0
    """When the load stopped (``after_s`` past ``finished``): the measured window's end."""
    started: dict[str, float] = dataclasses.field(default_factory=dict)
    done: dict[str, float] = dataclasses.field(default_factory=dict)
    phase: str = ""
    blocked: dict[str, float] = dataclasses.field(default_factory=dict)
    """Each distinct Blocked message, with when it was first seen."""

    def observe(self, status: dict[str, Any]) -> None:
        now = time.time()
        self.phase = str(status.get("phase", ""))
        for node in status.get("nodes") or []:
            if node.get("step") not in (None, "Pending"):
                self.started.setdefault(node["node"], now)
            if node.get("step") == "Done":
                self.done.setdefault(node["node"], now)


class Run:
    def __init__(self, bed: OperatorBed, etcd: str, opts: UpgradeOptions) -> None:
        self.bed, self.etcd, self.opts = bed, etcd, opts
        self.kube, self.ns = bed.kube, bed.namespace
        self.cluster = f"{self.ns}.{NAME}"
        self.url = f"etcd://{etcd}"

    async def settled(self) -> bool:
        body = await self.kube.get(API_VERSION, "StreamingCluster", self.ns, NAME)
        pods = live_pods(await self.kube.list("v1", "Pod", self.ns, {CLUSTER_LABEL: NAME}))
        pchannels = self.opts.pchannels
        return (
            is_ready(body)
            and ((body or {}).get("status") or {}).get("pchannelSummary")
            == f"{pchannels}/{pchannels}"
            and len(pods) == self.opts.nodes
            and all(pod_ready(p) for p in pods.values())
        )

    async def config(self) -> ClusterConfig:
        store = await open_metastore(self.url)
        try:
            kv = await store.get(Keys(self.cluster).config)
        finally:
            await store.close()
        if kv is None:
            raise RuntimeError(f"no cluster config for {self.cluster} in the metastore")
        return ClusterConfig.from_json(kv.value)

    def plan_manifest(self) -> dict[str, Any]:
        return {
            "apiVersion": API_VERSION,
            "kind": "UpgradePlan",
            "metadata": {"name": PLAN, "namespace": self.ns},
            "spec": {
                "clusterRef": {"name": NAME},
                # the process runner runs the working tree whatever the image:
                # the nodes register this tree's version
                "version": headrace.__version__,
                "image": TARGET_IMAGE,
                "mode": "Rolling",
                "maxUnavailable": 1,
                "soakSeconds": self.opts.soak_s,
                "drainTimeoutSeconds": self.opts.drain_timeout_s,
            },
        }

    async def watch_plan(self, clock: PlanClock) -> None:
        """Poll the plan until it ends (Succeeded or Failed) or ``limit_s`` passed.
        Blocked is not an end: a gate that fails (e.g. a pchannel still moving)
        blocks the plan until it passes; every Blocked message is recorded."""
        while clock.phase not in ("Succeeded", "Failed"):
            if time.time() - clock.applied > self.opts.limit_s:
                log(f"the plan is still {clock.phase!r} after {self.opts.limit_s:g}s")
                break
            await asyncio.sleep(0.2)
            body = await self.kube.get(API_VERSION, "UpgradePlan", self.ns, PLAN)
            clock.observe(((body or {}).get("status")) or {})
            if clock.phase == "Blocked":
                clock.blocked.setdefault(condition(body, "Blocked").get("message", ""), time.time())
        clock.finished = time.time()

    async def quiet(self, history: AssignmentHistory) -> bool:
        """Every pchannel ASSIGNED and no assignment record written for ``QUIET_S``:
        the balancer has finished spreading the new cluster."""
        records = await history.current()
        last = max((r.updated_at for r in records.values()), default=0.0)
        return (
            len(records) == self.opts.pchannels
            and all(r.state is AssignmentState.ASSIGNED for r in records.values())
            and time.time() - last >= QUIET_S
        )


async def _wait(check: Callable[[], Awaitable[bool]], what: str, limit: float) -> None:
    await until(check, what, limit=limit, every=0.2)


async def measure(bed: OperatorBed, etcd: str, opts: UpgradeOptions) -> dict[str, Any]:
    run = Run(bed, etcd, opts)
    await bed.kube.apply(
        cluster_manifest(
            NAME,
            bed.namespace,
            etcd,
            nodes=opts.nodes,
            pchannels=opts.pchannels,
            lease_ttl_s=opts.lease_ttl_s,
        )
    )
    await _wait(run.settled, f"{NAME} Ready", 300)
    log("cluster Ready")
    config = await run.config()
    load_vchannels = [f"load-{i}" for i in range(opts.pchannels)]
    history = await AssignmentHistory(run.url, run.cluster).start()
    await _wait(lambda: run.quiet(history), "the assignments settled", 300)
    clock = PlanClock()
    stop = asyncio.Event()
    async with HeadraceClient(run.url, run.cluster) as client:
        probes = {
            p: Probe(
                client, probe_vchannel(p, config.pchannels, config.routing), opts.probe_interval_s
            )
            for p in config.pchannels
        }
        load = LoadProducer(load_vchannels, opts)
        consumers = {
            v: asyncio.create_task(consume(client, v, limit=opts.limit_s + 600))
            for v in load_vchannels
        }
        for probe in probes.values():
            probe.start()
        producing = asyncio.create_task(load.run(client, stop))
        try:
            for probe in probes.values():
                await probe.wait_samples(opts.warmup, 120)
            log("load running; applying the UpgradePlan")
            clock.applied = time.time()
            await bed.kube.apply(run.plan_manifest())
            await run.watch_plan(clock)
            log(f"plan {clock.phase} after {clock.finished - clock.applied:.1f}s")
            await asyncio.sleep(opts.after_s)
        finally:
            clock.stopped = time.time()
            stop.set()
            await asyncio.wait_for(producing, 90)
            for probe in probes.values():
                await probe.stop()
        await seal(client, load_vchannels)
        read = {
            v: await asyncio.wait_for(task, opts.limit_s + 600) for v, task in consumers.items()
        }
    await history.stop()
    return report(opts, Observed(load, probes, read, clock, history))


@dataclasses.dataclass(frozen=True)
class Observed:
    """What a run saw: the producers, what the consumers read, the plan's clock,
    and the assignment history."""

    load: LoadProducer
    probes: dict[str, Probe]
    read: dict[str, list[int]]
    clock: PlanClock
    history: AssignmentHistory

    def moves(self) -> int:
        """New terms the metastore gave pchannels within the measured window (one per move)."""
        start, end = self.clock.applied, self.clock.stopped
        records = [r for _, r in self.history.records]
        before: dict[str, int] = {}
        for record in records:
            if record.updated_at < start:
                before[record.pchannel] = max(before.get(record.pchannel, 0), record.term)
        new_terms = {
            (r.pchannel, r.term)
            for r in records
            if start <= r.updated_at <= end and r.term > before.get(r.pchannel, 0)
        }
        return len(new_terms)

    def failovers(self) -> int:
        nodes = {r.node for _, r in self.history.records if r.node}
        return sum(len(self.history.taken_away(node)) for node in sorted(nodes))

    def gaps(self) -> list[MoveGap]:
        start, end = self.clock.applied, self.clock.stopped
        found = [
            g for p, probe in self.probes.items() for g in move_gaps(p, probe.samples, start, end)
        ]
        return sorted(found, key=lambda g: g.at)


def delivery(acked: dict[str, list[int]], read: dict[str, list[int]]) -> dict[str, int]:
    """Acknowledged messages never read, read twice, and vchannels read out of order."""
    lost = duplicates = reordered = consumed = 0
    for vchannel, numbers in read.items():
        sent = acked.get(vchannel, [])
        got = set(numbers)
        consumed += len(numbers)
        duplicates += len(numbers) - len(got)
        lost += len(set(sent) - got)
        first_reads = [n for n in dict.fromkeys(numbers) if n in set(sent)]
        reordered += int(first_reads != [n for n in sent if n in got])
    return {
        "lost": lost,
        "duplicates": duplicates,
        "reordered_vchannels": reordered,
        "consumed": consumed,
    }


def report(opts: UpgradeOptions, seen: Observed) -> dict[str, Any]:
    traffic, probes, clock = seen.load.traffic, seen.probes, seen.clock
    start, end = clock.applied, clock.stopped
    stall_load = max_gap_ms(seen.load.acked_at, start, end)
    stall_probe = max(max_gap_ms([s.acked for s in p.samples], start, end) for p in probes.values())
    found = seen.gaps()
    gaps = [g.ms for g in found]
    records = [r for _, r in seen.history.records]
    parts = [breakdown_ms(g, records) for g in found]
    node_seconds = {
        node: round(clock.done[node] - clock.started[node], 1)
        for node in sorted(clock.done)
        if node in clock.started
    }
    plan_s = clock.finished - start
    return {
        "plan_phase": clock.phase,
        "blocked": {message: round(at - start, 1) for message, at in clock.blocked.items()},
        "failed_writes": len(traffic.failed) + sum(p.failures for p in probes.values()),
        **delivery(traffic.acked, seen.read),
        "acked": traffic.acked_total,
        "probe_acks": sum(len(p.samples) for p in probes.values()),
        "max_stall_ms": max(stall_load, stall_probe),
        "max_stall_ms_load": stall_load,
        "max_stall_ms_probes": stall_probe,
        "seconds_per_node": round(plan_s / opts.nodes, 1),
        "plan_seconds": round(plan_s, 1),
        "node_seconds": node_seconds,
        "move_unavailable_p50_ms": percentile(gaps, 0.5),
        "move_unavailable_p99_ms": percentile(gaps, 0.99),
        "move_unavailable_max_ms": max(gaps, default=0.0),
        "moves_measured": len(gaps),
        "move_breakdown_p50_ms": {
            phase: percentile([b[phase] for b in parts if b[phase] is not None], 0.5)
            for phase in PHASES
        },
        "move_breakdown_max_ms": {
            phase: max((b[phase] for b in parts if b[phase] is not None), default=0.0)
            for phase in PHASES
        },
        "move_gaps": [
            {
                "pchannel": g.pchannel,
                "term": g.term,
                "at_s": round(g.at - start, 2),
                "ms": g.ms,
                **part,
            }
            for g, part in zip(found, parts, strict=True)
        ],
        "moves": seen.moves(),
        "failovers": seen.failovers(),
        "targets": {
            "failed_writes": 0,
            "lost": 0,
            "duplicates": 0,
            "max_stall_ms": 1000,
            "move_unavailable_p99_ms": 500,
        },
        "options": dataclasses.asdict(opts),
    }


def bench_upgrade(opts: UpgradeOptions, workdir: str | None = None) -> dict[str, Any]:
    """Run the benchmark on a fresh test bed; the JSON-ready result."""
    opts.validate()
    loadavg_start = os.getloadavg()[0]
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-upgrade-", dir=workdir) as tmp,
        control_plane(Path(tmp)) as plane,
    ):

        async def main() -> dict[str, Any]:
            async with operator_in(plane, opts.resync_s) as bed:
                return await measure(bed, plane.etcd, opts)

        result = asyncio.run(main())
    result["loadavg_start"] = round(loadavg_start, 2)
    result["loadavg_end"] = round(os.getloadavg()[0], 2)
    return result


def parse(argv: list[str] | None) -> tuple[UpgradeOptions, str | None]:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = UpgradeOptions()
    parser.add_argument("--nodes", type=int, default=defaults.nodes)
    parser.add_argument("--pchannels", type=int, default=defaults.pchannels)
    parser.add_argument("--rate", type=float, default=defaults.rate, help="load messages/s")
    parser.add_argument("--batch", type=int, default=defaults.batch)
    parser.add_argument(
        "--probe-interval", type=float, default=defaults.probe_interval_s, help="seconds"
    )
    parser.add_argument("--soak", type=int, default=defaults.soak_s, help="plan soakSeconds")
    parser.add_argument("--after", type=float, default=defaults.after_s)
    parser.add_argument("--workdir", default=None, help="where the test bed lives (default: tmp)")
    args = parser.parse_args(argv)
    opts = UpgradeOptions(
        nodes=args.nodes,
        pchannels=args.pchannels,
        rate=args.rate,
        batch=args.batch,
        probe_interval_s=args.probe_interval,
        soak_s=args.soak,
        after_s=args.after,
    )
    return opts, args.workdir


def main(argv: list[str] | None = None) -> int:
    opts, workdir = parse(argv)
    result = bench_upgrade(opts, workdir)
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0 if result["plan_phase"] == "Succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())

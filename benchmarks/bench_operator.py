"""Operator benchmark: how fast a StreamingCluster comes up and fails over.

Starts the Kubernetes test bed (kube-apiserver, kube-controller-manager, the
process runner standing in for the kubelet), an etcd for the Headrace
metastore, and the operator process (``python -m headrace_operator``, admin
kubeconfig). Each run applies a StreamingCluster and measures, polling every
50 ms:

* ``apply_to_ready_s``: apply -> Ready with every PChannelAssignment ASSIGNED;
* ``pods_running_to_ready_s``: every node pod Running -> the same (target <= 5 s);
* ``pods_running_to_assigned_s``: every node pod Running -> every pchannel
  ASSIGNED in the metastore (what clients see);
* ``pod_delete_to_reassigned_s``: ``kubectl delete pod`` of a node (graceful)
  -> each of its pchannels ASSIGNED elsewhere under a higher term in the
  metastore (target <= lease TTL + 2 s);
* ``pod_delete_to_status_s``: graceful delete -> the PChannelAssignments show it;
* ``node_crash_to_reassigned_s``: SIGKILL of a node's process (a crash: no
  session release; done through the test bed's process runner, as Kubernetes
  has no API to crash a container) -> its pchannels ASSIGNED elsewhere under a
  higher term (target <= lease TTL + 2 s).
* ``pods_running_to_pods_ready_s``: every node pod Running -> every node pod
  Ready (the readiness probe's period is part of ``pods_running_to_ready_s``).

Figures are medians over ``runs``; ``samples`` has every run. Prints one JSON
object::

    python benchmarks/bench_operator.py [--runs 3] [--nodes 3] [--pchannels 16]
        [--lease-ttl 3] [--resync-seconds 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import statistics
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

from benchmarks.operator_bed import ControlPlane, control_plane, operator_in  # noqa: E402
from e2e.harness import (  # noqa: E402
    API_VERSION,
    CLUSTER_LABEL,
    Kube,
    cluster_manifest,
    is_ready,
    placement,
    pod_ready,
)
from e2e.streams import AssignmentHistory  # noqa: E402
from headrace.cluster import AssignmentState  # noqa: E402
from headrace_testbed.kubelet import ProcessRunner  # noqa: E402

POLL_S = 0.05
LIMIT_S = 180.0


async def _clock(check: Callable[[], Awaitable[bool]], what: str) -> float:
    """monotonic() at the first poll where ``check`` holds."""
    deadline = time.monotonic() + LIMIT_S
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"not reached within {LIMIT_S:g}s: {what}")
        await asyncio.sleep(POLL_S)
    return time.monotonic()


@dataclasses.dataclass(frozen=True)
class Bed:
    kube: Kube
    namespace: str
    etcd: str
    runner: ProcessRunner


class Run:
    """One StreamingCluster from apply to deletion."""

    def __init__(self, kube: Kube, namespace: str, name: str, history: AssignmentHistory) -> None:
        self.kube, self.namespace, self.name, self.history = kube, namespace, name, history

    async def pods(self) -> list[dict[str, Any]]:
        return await self.kube.list("v1", "Pod", self.namespace, {CLUSTER_LABEL: self.name})

    async def placement(self) -> dict[str, dict[str, Any]]:
        items = await self.kube.list(
            API_VERSION, "PChannelAssignment", self.namespace, {CLUSTER_LABEL: self.name}
        )
        return placement(items)

    async def running(self, nodes: int) -> bool:
        pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == nodes and all(
            (p.get("status") or {}).get("phase") == "Running" for p in pods
        )

    async def assigned(self, pchannels: int) -> bool:
        records = await self.history.current()
        return len(records) == pchannels and all(
            r.state is AssignmentState.ASSIGNED for r in records.values()
        )

    async def ready(self, pchannels: int) -> bool:
        body = await self.kube.get(API_VERSION, "StreamingCluster", self.namespace, self.name)
        if not is_ready(body):
            return False
        where = await self.placement()
        return len(where) == pchannels and all(s.get("state") == "ASSIGNED" for s in where.values())

    async def pods_ready(self, nodes: int) -> bool:
        pods = [p for p in await self.pods() if not p["metadata"].get("deletionTimestamp")]
        return len(pods) == nodes and all(pod_ready(p) for p in pods)

    async def failover(
        self, victim: str, strike: Callable[[], Awaitable[object]]
    ) -> tuple[float, float]:
        """Seconds from ``strike`` (which stops ``victim``) to its pchannels
        reassigned in the metastore, and to the PChannelAssignments showing it."""
        held = {p: r.term for p, r in (await self.history.current()).items() if r.node == victim}

        async def moved() -> bool:
            records = await self.history.current()
            return all(
                records[p].state is AssignmentState.ASSIGNED
                and records[p].node != victim
                and records[p].term > t
                for p, t in held.items()
            )

        async def shown() -> bool:
            # Any higher term shows the failover (a restarted victim may get a
            # pchannel back by rebalancing before a pass mirrors the first move).
            where = await self.placement()
            return all(
                where[p].get("state") == "ASSIGNED" and where[p].get("term", 0) > t
                for p, t in held.items()
            )

        start = time.monotonic()
        await strike()
        reassigned = await _clock(moved, f"the pchannels of {victim} reassigned")
        status = await _clock(shown, f"the PChannelAssignments of {victim} updated")
        return reassigned - start, status - start


def _crash(runner: ProcessRunner, namespace: str, pod: str) -> Callable[[], Awaitable[None]]:
    """SIGKILL the node container's processes (the kubelet then restarts it)."""

    async def strike() -> None:
        worker = runner.worker(namespace, pod)
        if worker is None:
            raise RuntimeError(f"the process runner does not run {namespace}/{pod}")
        for run in worker.containers:
            run.signal(signal.SIGKILL)

    return strike


async def _one_run(bed: Bed, index: int, cfg: argparse.Namespace) -> dict[str, float]:
    kube, namespace, etcd = bed.kube, bed.namespace, bed.etcd
    name = f"bench-{index}"
    history = await AssignmentHistory(f"etcd://{etcd}", f"{namespace}.{name}").start()
    run = Run(kube, namespace, name, history)
    manifest = cluster_manifest(
        name,
        namespace,
        etcd,
        nodes=cfg.nodes,
        pchannels=cfg.pchannels,
        lease_ttl_s=cfg.lease_ttl,
    )
    try:
        applied = time.monotonic()
        await kube.apply(manifest)
        running = await _clock(lambda: run.running(cfg.nodes), "node pods Running")
        assigned = await _clock(lambda: run.assigned(cfg.pchannels), "pchannels ASSIGNED")
        pods_ready = await _clock(lambda: run.pods_ready(cfg.nodes), "node pods Ready")
        ready = await _clock(lambda: run.ready(cfg.pchannels), "Ready, all ASSIGNED")
        victim = f"{name}-node-1"

        async def delete() -> None:
            await kube.delete("v1", "Pod", namespace, victim)

        deleted, shown = await run.failover(victim, delete)
        await _clock(lambda: run.ready(cfg.pchannels), "Ready again")
        crashed = f"{name}-node-2"
        crash, _ = await run.failover(crashed, _crash(bed.runner, namespace, crashed))
        return {
            "apply_to_ready_s": ready - applied,
            "pods_running_to_ready_s": ready - running,
            "pods_running_to_assigned_s": max(0.0, assigned - running),
            "pods_running_to_pods_ready_s": pods_ready - running,
            "pod_delete_to_reassigned_s": deleted,
            "pod_delete_to_status_s": shown,
            "node_crash_to_reassigned_s": crash,
        }
    finally:
        await kube.delete(API_VERSION, "StreamingCluster", namespace, name)

        async def gone() -> bool:
            return not await run.pods()

        await _clock(gone, f"the pods of {name} deleted")
        await history.stop()


async def _measure(plane: ControlPlane, cfg: argparse.Namespace) -> list[Any]:
    async with operator_in(plane, cfg.resync_seconds) as op:
        bed = Bed(op.kube, op.namespace, plane.etcd, plane.runner)
        return [await _one_run(bed, i, cfg) for i in range(cfg.runs)]


def bench_operator(
    *,
    runs: int = 3,
    nodes: int = 3,
    pchannels: int = 16,
    lease_ttl_s: int = 3,
    resync_s: float = 2.0,
    workdir: str | None = None,
) -> dict[str, Any]:
    """Run the benchmark on a fresh test bed; the JSON-ready result."""
    cfg = argparse.Namespace(
        runs=runs, nodes=nodes, pchannels=pchannels, lease_ttl=lease_ttl_s, resync_seconds=resync_s
    )
    with (
        tempfile.TemporaryDirectory(prefix="headrace-bench-op-", dir=workdir) as tmp,
        control_plane(Path(tmp)) as plane,
    ):
        samples = asyncio.run(_measure(plane, cfg))
    result: dict[str, Any] = {
        key: round(statistics.median(s[key] for s in samples), 3) for key in samples[0]
    }
    result.update(
        lease_ttl_s=lease_ttl_s,
        resync_seconds=resync_s,
        nodes=nodes,
        pchannels=pchannels,
        runs=runs,
        samples=[{k: round(v, 3) for k, v in s.items()} for s in samples],
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pchannels", type=int, default=16)
    parser.add_argument("--lease-ttl", type=int, default=3)
    parser.add_argument("--resync-seconds", type=float, default=2.0)
    parser.add_argument("--workdir", default=None, help="where the test bed lives (default: tmp)")
    args = parser.parse_args(argv)
    result = bench_operator(
        runs=args.runs,
        nodes=args.nodes,
        pchannels=args.pchannels,
        lease_ttl_s=args.lease_ttl,
        resync_s=args.resync_seconds,
        workdir=args.workdir,
    )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

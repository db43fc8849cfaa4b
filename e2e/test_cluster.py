"""Scenarios 2-6 on one StreamingCluster ``demo`` (3 nodes, 16 pchannels,
local WAL, the session etcd as metastore), in order: ready and balanced;
traffic through the client; a node pod deleted under traffic; scale 3 -> 5 -> 3
with drain before delete; a pinned pchannel.

Each test starts by waiting for the steady state it needs, so a failure
names the scenario that broke rather than cascading silently.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from e2e.conftest import E2E
from e2e.harness import (
    API_VERSION,
    CLUSTER_LABEL,
    Kube,
    cluster_manifest,
    is_ready,
    live_pods,
    load,
    placement,
    pod_ready,
    until,
)
from e2e.streams import (
    HOLDING,
    AssignmentHistory,
    Traffic,
    consume,
    delivery_problems,
    produce,
    seal,
)
from headrace.client import HeadraceClient
from headrace.cluster import AssignmentState

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(240),
]

NAME = "demo"
PCHANNELS = 16
LEASE_TTL_S = 3


@dataclasses.dataclass
class Demo:
    e2e: E2E
    kube: Kube
    history: AssignmentHistory

    @property
    def ns(self) -> str:
        return self.e2e.namespace

    @property
    def metastore_cluster(self) -> str:
        return f"{self.ns}.{NAME}"

    def client(self) -> HeadraceClient:
        return HeadraceClient(self.e2e.etcd_url, self.metastore_cluster)

    async def body(self) -> dict[str, Any]:
        found = await self.kube.get(API_VERSION, "StreamingCluster", self.ns, NAME)
        assert found is not None, "the StreamingCluster is gone"
        return dict(found)

    async def pods(self) -> dict[str, dict[str, Any]]:
        return live_pods(await self.kube.list("v1", "Pod", self.ns, {CLUSTER_LABEL: NAME}))

    async def placement(self) -> dict[str, dict[str, Any]]:
        items = await self.kube.list(
            API_VERSION, "PChannelAssignment", self.ns, {CLUSTER_LABEL: NAME}
        )
        return placement(items)

    async def events(self, reason: str) -> list[dict[str, Any]]:
        events = await self.kube.list("v1", "Event", self.ns)
        chosen = [e for e in events if e.get("reason") == reason]
        return sorted(chosen, key=lambda e: e.get("eventTime") or e["metadata"]["name"])

    async def settled(self, nodes: int) -> bool:
        """Ready with ``nodes`` ready pods and every pchannel ASSIGNED to one of them."""
        body = await self.body()
        status = body.get("status") or {}
        if not is_ready(body) or status.get("nodeSummary") != f"{nodes}/{nodes}":
            return False
        pods = await self.pods()
        if len(pods) != nodes or not all(pod_ready(p) for p in pods.values()):
            return False
        where = await self.placement()
        return (
            len(where) == PCHANNELS
            and sum(load(where).values()) == PCHANNELS
            and set(load(where)) <= set(pods)
        )

    async def scale(self, nodes: int) -> None:
        await self.kube.patch(
            API_VERSION, "StreamingCluster", self.ns, NAME, {"spec": {"nodes": nodes}}
        )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def demo(e2e: E2E) -> AsyncIterator[Demo]:
    kube = e2e.admin()
    history = await AssignmentHistory(e2e.etcd_url, f"{e2e.namespace}.{NAME}").start()
    manifest = cluster_manifest(
        NAME,
        e2e.namespace,
        e2e.etcd_endpoint,
        nodes=3,
        pchannels=PCHANNELS,
        lease_ttl_s=LEASE_TTL_S,
    )
    await kube.apply(manifest)
    try:
        yield Demo(e2e, kube, history)
    finally:
        await kube.delete(API_VERSION, "StreamingCluster", e2e.namespace, NAME)

        async def gone() -> bool:
            pods = await kube.list("v1", "Pod", e2e.namespace, {CLUSTER_LABEL: NAME})
            body = await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, NAME)
            return body is None and not pods

        await until(gone, "demo and its pods deleted", limit=120)
        await history.stop()
        kube.close()


async def test_cluster_becomes_ready_with_every_pchannel_assigned_and_balanced(demo: Demo) -> None:
    async def balanced() -> bool:
        return await demo.settled(3) and sorted(load(await demo.placement()).values()) == [5, 5, 6]

    await until(balanced, "Ready, 16/16 ASSIGNED, 5/5/6", limit=150)
    body = await demo.body()
    assert body["status"]["pchannelSummary"] == "16/16"
    assert body["status"]["nodeSummary"] == "3/3"
    where = await demo.placement()
    assert sorted(where) == [f"pchannel-{i:03d}" for i in range(PCHANNELS)]
    records = await demo.history.current()
    for pchannel, status in where.items():
        assert status["state"] == "ASSIGNED" and status["term"] >= 1
        record = records[pchannel]
        assert (record.node, record.term, record.state.value) == (
            status["node"],
            status["term"],
            "ASSIGNED",
        ), f"{pchannel}: the PChannelAssignment does not mirror the metastore"
    assert set(load(where)) == {f"{NAME}-node-{i}" for i in range(3)}


async def test_client_produces_and_consumes_every_message_once_in_order(demo: Demo) -> None:
    await until(lambda: demo.settled(3), "the cluster settled", limit=60)
    vchannels = [f"by-client-{i}" for i in range(8)]
    async with demo.client() as client:
        traffic = await produce(client, vchannels, Traffic(), count=5000, batch=128)
        assert traffic.failed == [] and traffic.acked_total == 5000
        await seal(client, vchannels)
        problems = []
        for vchannel in vchannels:
            numbers = await consume(client, vchannel)
            problems += delivery_problems(vchannel, traffic.acked[vchannel], numbers)
    assert problems == []
    cli = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "headrace.cli",
        "status",
        "--metastore",
        demo.e2e.etcd_url,
        "--cluster",
        demo.metastore_cluster,
        "--json",
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(cli.communicate(), 60)
    assert cli.returncode == 0
    report = json.loads(out)
    assert sorted(n["node_id"] for n in report["nodes"]) == [f"{NAME}-node-{i}" for i in range(3)]
    assert [p["state"] for p in report["pchannels"]] == ["ASSIGNED"] * PCHANNELS


async def test_deleted_node_pod_fails_over_and_is_recreated_without_losing_messages(
    demo: Demo,
) -> None:
    await until(lambda: demo.settled(3), "the cluster settled", limit=60)
    victim = f"{NAME}-node-1"
    before = await demo.history.current()
    held = {p: r.term for p, r in before.items() if r.node == victim}
    assert held, f"{victim} holds no pchannel: {before}"
    old_uid = (await demo.pods())[victim]["metadata"]["uid"]
    vchannels = [f"failover-{i}" for i in range(8)]
    traffic, stop = Traffic(), asyncio.Event()
    async with demo.client() as client:
        producing = asyncio.create_task(produce(client, vchannels, traffic, stop=stop, batch=16))
        await until(lambda: _true(traffic.acked_total >= 400), "400 messages acknowledged")
        await demo.kube.delete("v1", "Pod", demo.ns, victim)

        async def failed_over() -> bool:
            where = await demo.placement()
            return all(
                where[p]["state"] == "ASSIGNED" and where[p]["term"] > term
                for p, term in held.items()
            )

        await until(failed_over, f"the pchannels of {victim} ASSIGNED again", limit=60)

        async def recreated() -> bool:
            pod = (await demo.pods()).get(victim)
            return pod is not None and pod["metadata"]["uid"] != old_uid and pod_ready(pod)

        await until(recreated, f"{victim} recreated and ready", limit=90)
        acked_then = traffic.acked_total
        await until(lambda: _true(traffic.acked_total >= acked_then + 400), "traffic after restart")
        stop.set()
        await asyncio.wait_for(producing, 90)
        assert traffic.failed == []
        await seal(client, vchannels)
        problems = []
        for vchannel in vchannels:
            numbers = await consume(client, vchannel)
            problems += delivery_problems(vchannel, traffic.acked[vchannel], numbers)
    history = demo.history.by_pchannel()
    for pchannel, term in held.items():
        later = [r for r in history[pchannel] if r.term > term]
        assert later and later[0].node != victim, f"{pchannel} was not failed over: {later}"
        assert any(r.state is AssignmentState.ASSIGNED for r in later if r.node == later[0].node)
    assert demo.history.taken_away(victim), "a failover shows as records taken away"
    assert problems == [], "every acknowledged message is delivered after the failover"


async def test_scale_up_rebalances_and_scale_down_drains_before_deleting(demo: Demo) -> None:
    await until(lambda: demo.settled(3), "the cluster settled", limit=60)
    await demo.scale(5)

    async def spread() -> bool:
        if not await demo.settled(5):
            return False
        counts = load(await demo.placement())
        return len(counts) == 5 and max(counts.values()) - min(counts.values()) <= 1

    await until(spread, "5 nodes ready, pchannels spread 3-4 each", limit=150)
    removed = [f"{NAME}-node-3", f"{NAME}-node-4"]
    at_deletion: dict[str, list[str]] = {}
    watching = asyncio.create_task(_holdings_at_deletion(demo, removed, at_deletion))
    try:
        await demo.scale(3)
        await until(lambda: demo.settled(3), "scaled back to 3 nodes", limit=150)
        await until(lambda: _true(len(at_deletion) == 2), "both deletions observed", limit=10)
    finally:
        watching.cancel()
        await asyncio.gather(watching, return_exceptions=True)
    for node in removed:
        assert at_deletion[node] == [], f"{node} held {at_deletion[node]} when its pod went"
        assert demo.history.taken_away(node) == [], f"{node} was failed over, not drained"
    started = [e["message"] for e in await demo.events("NodeDrainStarted")]
    drained = [e["message"] for e in await demo.events("NodeDrained")]
    for node in removed:
        assert any(node in m and "scale-down" in m for m in started), started
        assert any(node in m for m in drained), drained


async def test_pinned_pchannel_moves_to_its_node_and_stays(demo: Demo) -> None:
    await until(lambda: demo.settled(3), "the cluster settled", limit=60)
    where = await demo.placement()
    counts = load(where)
    target = min(counts, key=lambda n: (counts[n], n))
    source = max(counts, key=lambda n: (counts[n], n))
    pchannel = next(p for p in sorted(where) if where[p]["node"] == source)
    term = where[pchannel]["term"]
    await demo.kube.patch(
        API_VERSION,
        "PChannelAssignment",
        demo.ns,
        f"{NAME}-{pchannel}",
        {"spec": {"pinnedNode": target}},
    )

    async def pinned() -> bool:
        status = (await demo.placement())[pchannel]
        return status["node"] == target and status["state"] == "ASSIGNED" and bool(status["pinned"])

    await until(pinned, f"{pchannel} on its pinned node {target}", limit=60)
    moved = (await demo.placement())[pchannel]
    assert moved["term"] > term
    held_until = time.monotonic() + 12.0
    while time.monotonic() < held_until:
        record = (await demo.history.current())[pchannel]
        assert (record.node, record.term) == (target, moved["term"]), record
        await asyncio.sleep(0.5)
    requested = await demo.events("PChannelMoveRequested")
    assert any(pchannel in e["message"] for e in requested)


async def _true(value: bool) -> bool:
    return value


async def _holdings_at_deletion(demo: Demo, nodes: list[str], out: dict[str, list[str]]) -> None:
    """For each of ``nodes``, the pchannels the metastore shows on it right
    after its pod is first seen terminating or gone."""
    while len(out) < len(nodes):
        pods = await demo.kube.list("v1", "Pod", demo.ns, {CLUSTER_LABEL: NAME})
        alive = live_pods(pods)
        going = [n for n in nodes if n not in out and n not in alive]
        if going:
            records = await demo.history.current()
            for node in going:
                out[node] = sorted(
                    p
                    for p, r in records.items()
                    if (r.state in HOLDING and r.node == node)
                    or (r.state is AssignmentState.UNASSIGNING and r.target == node)
                )
        await asyncio.sleep(0.1)

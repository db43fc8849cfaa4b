"""Scenario 10: an Offline UpgradePlan (the upgrade with downtime) under a producer's load.

Its own StreamingCluster ``offl`` (3 nodes, 4 pchannels). A producer writes
without pause (each message retried for up to 10 minutes, so it waits out the
downtime instead of failing). The plan stops writes cluster-wide (producers
get the retryable WRITES_STOPPED), waits until every node reports no append in
flight, freezes the nodes, stops every node pod at once and starts them on the
target image, then resumes writes. The operator process is restarted while
the nodes start (it resumes from the cluster and the metastore).

It must end Succeeded with: no write failing; no message acknowledged while
the nodes were stopped and starting; every acknowledged message delivered once
and in order; every node pod replaced exactly once and on the target image;
writes flowing again (more messages acknowledged after); the write stop gone
and ``WritesStopped`` False.

The process-runner kubelet runs the working tree's ``headrace node`` whatever
the image, so the target differs only by its tag (see scenario 9).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import headrace
from e2e.conftest import E2E
from e2e.harness import (
    API_VERSION,
    condition,
    until,
)
from e2e.streams import Traffic, consume, delivery_problems, produce, seal
from e2e.upgrades import Shape, UpgradeBed, cluster_for
from e2e.upgrades import plan_manifest as upgrade_plan
from headrace.client import HeadraceClient

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]

NAME = "offl"
NODES = 3
PCHANNELS = 4
TARGET = "headrace-node:e2e-offline"
PLAN = "offl-next"
DOWN_STEPS = ("stop-nodes", "start-nodes")
"""Steps during which every node is stopped or starting: nothing may be acknowledged."""


async def _true(value: bool) -> bool:
    return value


@dataclasses.dataclass
class Offline(UpgradeBed):
    async def running_step(self) -> str:
        """The plan's step under way ("" before the plan exists or runs)."""
        body = await self.kube.get(API_VERSION, "UpgradePlan", self.ns, PLAN)
        steps = ((body or {}).get("status") or {}).get("plan") or []
        return next((s["action"] for s in steps if s.get("state") == "Running"), "")


SHAPE = Shape(NAME, PLAN, NODES, PCHANNELS)


def plan_manifest(bed: UpgradeBed) -> dict[str, Any]:
    return upgrade_plan(bed, TARGET, mode="Offline", drainTimeoutSeconds=240)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def offline(e2e: E2E) -> AsyncIterator[Offline]:
    async with cluster_for(e2e, SHAPE) as kube:
        yield Offline(e2e, kube, SHAPE)


@dataclasses.dataclass
class Watched:
    uids: dict[str, set[str]] = dataclasses.field(default_factory=dict)
    acked_while_down: dict[str, set[int]] = dataclasses.field(default_factory=dict)
    """Running step (of DOWN_STEPS) -> the producer's acknowledged totals seen then."""
    max_stall_s: float = 0.0
    """Longest time (as polled) in which no message was acknowledged: the downtime."""


async def watch(offline: Offline, traffic: Traffic, seen: Watched, stop: asyncio.Event) -> None:
    """Record every pod uid of each node, and the acknowledged total while
    the nodes are down, until ``stop``."""
    last_total, since = traffic.acked_total, time.monotonic()
    while not stop.is_set():
        if traffic.acked_total != last_total:
            last_total, since = traffic.acked_total, time.monotonic()
        seen.max_stall_s = max(seen.max_stall_s, time.monotonic() - since)
        for name, pod in (await offline.pods()).items():
            seen.uids.setdefault(name, set()).add(pod["metadata"]["uid"])
        step = await offline.running_step()
        if step in DOWN_STEPS:
            seen.acked_while_down.setdefault(step, set()).add(traffic.acked_total)
        await asyncio.sleep(0.3)


async def upgrade_under_load(
    offline: Offline, vchannels: list[str], seen: Watched
) -> tuple[Traffic, list[str], int]:
    """Apply the plan while a producer writes, restart the operator once the
    nodes start; after Succeeded and more traffic, read every vchannel back.
    Returns the traffic, the delivery problems and the total acknowledged
    when the plan succeeded."""
    traffic, stop = Traffic(), asyncio.Event()
    async with HeadraceClient(offline.e2e.etcd_url, f"{offline.ns}.{NAME}") as client:
        producing = asyncio.create_task(
            produce(client, vchannels, traffic, stop=stop, batch=16, deadline=600.0)
        )
        watching = asyncio.create_task(watch(offline, traffic, seen, stop))
        await until(lambda: _true(traffic.acked_total >= 300), "300 messages acknowledged")
        await offline.kube.apply(plan_manifest(offline))

        async def starting() -> bool:
            return await offline.running_step() in ("stop-nodes", "start-nodes")

        await until(starting, "the plan stopping or starting the nodes", limit=240)
        code = await asyncio.to_thread(offline.e2e.restart_operator)
        assert code == 0, "the operator stopped cleanly mid-plan"
        await until(lambda: offline.phase("Succeeded"), "the UpgradePlan Succeeded", limit=420)
        acked_then = traffic.acked_total
        await until(lambda: _true(traffic.acked_total >= acked_then + 300), "traffic after it")
        stop.set()
        await asyncio.wait_for(producing, 120)
        await asyncio.wait_for(watching, 30)
        await seal(client, vchannels)
        problems = []
        for vchannel in vchannels:
            numbers = await consume(client, vchannel)
            problems += delivery_problems(vchannel, traffic.acked.get(vchannel, []), numbers)
    return traffic, problems, acked_then


async def test_offline_upgrade_under_load_loses_nothing(offline: Offline) -> None:
    await until(offline.settled, f"{NAME} Ready", limit=120)
    uids = {name: pod["metadata"]["uid"] for name, pod in (await offline.pods()).items()}
    seen = Watched()
    vchannels = [f"offline-{i}" for i in range(4)]
    traffic, problems, acked_then = await upgrade_under_load(offline, vchannels, seen)
    print(  # the downtime measured, for docs/upgrade.md
        f"offline upgrade: {traffic.acked_total} acknowledged, longest stall "
        f"{seen.max_stall_s:.1f}s"
    )
    assert traffic.failed == [], traffic.failed[:5]
    assert problems == [], "every acknowledged message is delivered once, in order"
    assert traffic.acked_total >= acked_then + 300, "writes flow again"
    assert seen.max_stall_s > 0, "the producer was held while writes were stopped"
    assert seen.acked_while_down, "the watch saw the nodes down"
    totals = set().union(*seen.acked_while_down.values())
    assert len(totals) == 1, f"acknowledged while every node was stopped or starting: {totals}"

    done = await offline.plan()
    status = done["status"]
    assert status["progress"] == f"{NODES}/{NODES}"
    assert {n["step"] for n in status["nodes"]} == {"Done"}
    assert [(s["action"], s["state"]) for s in status["plan"]] == [
        ("stop-writes", "Done"),
        ("drain-and-fence", "Done"),
        ("flush", "Skipped"),
        ("stop-nodes", "Done"),
        ("start-nodes", "Done"),
        ("resume-writes", "Done"),
    ]
    assert condition(done, "WritesStopped")["status"] == "False"
    running = await offline.pods()
    assert {p["spec"]["containers"][0]["image"] for p in running.values()} == {TARGET}
    assert {name: len(seen.uids[name]) for name in uids} == dict.fromkeys(uids, 2), (
        "each node pod replaced exactly once, across the operator's restart"
    )
    after = await offline.cluster()
    assert (after["spec"]["image"], after["spec"]["version"]) == (TARGET, headrace.__version__)
    reasons = await offline.plan_events()
    assert reasons.count("UpgradeWritesStopped") == 1
    assert reasons.count("UpgradeWritesResumed") == 1
    assert reasons.count("UpgradeNodeStarted") == NODES
    assert reasons.count("UpgradeSucceeded") == 1
    assert "UpgradeBlocked" not in reasons

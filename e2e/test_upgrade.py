"""Scenario 9: a Rolling UpgradePlan under a producer's load, with an operator restart.

Its own StreamingCluster ``roll`` (3 nodes, 6 pchannels). The plan is applied
as a dry run first (status.plan filled, nothing restarted), then started by
patching ``dryRun: false``, while a producer writes without pause; once the
first node is done the operator process is stopped and a new one started (it
resumes from the annotations, pods and status, and restarts no node twice).
It must end Succeeded with every node pod on the target image and registered
with the target version (the cluster's status shows both), no write failing,
every acknowledged message delivered once and in order, and every pchannel
leaving a node by graceful handoff (no record taken from a node that still
held it).

The process-runner kubelet runs the working tree's ``headrace node`` whatever
the image, so the target image differs only by its tag and the target
version is this tree's ``headrace.__version__``: what the nodes register.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

import headrace
from e2e.conftest import E2E
from e2e.harness import (
    API_VERSION,
    until,
)
from e2e.streams import AssignmentHistory, Traffic, consume, delivery_problems, produce, seal
from e2e.upgrades import Shape, UpgradeBed, cluster_for
from e2e.upgrades import plan_manifest as upgrade_plan
from headrace.client import HeadraceClient

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]

NAME = "roll"
NODES = 3
PCHANNELS = 6
TARGET = "headrace-node:e2e-next"
PLAN = "roll-next"


async def _true(value: bool) -> bool:
    return value


@dataclasses.dataclass
class Roll(UpgradeBed):
    history: AssignmentHistory


SHAPE = Shape(NAME, PLAN, NODES, PCHANNELS)


def plan_manifest(bed: UpgradeBed) -> dict[str, Any]:
    return upgrade_plan(
        bed,
        TARGET,
        mode="Rolling",
        maxUnavailable=1,
        soakSeconds=2,
        drainTimeoutSeconds=120,
        dryRun=True,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def roll(e2e: E2E) -> AsyncIterator[Roll]:
    history = await AssignmentHistory(e2e.etcd_url, f"{e2e.namespace}.{NAME}").start()
    try:
        async with cluster_for(e2e, SHAPE) as kube:
            yield Roll(e2e, kube, SHAPE, history)
    finally:
        await history.stop()


async def watch_uids(roll: Roll, seen: dict[str, set[str]], stop: asyncio.Event) -> None:
    """Record every pod uid each node has had, until ``stop``."""
    while not stop.is_set():
        for name, uid in (await roll.uids()).items():
            seen.setdefault(name, set()).add(uid)
        await asyncio.sleep(0.5)


async def node_done(roll: Roll, node: str) -> bool:
    nodes = ((await roll.plan()).get("status") or {}).get("nodes") or []
    return any(n["node"] == node and n["step"] == "Done" for n in nodes)


async def upgrade_under_load(
    roll: Roll, vchannels: list[str], seen: dict[str, set[str]]
) -> tuple[Traffic, list[str]]:
    """Start the plan (``dryRun: false``) while a producer writes, restart
    the operator once the first node is done; after the plan Succeeded and
    more traffic went through, read every vchannel back. Returns the traffic
    and the delivery problems; ``seen`` gets every pod uid of each node."""
    traffic, stop = Traffic(), asyncio.Event()
    async with HeadraceClient(roll.e2e.etcd_url, f"{roll.ns}.{NAME}") as client:
        producing = asyncio.create_task(produce(client, vchannels, traffic, stop=stop, batch=16))
        watching = asyncio.create_task(watch_uids(roll, seen, stop))
        await until(lambda: _true(traffic.acked_total >= 300), "300 messages acknowledged")
        await roll.kube.patch(
            API_VERSION, "UpgradePlan", roll.ns, PLAN, {"spec": {"dryRun": False}}
        )
        first = f"{NAME}-node-2"
        await until(lambda: node_done(roll, first), f"{first} Done", limit=240)
        code = await asyncio.to_thread(roll.e2e.restart_operator)
        assert code == 0, "the operator stopped cleanly mid-plan"
        await until(lambda: roll.phase("Succeeded"), "the UpgradePlan Succeeded", limit=420)
        acked_then = traffic.acked_total
        await until(lambda: _true(traffic.acked_total >= acked_then + 300), "traffic after it")
        stop.set()
        await asyncio.wait_for(producing, 90)
        await asyncio.wait_for(watching, 30)
        await seal(client, vchannels)
        problems = []
        for vchannel in vchannels:
            numbers = await consume(client, vchannel)
            problems += delivery_problems(vchannel, traffic.acked.get(vchannel, []), numbers)
    return traffic, problems


async def test_rolling_upgrade_under_load_loses_nothing(roll: Roll) -> None:
    await until(roll.settled, f"{NAME} Ready", limit=120)
    before = await roll.cluster()
    assert before["status"]["runningVersion"] == headrace.__version__
    assert before["status"]["runningImage"] == "headrace-node:e2e"
    uids = await roll.uids()
    await roll.kube.apply(plan_manifest(roll))
    await until(lambda: roll.phase("Planned"), "the dry run Planned", limit=60)
    steps = (await roll.plan())["status"]["plan"]
    assert [s["nodes"] for s in steps] == [[f"{NAME}-node-{i}"] for i in (2, 1, 0)]
    assert await roll.uids() == uids, "a dry run restarts nothing"

    seen: dict[str, set[str]] = {}
    vchannels = [f"upgrade-{i}" for i in range(6)]
    traffic, problems = await upgrade_under_load(roll, vchannels, seen)
    assert traffic.failed == [], traffic.failed[:5]
    assert problems == [], "every acknowledged message is delivered once, in order"

    done = await roll.plan()
    assert done["status"]["progress"] == f"{NODES}/{NODES}"
    assert {n["step"] for n in done["status"]["nodes"]} == {"Done"}
    running = await roll.pods()
    assert {p["spec"]["containers"][0]["image"] for p in running.values()} == {TARGET}
    now = await roll.uids()
    assert all(now[name] != uid for name, uid in uids.items()), "every node pod was replaced"
    assert {name: len(seen[name]) for name in uids} == dict.fromkeys(uids, 2), (
        "each node pod replaced exactly once, across the operator's restart"
    )
    after = await roll.cluster()
    assert (after["spec"]["image"], after["spec"]["version"]) == (TARGET, headrace.__version__)
    assert after["status"]["runningImage"] == TARGET
    assert after["status"]["runningVersion"] == headrace.__version__
    assert {(n["image"], n["version"]) for n in after["status"]["nodeStatuses"]} == {
        (TARGET, headrace.__version__)
    }
    for node in uids:
        assert roll.history.taken_away(node) == [], f"{node} lost a pchannel to failover"
    reasons = await roll.plan_events()
    assert reasons.count("UpgradeNodeStarted") == NODES
    assert reasons.count("UpgradeSucceeded") == 1
    assert "UpgradeBlocked" not in reasons

"""Scenario 10: a Rolling UpgradePlan to an image that never becomes Ready, rolled back.

Its own StreamingCluster ``back`` (3 nodes, 4 pchannels) under a producer's
load. The plan targets ``unpullable.invalid/headrace-node:9``: the registry
host is in ``.invalid``, so the test bed's kubelet stand-in reports the
container as a kubelet reports an unresolvable registry (``ErrImagePull``,
then ``ImagePullBackOff``) and never starts it (e2e/README.md). The plan must
stop at its first node, ``back-node-2``, drained by graceful handoff: Blocked
after ``drainTimeoutSeconds`` with the pod's reason, every pchannel ASSIGNED
on the two other nodes, the other pods untouched, the producer's writes still
acknowledged. ``rollback: true`` then brings ``back-node-2`` back on the
cluster's image and the plan ends RolledBack; the cluster's spec never named
the broken image; no write failed and every acknowledged message is
delivered once and in order; no pchannel left a node by failover.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from e2e.conftest import E2E
from e2e.harness import (
    API_VERSION,
    condition,
    pod_ready,
    until,
)
from e2e.streams import AssignmentHistory, Traffic, consume, delivery_problems, produce, seal
from e2e.upgrades import Shape, UpgradeBed, cluster_for
from e2e.upgrades import plan_manifest as upgrade_plan
from headrace.client import HeadraceClient
from headrace.cluster import AssignmentState

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),
]

NAME = "back"
NODES = 3
PCHANNELS = 4
IMAGE = "headrace-node:e2e"
BROKEN = "unpullable.invalid/headrace-node:9"
PLAN = "back-broken"
DRAIN_TIMEOUT_S = 15
FIRST = f"{NAME}-node-2"


@dataclasses.dataclass
class Back(UpgradeBed):
    history: AssignmentHistory


SHAPE = Shape(NAME, PLAN, NODES, PCHANNELS)


def plan_manifest(bed: UpgradeBed) -> dict[str, Any]:
    return upgrade_plan(
        bed,
        BROKEN,
        mode="Rolling",
        maxUnavailable=1,
        soakSeconds=2,
        drainTimeoutSeconds=DRAIN_TIMEOUT_S,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def back(e2e: E2E) -> AsyncIterator[Back]:
    history = await AssignmentHistory(e2e.etcd_url, f"{e2e.namespace}.{NAME}").start()
    try:
        async with cluster_for(e2e, SHAPE) as kube:
            yield Back(e2e, kube, SHAPE, history)
    finally:
        await history.stop()


async def _more(traffic: Traffic, count: int, what: str) -> None:
    target = traffic.acked_total + count

    async def reached() -> bool:
        return traffic.acked_total >= target

    await until(reached, what, limit=120)


async def check_blocked(back: Back, traffic: Traffic) -> None:
    """The plan stopped at its first node with the pod's reason; nothing lost, writes go on."""
    body = await back.plan()
    message = condition(body, "Blocked")["message"]
    prefix = f"node {FIRST} has not come back on the target image within {DRAIN_TIMEOUT_S}s: "
    assert message.startswith(prefix), message
    reason = message.removeprefix(prefix)
    assert reason.split(":")[0] in ("ErrImagePull", "ImagePullBackOff"), reason
    assert BROKEN in reason
    stuck = next(n for n in body["status"]["nodes"] if n["node"] == FIRST)
    assert stuck["error"] == reason
    images = await back.images()
    assert images == {f"{NAME}-node-0": IMAGE, f"{NAME}-node-1": IMAGE, FIRST: BROKEN}
    broken_pod = (await back.pods())[FIRST]
    assert not pod_ready(broken_pod)
    (status,) = broken_pod["status"]["containerStatuses"]
    assert set(status["state"]) == {"waiting"} and status["restartCount"] == 0
    records = await back.history.current()
    assert len(records) == PCHANNELS
    assert {r.state for r in records.values()} == {AssignmentState.ASSIGNED}, records
    assert FIRST not in {r.node for r in records.values()}, "the stuck node holds nothing"
    await _more(traffic, 200, "200 more messages acknowledged while the plan is Blocked")
    assert traffic.failed == [], traffic.failed[:5]
    cluster = await back.cluster()
    assert (cluster["spec"]["image"], cluster["spec"]["version"]) == (IMAGE, "0.1.0")


async def test_an_image_that_never_becomes_ready_blocks_and_rolls_back(back: Back) -> None:
    await until(back.settled, f"{NAME} Ready", limit=120)
    uids = {name: pod["metadata"]["uid"] for name, pod in (await back.pods()).items()}
    vchannels = [f"rollback-{i}" for i in range(PCHANNELS)]
    traffic, stop = Traffic(), asyncio.Event()
    async with HeadraceClient(back.e2e.etcd_url, f"{back.ns}.{NAME}") as client:
        producing = asyncio.create_task(produce(client, vchannels, traffic, stop=stop, batch=16))
        await _more(traffic, 300, "300 messages acknowledged")
        await back.kube.apply(plan_manifest(back))
        await until(lambda: back.phase("Blocked"), "the UpgradePlan Blocked", limit=240)
        await check_blocked(back, traffic)
        now = {name: pod["metadata"]["uid"] for name, pod in (await back.pods()).items()}
        assert {n: now[n] == uids[n] for n in uids} == {
            f"{NAME}-node-0": True,
            f"{NAME}-node-1": True,
            FIRST: False,
        }, "only the first node's pod was replaced"

        await back.kube.patch(
            API_VERSION, "UpgradePlan", back.ns, PLAN, {"spec": {"rollback": True}}
        )
        await until(lambda: back.phase("RolledBack"), "the UpgradePlan RolledBack", limit=300)
        await until(back.settled, f"{NAME} Ready again", limit=120)
        await _more(traffic, 300, "300 more messages acknowledged after the rollback")
        stop.set()
        await asyncio.wait_for(producing, 90)
        await seal(client, vchannels)
        problems = []
        for vchannel in vchannels:
            numbers = await consume(client, vchannel)
            problems += delivery_problems(vchannel, traffic.acked.get(vchannel, []), numbers)
    assert traffic.failed == [], traffic.failed[:5]
    assert problems == [], "every acknowledged message is delivered once, in order"

    assert set((await back.images()).values()) == {IMAGE}
    body = await back.plan()
    assert condition(body, "RolledBack")["status"] == "True"
    assert condition(body, "Succeeded")["status"] == "False"
    cluster = await back.cluster()
    assert (cluster["spec"]["image"], cluster["spec"]["version"]) == (IMAGE, "0.1.0")
    assert cluster["status"]["runningImage"] == IMAGE
    for node in uids:
        assert back.history.taken_away(node) == [], f"{node} lost a pchannel to failover"
    reasons = await back.plan_events()
    assert "UpgradeBlocked" in reasons and "UpgradeRolledBack" in reasons
    assert "UpgradeSucceeded" not in reasons

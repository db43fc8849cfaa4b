"""The Offline UpgradePlan, on the fake and on the real API server (``bed``).

The StreamingCluster's own pass runs between the plan's passes, as the
operator's handlers run both. On the fake bed the simulated nodes acknowledge
the write stop as nodes do; on the real bed real ``headrace node`` processes
do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from headrace.coordinator import writestop
from headrace_operator import builders
from headrace_operator.offline_flush import FLUSH_SKIPPED
from tests.headrace_operator.op_harness import BROKEN_SUFFIX, Bed, condition, is_ready
from tests.headrace_operator.test_upgrade_steps import (
    TARGET,
    UP,
    create_plan,
    images,
    plan_body,
    upgrade_pass,
)

pytestmark = pytest.mark.timeout(400)

OFFLINE_ACTIONS = [
    "stop-writes",
    "drain-and-fence",
    "flush",
    "stop-nodes",
    "start-nodes",
    "resume-writes",
]


def pod_ready(pod: dict[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def write_stop(bed: Bed, cluster: str) -> writestop.StopState:
    control = await bed.control(cluster)
    return await control.write_stop()


async def drive(
    bed: Bed,
    cluster: str,
    plan: str,
    until: tuple[str, ...],
    *,
    seen: dict[str, set[str]],
    timeout: float = 120,
    each: Callable[[dict[str, Any]], Awaitable[None]] | None = None,
) -> dict[str, Any]:
    """Cluster pass, plan pass, until the plan's phase is one of ``until``;
    the uid of every node pod seen goes into ``seen``."""
    deadline = time.monotonic() + (timeout * 5 if bed.real else timeout)
    while True:
        await bed.reconcile(cluster)
        await upgrade_pass(bed, plan)
        for name, pod in (await bed.pods(cluster)).items():
            seen.setdefault(name, set()).add(pod["metadata"]["uid"])
        body = await plan_body(bed, plan)
        if each is not None:
            await each(body)
        if body["status"]["phase"] in until:
            return body
        assert time.monotonic() < deadline, body["status"]
        await asyncio.sleep(0.3 if bed.real else 0.05)


async def test_offline_plan_dry_run_lists_the_steps(bed: Bed) -> None:
    await bed.create_cluster("still", nodes=2, pchannels=2)
    await bed.converge("still", is_ready, what="Ready")
    await create_plan(bed, "still-up", "still", mode="Offline", dryRun=True)
    await upgrade_pass(bed, "still-up")
    status = (await plan_body(bed, "still-up"))["status"]
    assert status["phase"] == "Planned"
    assert [s["action"] for s in status["plan"]] == OFFLINE_ACTIONS
    assert status["plan"][1]["nodes"] == ["still-node-0", "still-node-1"]
    assert (await write_stop(bed, "still")).stop is None, "a dry run stops nothing"


async def check_finished(bed: Bed, body: dict[str, Any]) -> None:
    """What a Succeeded Offline plan of cluster ``off`` leaves behind."""
    status = body["status"]
    cluster = await bed.cluster("off")
    assert cluster["spec"]["image"] == TARGET
    assert cluster["spec"]["version"] == bed.version_of(TARGET)
    annotations = cluster["metadata"].get("annotations") or {}
    for key in (builders.NODE_IMAGES, builders.OFFLINE_UPGRADE, builders.MAX_UNAVAILABLE):
        assert key not in annotations, key
    state = await write_stop(bed, "off")
    assert state.stop is None, "writes flow again"
    snapshot = await (await bed.control("off")).snapshot()
    assert not any(n.frozen for n in snapshot.live_nodes().values()), "every node unfrozen"
    assert [(s["action"], s["state"]) for s in status["plan"]] == [
        (a, "Skipped" if a == "flush" else "Done") for a in OFFLINE_ACTIONS
    ]
    assert status["plan"][2]["message"] == FLUSH_SKIPPED
    assert {n["step"] for n in status["nodes"]} == {"Done"}
    assert status["progress"] == "3/3"
    assert condition(body, "WritesStopped")["status"] == "False"
    assert condition(body, "Succeeded")["status"] == "True"
    reasons = await bed.event_reasons()
    assert reasons.count("UpgradeWritesStopped") == 1
    assert reasons.count("UpgradeWritesResumed") == 1
    assert reasons.count("UpgradeNodeStarted") == 3
    assert reasons.count("UpgradeNodeDone") == 3
    assert reasons.count("UpgradeSucceeded") == 1
    assert "UpgradeBlocked" not in reasons


async def test_offline_upgrade_stops_writes_restarts_every_node_once_and_resumes(
    bed: Bed,
) -> None:
    await bed.create_cluster("off", nodes=3, pchannels=4)
    await bed.converge("off", is_ready, what="Ready")
    before = {n: p["metadata"]["uid"] for n, p in (await bed.pods("off")).items()}
    await create_plan(bed, "off-up", "off", mode="Offline")
    seen: dict[str, set[str]] = {}
    flowing_while_down: list[dict[str, str]] = []
    restarting_seen = 0
    running_steps: list[str] = []

    async def check(body: dict[str, Any]) -> None:
        nonlocal restarting_seen
        pods = await bed.pods("off")
        uids = {n: p["metadata"]["uid"] for n, p in pods.items()}
        changed = len(uids) < 3 or any(before.get(n) != uid for n, uid in uids.items())
        back = len(uids) == 3 and all(
            before[n] != uid and pod_ready(pods[n]) for n, uid in uids.items()
        )
        if changed and not back:
            restarting_seen += 1
            if (await write_stop(bed, "off")).stop is None:
                flowing_while_down.append(uids)
        running = [s["action"] for s in body["status"].get("plan", []) if s["state"] == "Running"]
        if running and (not running_steps or running_steps[-1] != running[0]):
            running_steps.append(running[0])
            if running[0] == "start-nodes":
                # the operator process goes away with its coordinator; the next
                # passes start from what the API server and metastore hold
                await bed.runners.stop_all()

    body = await drive(bed, "off", "off-up", ("Succeeded", "Blocked"), seen=seen, each=check)
    status = body["status"]
    assert status["phase"] == "Succeeded", status
    assert restarting_seen > 0
    assert not flowing_while_down, "writes flowed while a node pod was down or not back"
    assert running_steps == [a for a in OFFLINE_ACTIONS if a != "flush"] or running_steps == [
        a for a in OFFLINE_ACTIONS if a not in ("flush", "stop-writes")
    ], running_steps
    assert {n: len(u) for n, u in seen.items()} == {
        "off-node-0": 2,
        "off-node-1": 2,
        "off-node-2": 2,
    }
    assert set((await images(bed, "off")).values()) == {TARGET}
    await check_finished(bed, body)
    pods_after = {n: p["metadata"]["uid"] for n, p in (await bed.pods("off")).items()}
    await bed.converge("off", is_ready, what="Ready after the upgrade")
    await upgrade_pass(bed, "off-up")
    await bed.reconcile("off")
    assert {n: p["metadata"]["uid"] for n, p in (await bed.pods("off")).items()} == pods_after


async def test_offline_plan_waits_for_in_flight_appends(bed: Bed) -> None:
    if bed.real:
        pytest.skip("only the simulated nodes can hold an append in flight on demand")
    assert bed.kubelet is not None
    await bed.create_cluster("busy", nodes=2, pchannels=2)
    await bed.converge("busy", is_ready, what="Ready")
    node = next(n for (_, name), n in bed.kubelet.nodes.items() if name == "busy-node-1")
    node.in_flight = 2
    await create_plan(bed, "busy-up", "busy", mode="Offline")
    uids = {n: p["metadata"]["uid"] for n, p in (await bed.pods("busy")).items()}

    async def waiting_for_appends() -> bool:
        await upgrade_pass(bed, "busy-up")
        body = await plan_body(bed, "busy-up")
        step = next(s for s in body["status"]["plan"] if s["action"] == "drain-and-fence")
        return bool(
            step["state"] == "Running"
            and "busy-node-1 has 2 append(s) in flight" in step["message"]
        )

    await bed.until("busy", waiting_for_appends, what="waiting for the appends", timeout=30)
    for _ in range(10):
        await bed.reconcile("busy")
        await upgrade_pass(bed, "busy-up")
    assert {n: p["metadata"]["uid"] for n, p in (await bed.pods("busy")).items()} == uids, (
        "no node stops while appends are in flight"
    )
    body = await plan_body(bed, "busy-up")
    assert body["status"]["phase"] == "Running"
    assert condition(body, "WritesStopped")["status"] == "True"
    assert "writes stopped by UpgradePlan ns/busy-up" in condition(body, "WritesStopped")["message"]
    node.in_flight = 0
    body = await drive(bed, "busy", "busy-up", ("Succeeded", "Blocked"), seen={})
    assert body["status"]["phase"] == "Succeeded", body["status"]


async def test_offline_image_that_never_becomes_ready_blocks_with_writes_stopped_then_rolls_back(
    bed: Bed,
) -> None:
    if bed.real:
        pytest.skip("the process-runner kubelet runs every image; only the fake has a broken one")
    await bed.create_cluster("sour", nodes=2, pchannels=2)
    await bed.converge("sour", is_ready, what="Ready")
    await create_plan(
        bed,
        "sour-up",
        "sour",
        mode="Offline",
        image="headrace-node" + BROKEN_SUFFIX,
        drainTimeoutSeconds=10,
    )
    body = await drive(bed, "sour", "sour-up", ("Blocked", "Succeeded"), seen={})
    assert body["status"]["phase"] == "Blocked"
    blocked = condition(body, "Blocked")["message"]
    assert blocked.startswith("start-nodes has not finished within 10s"), blocked
    assert "ImagePullBackOff: no such image" in blocked
    assert "writes stay stopped" in blocked
    writes = condition(body, "WritesStopped")
    assert (
        writes["status"] == "True"
        and "offline upgrade to headrace-node:broken" in writes["message"]
    )
    assert (await write_stop(bed, "sour")).stop is not None

    await bed.kube.patch_merge(*UP, bed.namespace, "sour-up", {"spec": {"rollback": True}})
    seen: dict[str, set[str]] = {}
    body = await drive(bed, "sour", "sour-up", ("RolledBack",), seen=seen)
    assert set((await images(bed, "sour")).values()) == {bed.image}
    assert (await write_stop(bed, "sour")).stop is None, "rolling back resumes writes"
    assert condition(body, "WritesStopped")["status"] == "False"
    cluster = await bed.cluster("sour")
    assert cluster["spec"]["image"] == bed.image
    annotations = cluster["metadata"].get("annotations") or {}
    assert builders.OFFLINE_UPGRADE not in annotations and builders.NODE_IMAGES not in annotations
    assert "UpgradeRolledBack" in await bed.event_reasons()


async def test_a_stop_put_in_place_by_someone_else_is_not_resumed_by_the_plan(bed: Bed) -> None:
    if bed.real:
        pytest.skip("the decision is the same on both beds; the fake is enough")
    await bed.create_cluster("held", nodes=2, pchannels=2)
    await bed.converge("held", is_ready, what="Ready")
    control = await bed.control("held")
    await control.stop_writes("maintenance window", "cli")
    await create_plan(bed, "held-up", "held", mode="Offline")
    body = await drive(bed, "held", "held-up", ("Succeeded", "Blocked"), seen={})
    assert body["status"]["phase"] == "Succeeded", body["status"]
    state = await write_stop(bed, "held")
    assert state.stop is not None and state.stop.by == "cli", "another's stop stays"
    assert "writes stopped by cli" in condition(body, "WritesStopped")["message"]


async def test_a_plan_deleted_while_writes_are_stopped_leaves_no_stop_behind(bed: Bed) -> None:
    await bed.create_cluster("gone", nodes=2, pchannels=2)
    await bed.converge("gone", is_ready, what="Ready")
    await create_plan(bed, "gone-up", "gone", mode="Offline", paused=False)

    async def stopped() -> bool:
        await upgrade_pass(bed, "gone-up")
        annotations = (await bed.cluster("gone"))["metadata"].get("annotations") or {}
        marked = annotations.get(builders.OFFLINE_UPGRADE) == "gone-up"
        return marked and (await write_stop(bed, "gone")).stop is not None

    await bed.until("gone", stopped, what="writes stopped by the plan", timeout=60)
    await bed.kube.patch_merge(*UP, bed.namespace, "gone-up", {"spec": {"paused": True}})
    await upgrade_pass(bed, "gone-up")
    await bed.kube.delete(*UP, bed.namespace, "gone-up")

    async def released() -> bool:
        snapshot = await (await bed.control("gone")).snapshot()
        thawed = not any(n.frozen for n in snapshot.live_nodes().values())
        return (await write_stop(bed, "gone")).stop is None and thawed

    await bed.until("gone", released, what="writes resumed and nodes unfrozen", timeout=60)
    cluster = await bed.cluster("gone")
    assert builders.OFFLINE_UPGRADE not in (cluster["metadata"].get("annotations") or {})

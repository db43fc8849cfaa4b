"""The UpgradePlan pass, on the fake and on the real API server (``bed``).

The StreamingCluster's own pass runs between the plan's passes, as the
operator's handlers run both: the plan names nodes, the cluster pass drains
and restarts them.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from headrace_operator import builders, models
from headrace_operator.events import KubeEventSink
from headrace_operator.nodeplan import holdings
from headrace_operator.results import PassResult
from headrace_operator.upgrade_steps import UpgradePass, run_upgrade_pass
from tests.headrace_operator.op_harness import BROKEN_SUFFIX, Bed, condition, is_ready

pytestmark = pytest.mark.timeout(300)

UP = (models.API_VERSION, "UpgradePlan")
TARGET = "headrace-node:v2"


async def create_plan(bed: Bed, name: str, cluster: str, **overrides: Any) -> None:
    spec: dict[str, Any] = {"clusterRef": {"name": cluster}, "image": TARGET, "soakSeconds": 0}
    spec.update(overrides)
    spec.setdefault("version", bed.version_of(spec["image"]))
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "UpgradePlan",
        "metadata": {"name": name, "namespace": bed.namespace},
        "spec": spec,
    }
    await bed.kube.apply(body)


async def plan_body(bed: Bed, name: str) -> dict[str, Any]:
    body = await bed.kube.get(*UP, bed.namespace, name)
    assert body is not None
    return body


async def upgrade_pass(bed: Bed, name: str) -> PassResult:
    p = UpgradePass(
        body=await plan_body(bed, name),
        kube=bed.kube,
        events=KubeEventSink(bed.kube, "test"),
        connect=bed.connect,
        now=datetime.datetime.now(datetime.UTC),
    )
    return await run_upgrade_pass(p)


async def images(bed: Bed, cluster: str) -> dict[str, str]:
    return {
        name: pod["spec"]["containers"][0]["image"]
        for name, pod in (await bed.pods(cluster)).items()
    }


async def balanced(bed: Bed, cluster: str, per_node: int) -> None:
    async def check() -> bool:
        held = holdings((await (await bed.control(cluster)).snapshot()).assignments.values())
        pods = await bed.pods(cluster)
        return bool(pods) and all(held.get(name, 0) == per_node for name in pods)

    await bed.until(cluster, check, what=f"{per_node} pchannels on every node")


async def test_dry_run_fills_the_plan_and_changes_nothing(bed: Bed) -> None:
    await bed.create_cluster("dry", nodes=3, pchannels=6)
    await bed.converge("dry", is_ready, what="Ready")
    await balanced(bed, "dry", 2)
    await create_plan(bed, "dry-plan", "dry", dryRun=True)
    await upgrade_pass(bed, "dry-plan")
    status = (await plan_body(bed, "dry-plan"))["status"]
    assert status["phase"] == "Planned"
    steps = status["plan"]
    assert [s["nodes"] for s in steps] == [["dry-node-2"], ["dry-node-1"], ["dry-node-0"]]
    moved = sorted(m["pchannel"] for s in steps[:1] for m in s["moves"])
    assert len(moved) == 2, "node 2 holds 2 of the 6 pchannels"
    assert all(m["to"] != "dry-node-2" for m in steps[0]["moves"])
    cluster = await bed.cluster("dry")
    assert builders.NODE_IMAGES not in (cluster["metadata"].get("annotations") or {})
    assert set((await images(bed, "dry")).values()) == {bed.image}


async def test_plan_for_a_missing_cluster_is_blocked(bed: Bed) -> None:
    await create_plan(bed, "lost", "nowhere")
    result = await upgrade_pass(bed, "lost")
    body = await plan_body(bed, "lost")
    assert body["status"]["phase"] == "Blocked"
    blocked = condition(body, "Blocked")
    assert blocked["status"] == "True"
    assert "StreamingCluster nowhere does not exist" in blocked["message"]
    assert blocked["observedGeneration"] == body["metadata"]["generation"]
    assert condition(body, "Succeeded")["status"] == "False"
    assert result.halt_reason == blocked["message"]


async def test_second_active_plan_is_refused(bed: Bed) -> None:
    await bed.create_cluster("twin", nodes=2, pchannels=2)
    await bed.converge("twin", is_ready, what="Ready")
    await create_plan(bed, "first", "twin", paused=True)
    await upgrade_pass(bed, "first")
    await create_plan(bed, "second", "twin")
    await upgrade_pass(bed, "second")
    second = await plan_body(bed, "second")
    assert second["status"]["phase"] == "Blocked"
    assert (
        "UpgradePlan first is already upgrading cluster twin"
        in (condition(second, "Blocked")["message"])
    )
    first = await plan_body(bed, "first")
    assert first["status"]["phase"] == "Paused"
    assert condition(first, "Paused")["status"] == "True"
    assert set((await images(bed, "twin")).values()) == {bed.image}, "nothing restarted"


async def test_rolling_upgrade_one_node_at_a_time(bed: Bed) -> None:
    await bed.create_cluster("roll", nodes=3, pchannels=6)
    await bed.converge("roll", is_ready, what="Ready")
    await create_plan(bed, "roll-up", "roll")
    await upgrade_pass(bed, "roll-up")
    planned = [s["nodes"] for s in (await plan_body(bed, "roll-up"))["status"]["plan"]]
    assert planned == [["roll-node-2"], ["roll-node-1"], ["roll-node-0"]]
    order: list[str] = []
    deadline = time.monotonic() + (600 if bed.real else 120)
    while True:
        await bed.reconcile("roll")
        result = await upgrade_pass(bed, "roll-up")
        now = await images(bed, "roll")
        on_target = [n for n, image in sorted(now.items()) if image == TARGET]
        assert len(now) >= 2, f"at most one node pod down at a time: {sorted(now)}"
        for node in on_target:
            if node not in order:
                order.append(node)
        body = await plan_body(bed, "roll-up")
        status = body["status"]
        assert status["phase"] in ("Pending", "Running", "Succeeded"), status
        upgrading = [n["node"] for n in status["nodes"] if n["step"] in ("Draining", "Restarting")]
        assert len(upgrading) <= 1, f"one node at a time: {upgrading}"
        if status["phase"] == "Succeeded":
            break
        assert not result.failures, result.failures
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.3 if bed.real else 0.05)
    assert order == ["roll-node-2", "roll-node-1", "roll-node-0"]
    assert set((await images(bed, "roll")).values()) == {TARGET}
    cluster = await bed.cluster("roll")
    assert cluster["spec"]["image"] == TARGET
    assert cluster["spec"]["version"] == bed.version_of(TARGET)
    assert builders.NODE_IMAGES not in (cluster["metadata"].get("annotations") or {})
    assert status["progress"] == "3/3"
    assert {n["step"] for n in status["nodes"]} == {"Done"}
    assert all(n["from"] == bed.image and n["to"] == TARGET for n in status["nodes"])
    assert condition(body, "Succeeded")["status"] == "True"
    reasons = await bed.event_reasons()
    assert "UpgradeBlocked" not in reasons, "settling between nodes is not Blocked"
    assert reasons.count("UpgradeNodeStarted") == 3
    assert reasons.count("UpgradeSucceeded") == 1
    pods_before = await bed.pods("roll")
    await bed.converge("roll", is_ready, what="Ready after the upgrade")
    await upgrade_pass(bed, "roll-up")
    await bed.reconcile("roll")
    pods_after = await bed.pods("roll")
    assert {n: p["metadata"]["uid"] for n, p in pods_before.items()} == {
        n: p["metadata"]["uid"] for n, p in pods_after.items()
    }, "writing the target into the cluster's spec restarts nothing"


async def test_max_unavailable_restarts_nodes_in_pairs(bed: Bed) -> None:
    """``maxUnavailable: 2``: the cluster pass drains both nodes of a step at
    once (never more), and the next pair waits until they are back."""
    await bed.create_cluster("pair", nodes=4, pchannels=8)
    await bed.converge("pair", is_ready, what="Ready")
    await create_plan(bed, "pair-up", "pair", maxUnavailable=2)
    await upgrade_pass(bed, "pair-up")
    planned = [s["nodes"] for s in (await plan_body(bed, "pair-up"))["status"]["plan"]]
    assert planned == [["pair-node-3", "pair-node-2"], ["pair-node-1", "pair-node-0"]]
    most_draining = 0
    deadline = time.monotonic() + (600 if bed.real else 120)
    while True:
        await bed.reconcile("pair")
        pods = await bed.pods("pair")
        draining = sorted(
            name
            for name, pod in pods.items()
            if (pod["metadata"].get("annotations") or {}).get(builders.DRAINING)
        )
        assert len(draining) <= 2, f"at most maxUnavailable drains: {draining}"
        assert len(pods) >= 2, f"at most two node pods down at a time: {sorted(pods)}"
        most_draining = max(most_draining, len(draining))
        await upgrade_pass(bed, "pair-up")
        status = (await plan_body(bed, "pair-up"))["status"]
        if status["phase"] == "Succeeded":
            break
        assert status["phase"] in ("Pending", "Running"), status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.3 if bed.real else 0.05)
    assert most_draining == 2, "the pair drained together"
    assert set((await images(bed, "pair")).values()) == {TARGET}
    annotations = (await bed.cluster("pair"))["metadata"].get("annotations") or {}
    assert builders.MAX_UNAVAILABLE not in annotations
    assert builders.NODE_IMAGES not in annotations


async def test_resumes_after_an_operator_restart_without_restarting_a_node_twice(
    bed: Bed,
) -> None:
    await bed.create_cluster("again", nodes=3, pchannels=3)
    await bed.converge("again", is_ready, what="Ready")
    await create_plan(bed, "again-up", "again")
    uids: dict[str, set[str]] = {}
    restarted_operator = False
    deadline = time.monotonic() + (600 if bed.real else 120)
    while True:
        await bed.reconcile("again")
        await upgrade_pass(bed, "again-up")
        for name, pod in (await bed.pods("again")).items():
            uids.setdefault(name, set()).add(pod["metadata"]["uid"])
        status = (await plan_body(bed, "again-up"))["status"]
        steps = {n["node"]: n["step"] for n in status.get("nodes", [])}
        if not restarted_operator and steps.get("again-node-2") == "Done":
            # the operator process goes away: its coordinator with it; the
            # next passes start from what the API server and metastore hold
            await bed.runners.stop_all()
            restarted_operator = True
        if status["phase"] == "Succeeded":
            break
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.3 if bed.real else 0.05)
    assert restarted_operator
    assert {name: len(seen) for name, seen in uids.items()} == {
        "again-node-0": 2,
        "again-node-1": 2,
        "again-node-2": 2,
    }, "each node pod replaced exactly once"


async def test_an_image_that_never_becomes_ready_blocks_and_rollback_brings_it_back(
    bed: Bed,
) -> None:
    if bed.real:
        pytest.skip("the process-runner kubelet runs every image; only the fake has a broken one")
    await bed.create_cluster("sour", nodes=3, pchannels=3)
    await bed.converge("sour", is_ready, what="Ready")
    await create_plan(
        bed, "sour-up", "sour", image="headrace-node" + BROKEN_SUFFIX, drainTimeoutSeconds=10
    )

    async def phase() -> str:
        await upgrade_pass(bed, "sour-up")
        return str((await plan_body(bed, "sour-up"))["status"]["phase"])

    await bed.until("sour", lambda: _is(phase, "Blocked"), what="Blocked", timeout=60)
    body = await plan_body(bed, "sour-up")
    assert condition(body, "Blocked")["message"] == (
        "node sour-node-2 has not come back on the target image within 10s: "
        "ImagePullBackOff: no such image"
    )
    stuck = next(n for n in body["status"]["nodes"] if n["node"] == "sour-node-2")
    assert stuck["error"] == "ImagePullBackOff: no such image"
    assert (await images(bed, "sour"))["sour-node-2"].endswith(BROKEN_SUFFIX)
    assert [i for n, i in sorted((await images(bed, "sour")).items()) if n != "sour-node-2"] == [
        bed.image,
        bed.image,
    ], "the plan stopped at that node"
    await bed.kube.patch_merge(*UP, bed.namespace, "sour-up", {"spec": {"rollback": True}})
    await bed.until("sour", lambda: _is(phase, "RolledBack"), what="RolledBack", timeout=60)
    assert set((await images(bed, "sour")).values()) == {bed.image}
    cluster = await bed.cluster("sour")
    assert cluster["spec"]["image"] == bed.image and cluster["spec"]["version"] == "0.1.0"
    assert builders.NODE_IMAGES not in (cluster["metadata"].get("annotations") or {})
    body = await plan_body(bed, "sour-up")
    assert condition(body, "RolledBack")["status"] == "True"
    assert condition(body, "Succeeded")["status"] == "False"
    assert "UpgradeRolledBack" in await bed.event_reasons()


async def test_a_node_that_registers_another_version_blocks_the_plan(bed: Bed) -> None:
    """Running the target image is not enough: the node must register the
    plan's version in the metastore. An image that does not carry it stops
    the plan at its first node (Blocked, naming both versions), the cluster's
    spec is not changed, and rollback brings that node back."""
    await bed.create_cluster("label", nodes=3, pchannels=3)
    await bed.converge("label", is_ready, what="Ready")
    await create_plan(bed, "label-up", "label", version="9.9.9", drainTimeoutSeconds=10)

    async def phase() -> str:
        await upgrade_pass(bed, "label-up")
        return str((await plan_body(bed, "label-up"))["status"]["phase"])

    await bed.until("label", lambda: _is(phase, "Blocked"), what="Blocked", timeout=90)
    body = await plan_body(bed, "label-up")
    registered = bed.version_of(TARGET)
    why = f"{TARGET} registered version {registered}, not the plan's 9.9.9"
    assert condition(body, "Blocked")["message"] == (
        f"node label-node-2 has not come back on the target image within 10s: {why}"
    )
    assert condition(body, "Succeeded")["status"] == "False"
    first = next(n for n in body["status"]["nodes"] if n["node"] == "label-node-2")
    assert (first["step"], first["error"]) == ("Restarting", why)
    assert body["status"]["progress"] == "0/3"
    now = await images(bed, "label")
    assert now == {"label-node-0": bed.image, "label-node-1": bed.image, "label-node-2": TARGET}
    cluster = await bed.cluster("label")
    assert (cluster["spec"]["image"], cluster["spec"]["version"]) == (bed.image, "0.1.0")
    node = next(n for n in cluster["status"]["nodeStatuses"] if n["nodeId"] == "label-node-2")
    assert (node["image"], node["version"]) == (TARGET, registered)
    await bed.kube.patch_merge(*UP, bed.namespace, "label-up", {"spec": {"rollback": True}})
    await bed.until("label", lambda: _is(phase, "RolledBack"), what="RolledBack", timeout=90)
    assert set((await images(bed, "label")).values()) == {bed.image}


async def _is(read: Callable[[], Awaitable[str]], expected: str) -> bool:
    return await read() == expected


async def test_a_finished_plan_does_not_undo_a_later_change(bed: Bed) -> None:
    await bed.create_cluster("done", nodes=1, pchannels=1)
    await bed.converge("done", is_ready, what="Ready")
    await bed.patch_cluster("done", {"spec": {"image": TARGET, "version": bed.version_of(TARGET)}})
    await create_plan(bed, "done-up", "done")

    async def phase() -> str:
        await upgrade_pass(bed, "done-up")
        return str((await plan_body(bed, "done-up"))["status"]["phase"])

    # the cluster's own restart to the target is not this plan's: it waits it out
    await bed.until("done", lambda: _is(phase, "Succeeded"), what="Succeeded")
    body = await plan_body(bed, "done-up")
    assert set((await images(bed, "done")).values()) == {TARGET}
    await bed.patch_cluster("done", {"spec": {"image": "headrace-node:v3"}})
    result = await upgrade_pass(bed, "done-up")
    assert result.halt_reason == "the plan ended Succeeded"
    assert (await bed.cluster("done"))["spec"]["image"] == "headrace-node:v3"
    assert (await plan_body(bed, "done-up"))["status"] == body["status"]

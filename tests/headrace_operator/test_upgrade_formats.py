"""Version skew in an UpgradePlan: the last step switches the cluster's message
format when the target release writes a newer one; a rollback is possible
until that switch and refused (Blocked, saying why) after it.

Simulated nodes of the fake bed run a release writing format 1 only, except
those of ``FORMAT_2_IMAGE`` (formats {1, 2}, as this release); the switch goes
through the same ``ClusterControl.set_format`` (the metastore record) as in
the operator. Every real node of the test bed runs this release, which writes
format 2: on the real API server any plan ends by switching a cluster still
writing format 1 (operator clusters start in it) to 2.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from headrace.message.formats import RELEASE_FORMATS, FormatSupport
from headrace_operator.upgradeplan import format_to_switch, rollback_refusal, source_reads
from tests.headrace_operator.op_harness import FORMAT_2_IMAGE, Bed, condition, is_ready
from tests.headrace_operator.test_upgrade_steps import (
    UP,
    create_plan,
    images,
    plan_body,
    upgrade_pass,
)

pytestmark = pytest.mark.timeout(900)

OLD = FormatSupport.of({1}, {1})
NEW = FormatSupport.of({1, 2}, {1, 2})


def test_format_to_switch() -> None:
    assert format_to_switch({"a": NEW, "b": NEW}, 1) == 2
    assert format_to_switch({"a": NEW, "b": OLD}, 1) == 0, "one node on the old release"
    assert format_to_switch({"a": NEW}, 2) == 0, "already switched"
    assert format_to_switch({}, 1) == 0
    reader = FormatSupport.of({1, 2}, {1})
    assert format_to_switch({"a": reader, "b": reader}, 1) == 0, "reads 2 but writes only 1"


def test_source_reads_and_rollback_refusal() -> None:
    images = {"n0": "v1", "n1": "f2"}
    assert source_reads({"n0": OLD, "n1": NEW}, images, "v1") == {1}
    assert source_reads({"n1": NEW}, images, "v1", recorded=[1]) == {1}
    assert source_reads({"n1": NEW}, images, "v1") == {1}, "no record: releases before formats"
    assert source_reads({"n0": NEW, "n1": NEW}, {"n0": "v1", "n1": "v1"}, "v1") == {1, 2}
    assert rollback_refusal({1}, {1}, "v1") == ""
    assert rollback_refusal({1, 2}, {1, 2}, "v1") == ""
    assert rollback_refusal({1, 2}, {1}, "v1") == (
        "rollback to v1 refused: the cluster writes message format {2} since the format "
        "switch, and the release of v1 reads only {1}, so it could not read the logs; roll "
        "forward, or restore the cluster from before the switch"
    )


async def run_until(
    bed: Bed, cluster: str, plan: str, stop: Any, phases: tuple[str, ...] = ("Pending", "Running")
) -> dict[str, Any]:
    """Cluster and plan passes until ``stop(status)``, every other status in
    one of ``phases``; the plan's status then."""
    deadline = time.monotonic() + (600 if bed.real else 240)
    while True:
        await bed.reconcile(cluster)
        result = await upgrade_pass(bed, plan)
        status = (await plan_body(bed, plan))["status"]
        if stop(status):
            return dict(status)
        assert not result.failures, result.failures
        assert status["phase"] in phases, status
        assert time.monotonic() < deadline, status
        await asyncio.sleep(0.3 if bed.real else 0.05)


async def cluster_format(bed: Bed, cluster: str) -> int:
    return (await (await bed.control(cluster)).snapshot()).cluster_format.version


async def test_the_last_step_switches_the_format_after_every_node_runs_the_target(
    bed: Bed,
) -> None:
    if bed.real:
        pytest.skip("every real node runs this release: no older one to start from")
    await bed.create_cluster("fmt", nodes=3, pchannels=3)
    await bed.converge("fmt", is_ready, what="Ready")
    await create_plan(bed, "fmt-up", "fmt", image=FORMAT_2_IMAGE)
    status = await run_until(
        bed, "fmt", "fmt-up", lambda s: s.get("formats", {}).get("switchedTo", 0) > 0
    )
    assert set((await images(bed, "fmt")).values()) == {FORMAT_2_IMAGE}, "switched last"
    assert {n["step"] for n in status["nodes"]} == {"Done"}
    assert status["phase"] == "Running", "the switch is a step of its own, before Succeeded"
    assert (
        "switched the message format from 1 to 2"
        in condition(await plan_body(bed, "fmt-up"), "Progressing")["message"]
    )
    formats = status["formats"]
    assert (formats["cluster"], formats["sourceReads"]) == (2, [1])
    assert (formats["switchedFrom"], formats["switchedTo"]) == (1, 2)
    assert formats["switchedAt"]
    assert await cluster_format(bed, "fmt") == 2
    status = await run_until(bed, "fmt", "fmt-up", lambda s: s["phase"] == "Succeeded")
    assert status["formats"]["switchedTo"] == 2
    assert (await bed.cluster("fmt"))["spec"]["image"] == FORMAT_2_IMAGE
    reasons = await bed.event_reasons()
    assert reasons.count("UpgradeFormatSwitched") == 1
    assert reasons.index("UpgradeFormatSwitched") < reasons.index("UpgradeSucceeded")


async def test_rollback_before_the_switch_runs_back_and_after_it_is_refused(bed: Bed) -> None:
    if bed.real:
        pytest.skip("every real node runs this release: no older one to roll back to")
    await bed.create_cluster("back", nodes=2, pchannels=2)
    await bed.converge("back", is_ready, what="Ready")
    # Before the switch: one node on the new release, then rollback runs the loop back.
    await create_plan(bed, "back-up", "back", image=FORMAT_2_IMAGE)
    await run_until(
        bed, "back", "back-up", lambda s: any(n["step"] == "Done" for n in s.get("nodes", []))
    )
    assert await cluster_format(bed, "back") == 1
    await bed.kube.patch_merge(*UP, bed.namespace, "back-up", {"spec": {"rollback": True}})
    # (the gates may hold the way back a moment: Blocked while a node drains)
    status = await run_until(
        bed,
        "back",
        "back-up",
        lambda s: s["phase"] == "RolledBack",
        phases=("Pending", "Running", "Blocked"),
    )
    assert set((await images(bed, "back")).values()) == {bed.image}
    assert await cluster_format(bed, "back") == 1
    assert status["formats"]["switchedTo"] == 0
    # A new plan runs to the switch; a rollback then would leave logs of format 2
    # to nodes that read only 1: refused.
    await create_plan(bed, "back-again", "back", image=FORMAT_2_IMAGE)
    await run_until(
        bed, "back", "back-again", lambda s: s.get("formats", {}).get("switchedTo", 0) > 0
    )
    await bed.kube.patch_merge(*UP, bed.namespace, "back-again", {"spec": {"rollback": True}})
    await bed.reconcile("back")
    await upgrade_pass(bed, "back-again")
    body = await plan_body(bed, "back-again")
    assert body["status"]["phase"] == "Blocked"
    assert condition(body, "Blocked")["message"] == (
        f"rollback to {bed.image} refused: the cluster writes message format {{2}} since the "
        f"format switch, and the release of {bed.image} reads only {{1}}, so it could not read "
        "the logs; roll forward, or restore the cluster from before the switch"
    )
    await bed.reconcile("back")
    await upgrade_pass(bed, "back-again")
    assert set((await images(bed, "back")).values()) == {FORMAT_2_IMAGE}, "nothing rolled back"
    assert await cluster_format(bed, "back") == 2


async def test_a_plan_switches_only_to_a_format_the_target_writes(bed: Bed) -> None:
    """On the fake bed the target release writes format 1, as the cluster
    does: the plan records the formats and succeeds without a switch. On the
    real bed the target is this release, which writes format 2: the plan's
    last step switches the cluster to it."""
    await bed.create_cluster("same", nodes=2, pchannels=2)
    await bed.converge("same", is_ready, what="Ready")
    await create_plan(bed, "same-up", "same")
    status = await run_until(bed, "same", "same-up", lambda s: s["phase"] == "Succeeded")
    formats = status["formats"]
    if bed.real:
        assert (formats["cluster"], formats["switchedFrom"], formats["switchedTo"]) == (2, 1, 2)
        assert formats["sourceReads"] == sorted(RELEASE_FORMATS.reads)
        assert await cluster_format(bed, "same") == 2
        assert (await bed.event_reasons()).count("UpgradeFormatSwitched") == 1
        return
    assert formats == {
        "cluster": 1,
        "sourceReads": [1],
        "switchedFrom": 0,
        "switchedTo": 0,
        "switchedAt": "",
    }
    assert await cluster_format(bed, "same") == 1
    assert "UpgradeFormatSwitched" not in await bed.event_reasons()

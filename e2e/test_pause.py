"""Scenario 8: the ``streaming.headrace.io/paused: "true"`` annotation holds a
cluster still. A change of ``spec.nodes`` while paused creates and deletes no
pod (watched over several resync periods) and ReconciliationPaused is True;
removing the annotation lets the change through."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from e2e.conftest import E2E, RESYNC_S
from e2e.harness import (
    API_VERSION,
    CLUSTER_LABEL,
    PAUSED,
    Kube,
    cluster_manifest,
    condition,
    is_ready,
    pod_ready,
    until,
)

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.timeout(240)]

NAME = "held"


async def _pods(kube: Kube, namespace: str) -> dict[str, str]:
    """name -> uid of every pod of the cluster (terminating ones included)."""
    pods = await kube.list("v1", "Pod", namespace, {CLUSTER_LABEL: NAME})
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods}


async def test_paused_cluster_is_held_still_until_unpaused(e2e: E2E) -> None:
    ns = e2e.namespace
    kube = e2e.admin()

    async def body() -> dict[str, Any]:
        found = await kube.get(API_VERSION, "StreamingCluster", ns, NAME)
        assert found is not None
        return dict(found)

    async def ready_with(nodes: int) -> bool:
        current = await body()
        pods = await kube.list("v1", "Pod", ns, {CLUSTER_LABEL: NAME})
        return (
            is_ready(current)
            and current["status"]["nodeSummary"] == f"{nodes}/{nodes}"
            and len(pods) == nodes
            and all(pod_ready(p) for p in pods)
        )

    try:
        manifest = cluster_manifest(NAME, ns, e2e.etcd_endpoint, nodes=1, pchannels=2)
        await kube.apply(manifest)
        await until(lambda: ready_with(1), "1 node Ready", limit=120)
        pods_before = await _pods(kube, ns)

        pause = {"metadata": {"annotations": {PAUSED: "true"}}}
        await kube.patch(API_VERSION, "StreamingCluster", ns, NAME, pause)

        async def paused() -> bool:
            return condition(await body(), "ReconciliationPaused").get("status") == "True"

        await until(paused, "ReconciliationPaused True", limit=30)
        await kube.patch(API_VERSION, "StreamingCluster", ns, NAME, {"spec": {"nodes": 2}})
        generation = (await body())["metadata"]["generation"]
        held_until = time.monotonic() + 4 * RESYNC_S + 1.0
        while time.monotonic() < held_until:
            assert await _pods(kube, ns) == pods_before, "a pod changed while paused"
            await asyncio.sleep(0.25)
        current = await body()
        paused_condition = condition(current, "ReconciliationPaused")
        assert paused_condition["status"] == "True"
        assert paused_condition["reason"] == "PausedByAnnotation"
        assert current["status"]["observedGeneration"] < generation

        resume = {"metadata": {"annotations": {PAUSED: None}}}
        await kube.patch(API_VERSION, "StreamingCluster", ns, NAME, resume)
        await until(lambda: ready_with(2), "2 nodes Ready after unpausing", limit=120)
        current = await body()
        assert condition(current, "ReconciliationPaused")["status"] == "False"
        assert current["status"]["observedGeneration"] == current["metadata"]["generation"]
        assert set(pods_before) < set(await _pods(kube, ns))
        events = await kube.list("v1", "Event", ns)
        reasons = {e["reason"] for e in events if e["involvedObject"]["name"] == NAME}
        assert {"ReconciliationPaused", "ReconciliationResumed"} <= reasons
    finally:
        await kube.delete(API_VERSION, "StreamingCluster", ns, NAME)

        async def gone() -> bool:
            return not await _pods(kube, ns)

        await until(gone, "the cluster's pods deleted", limit=60)
        kube.close()

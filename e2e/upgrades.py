"""What the UpgradePlan scenarios share: their StreamingCluster and plan, as
the admin sees them, and the cluster's life around a module of tests."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

import headrace
from e2e.conftest import E2E
from e2e.harness import (
    API_VERSION,
    CLUSTER_LABEL,
    Kube,
    cluster_manifest,
    is_ready,
    live_pods,
    pod_ready,
    until,
)


@dataclasses.dataclass(frozen=True)
class Shape:
    """A scenario's cluster and plan names and size."""

    name: str
    plan: str
    nodes: int
    pchannels: int


@dataclasses.dataclass
class UpgradeBed:
    e2e: E2E
    kube: Kube
    shape: Shape

    @property
    def ns(self) -> str:
        return self.e2e.namespace

    async def cluster(self) -> dict[str, Any]:
        body = await self.kube.get(API_VERSION, "StreamingCluster", self.ns, self.shape.name)
        assert body is not None
        return dict(body)

    async def pods(self) -> dict[str, dict[str, Any]]:
        selector = {CLUSTER_LABEL: self.shape.name}
        return live_pods(await self.kube.list("v1", "Pod", self.ns, selector))

    async def uids(self) -> dict[str, str]:
        return {name: pod["metadata"]["uid"] for name, pod in (await self.pods()).items()}

    async def images(self) -> dict[str, str]:
        return {n: p["spec"]["containers"][0]["image"] for n, p in (await self.pods()).items()}

    async def plan(self) -> dict[str, Any]:
        body = await self.kube.get(API_VERSION, "UpgradePlan", self.ns, self.shape.plan)
        assert body is not None
        return dict(body)

    async def phase(self, expected: str) -> bool:
        return ((await self.plan()).get("status") or {}).get("phase") == expected

    async def settled(self) -> bool:
        """Ready, every pchannel served, every node pod running and Ready."""
        body = await self.cluster()
        status = body.get("status") or {}
        running = await self.pods()
        count = self.shape.pchannels
        return (
            is_ready(body)
            and status.get("pchannelSummary") == f"{count}/{count}"
            and len(running) == self.shape.nodes
            and all(pod_ready(p) for p in running.values())
        )

    async def plan_events(self) -> list[str]:
        return [
            str(e.get("reason"))
            for e in await self.kube.list("v1", "Event", self.ns)
            if (e.get("involvedObject") or {}).get("name") == self.shape.plan
        ]


def plan_manifest(bed: UpgradeBed, image: str, **spec: Any) -> dict[str, Any]:
    """The scenario's UpgradePlan to ``image`` (this tree's version), with ``spec``."""
    return {
        "apiVersion": API_VERSION,
        "kind": "UpgradePlan",
        "metadata": {"name": bed.shape.plan, "namespace": bed.ns},
        "spec": {
            "clusterRef": {"name": bed.shape.name},
            "version": headrace.__version__,
            "image": image,
            **spec,
        },
    }


@contextlib.asynccontextmanager
async def cluster_for(
    e2e: E2E, shape: Shape, flush: Mapping[str, Any] | None = None
) -> AsyncIterator[Kube]:
    """The scenario's cluster applied (with ``flush`` as its flush section);
    on the way out its plan and it deleted, and waited for until its pods are
    gone."""
    kube = e2e.admin()
    body = cluster_manifest(
        shape.name,
        e2e.namespace,
        e2e.etcd_endpoint,
        nodes=shape.nodes,
        pchannels=shape.pchannels,
    )
    if flush is not None:
        body["spec"]["flush"] = dict(flush)
    await kube.apply(body)
    try:
        yield kube
    finally:
        await kube.delete(API_VERSION, "UpgradePlan", e2e.namespace, shape.plan)
        await kube.delete(API_VERSION, "StreamingCluster", e2e.namespace, shape.name)

        async def gone() -> bool:
            pods = await kube.list("v1", "Pod", e2e.namespace, {CLUSTER_LABEL: shape.name})
            body = await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, shape.name)
            return body is None and not pods

        await until(gone, f"{shape.name} and its pods deleted", limit=180)
        kube.close()

"""The operator as shipped: ``python -m headrace_operator`` (kopf) on a real
API server, with node pods run by the test bed's kubelet as real
``headrace node`` processes and the control plane's etcd as metastore."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import headrace
from headrace.cluster import AssignmentState, Keys
from headrace.coordinator import read_snapshot
from headrace.coordinator.election import current_leader
from headrace.metastore.factory import open_metastore
from headrace_operator import models
from headrace_operator.kube import KubernetesApi
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.op_harness import condition, install_crds, is_ready

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]
OPERATOR_DIR = Path(__file__).resolve().parents[2] / "operator"


async def wait(check: Callable[[], Awaitable[bool]], what: str, limit: float = 120) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        assert loop.time() < deadline, f"not reached within {limit}s: {what}"
        await asyncio.sleep(0.5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


class Operators:
    """Starts ``python -m headrace_operator`` processes (each with its own
    ``POD_NAME``, the replica's identity) watching one namespace."""

    def __init__(self, kubeconfig: Path, namespace: str, logs: Path) -> None:
        self.kubeconfig, self.namespace, self.logs = kubeconfig, namespace, logs
        self.running: dict[str, subprocess.Popen[bytes]] = {}
        self.codes: dict[str, int] = {}
        self.metrics: dict[str, str] = {}
        """identity -> host:port of its metrics endpoint."""

    def log(self, identity: str) -> Path:
        return self.logs / f"{identity}.log"

    def start(self, identity: str) -> None:
        env = dict(os.environ)
        extra = [str(OPERATOR_DIR), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in extra if p)
        env["POD_NAME"] = identity
        self.metrics[identity] = f"127.0.0.1:{free_port()}"
        with self.log(identity).open("ab") as log:
            self.running[identity] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "headrace_operator",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--namespace={self.namespace}",
                    "--resync-seconds=2",
                    f"--metrics-listen={self.metrics[identity]}",
                    "--log-format=json",
                ],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def stop(self, identity: str) -> int:
        """SIGTERM (SIGKILL after 30 s); the exit code."""
        process = self.running.pop(identity)
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(10)
        self.codes[identity] = code
        return code


@pytest.fixture
async def operators(
    kube_cluster: KubeTestbed, tmp_path: Path
) -> AsyncIterator[tuple[KubernetesApi, Operators]]:
    api = KubernetesApi(kube_cluster.api_client())
    await install_crds(api)
    namespace = f"opp-{uuid.uuid4().hex[:8]}"
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    launcher = Operators(kube_cluster.kubeconfig, namespace, tmp_path)
    try:
        yield api, launcher
    finally:
        for identity in list(launcher.running):
            launcher.stop(identity)
        await api.delete("v1", "Namespace", "", namespace)
        api.close()
    for identity, code in launcher.codes.items():
        assert code == 0, launcher.log(identity).read_text()[-4000:]


@pytest.fixture
async def operator(
    operators: tuple[KubernetesApi, Operators],
) -> AsyncIterator[tuple[KubernetesApi, str, str]]:
    """The API, the namespace and the operator's metrics address."""
    api, launcher = operators
    launcher.start("operator-a")
    yield api, launcher.namespace, launcher.metrics["operator-a"]


def cluster_body(namespace: str, etcd_endpoint: str) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": "demo", "namespace": namespace},
        "spec": {
            "nodes": 2,
            "pchannels": 2,
            "image": "headrace-node:test",
            "version": "0.1.0",
            "leaseTTLSeconds": 2,
            "metastore": {"etcdEndpoints": [etcd_endpoint]},
        },
    }


async def test_operator_runs_a_cluster_end_to_end(
    operator: tuple[KubernetesApi, str, str], kube_cluster: KubeTestbed
) -> None:
    api, namespace, metrics_at = operator
    await api.create(cluster_body(namespace, kube_cluster.cluster.etcd.endpoint))
    current: dict[str, Any] = {}

    async def get() -> dict[str, Any]:
        found = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
        assert found is not None
        return found

    async def ready() -> bool:
        nonlocal current
        current = await get()
        return is_ready(current)

    await wait(ready, "the cluster Ready")
    assert current["status"]["pchannelSummary"] == "2/2"
    assert current["status"]["coordinator"].endswith(f"/{namespace}/demo")
    operator_metrics = await asyncio.to_thread(scrape, metrics_at)
    passes = {
        dict(labels)["outcome"]: value
        for (name, labels), value in operator_metrics.items()
        if name == "headrace_operator_reconcile_total"
        and dict(labels)["kind"] == "StreamingCluster"
    }
    assert passes.get("done", 0) >= 1, passes
    durations = ("headrace_operator_reconcile_duration_seconds_count", "StreamingCluster")
    assert operator_metrics[(durations[0], frozenset({("kind", durations[1])}))] >= 1
    serving = 0.0
    for pod in await api.list("v1", "Pod", namespace, {}):
        node_metrics = await asyncio.to_thread(scrape, f"{pod['status']['podIP']}:9400")
        serving += sum(
            value
            for (name, labels), value in node_metrics.items()
            if name == "headrace_wal_state" and dict(labels)["state"] == "SERVING"
        )
    assert serving == 2, "each of the 2 pchannels SERVING on one node pod"
    pause = {models.PAUSED_ANNOTATION: "true"}
    await api.patch_merge(
        models.API_VERSION,
        "StreamingCluster",
        namespace,
        "demo",
        {"metadata": {"annotations": pause}},
    )

    async def paused() -> bool:
        return condition(await get(), "ReconciliationPaused").get("status") == "True"

    await wait(paused, "ReconciliationPaused")
    await api.delete(models.API_VERSION, "StreamingCluster", namespace, "demo")

    async def gone() -> bool:
        cluster = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
        pods = await api.list("v1", "Pod", namespace, {})
        return cluster is None and not pods

    await wait(gone, "the cluster and its pods deleted")
    claims = await api.list("v1", "PersistentVolumeClaim", namespace, {})
    assert [c["metadata"]["name"] for c in claims] == ["demo-wal"]


async def test_a_paused_cluster_keeps_its_coordinator_across_an_operator_restart(
    operators: tuple[KubernetesApi, Operators], kube_cluster: KubeTestbed
) -> None:
    """The operator is restarted while the cluster is paused: the new process
    runs the cluster's coordinator (it leads, and fails a pchannel over when
    its node goes) while the pause still holds the pods."""
    api, launcher = operators
    namespace = launcher.namespace
    await api.create(cluster_body(namespace, kube_cluster.cluster.etcd.endpoint))
    launcher.start("operator-a")
    keys = Keys(f"{namespace}.demo")
    store = await open_metastore(f"etcd://{kube_cluster.cluster.etcd.endpoint}")
    try:

        async def get() -> dict[str, Any]:
            found = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
            assert found is not None
            return found

        async def ready() -> bool:
            return is_ready(await get())

        await wait(ready, "the cluster Ready")
        pause = {"metadata": {"annotations": {models.PAUSED_ANNOTATION: "true"}}}
        await api.patch_merge(models.API_VERSION, "StreamingCluster", namespace, "demo", pause)

        async def paused() -> bool:
            return condition(await get(), "ReconciliationPaused").get("status") == "True"

        await wait(paused, "ReconciliationPaused")
        assert launcher.stop("operator-a") == 0
        launcher.start("operator-b")

        async def b_leads() -> bool:
            leader = await current_leader(store, keys)
            return leader is not None and leader.coordinator_id == f"operator-b/{namespace}/demo"

        await wait(b_leads, "the restarted operator's coordinator leads")
        snapshot = await read_snapshot(store, keys)
        victim = snapshot.assignments["pchannel-000"].node
        survivor = next(n for n in ("demo-node-0", "demo-node-1") if n != victim)
        doomed = await api.get("v1", "Pod", namespace, victim)
        assert doomed is not None
        await api.delete("v1", "Pod", namespace, victim)

        async def failed_over() -> bool:
            records = (await read_snapshot(store, keys)).assignments.values()
            return all(r.node == survivor and r.state is AssignmentState.ASSIGNED for r in records)

        await wait(failed_over, f"every pchannel on {survivor} while paused")

        async def deleted() -> bool:
            # The failover can be seen before the API server has removed the
            # deleted pod; wait for that pod (by uid) to be gone, so a pod the
            # operator recreated under the same name is still caught below.
            pods = await api.list("v1", "Pod", namespace, {})
            return all(p["metadata"]["uid"] != doomed["metadata"]["uid"] for p in pods)

        await wait(deleted, f"the deleted pod {victim} gone")
        pods = await api.list("v1", "Pod", namespace, {})
        assert [p["metadata"]["name"] for p in pods] == [survivor], "paused: no pod recreated"
    finally:
        await store.close()


async def test_two_replicas_one_leads_and_the_other_takes_over(
    operators: tuple[KubernetesApi, Operators], kube_cluster: KubeTestbed
) -> None:
    """The chart's two replicas: both run, one coordinator leads and its
    replica reconciles; when that replica stops the other's coordinator takes
    over and the cluster keeps being reconciled (a scale-up goes through)."""
    api, launcher = operators
    namespace = launcher.namespace
    await api.create(cluster_body(namespace, kube_cluster.cluster.etcd.endpoint))
    launcher.start("operator-a")
    launcher.start("operator-b")
    keys = Keys(f"{namespace}.demo")
    store = await open_metastore(f"etcd://{kube_cluster.cluster.etcd.endpoint}")
    try:
        current: dict[str, Any] = {}

        async def ready_with(nodes: int) -> bool:
            nonlocal current
            found = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
            current = found or {}
            return is_ready(current) and current["status"]["nodeSummary"] == f"{nodes}/{nodes}"

        await wait(lambda: ready_with(2), "the cluster Ready")
        leader = await current_leader(store, keys)
        assert leader is not None
        first = leader.coordinator_id.split("/", 1)[0]
        assert first in ("operator-a", "operator-b")
        assert current["status"]["coordinator"] == leader.coordinator_id
        other = "operator-b" if first == "operator-a" else "operator-a"
        assert launcher.stop(first) == 0

        async def other_leads() -> bool:
            found = await current_leader(store, keys)
            return found is not None and found.coordinator_id.startswith(f"{other}/")

        await wait(other_leads, f"{other}'s coordinator leads")
        await api.patch_merge(
            models.API_VERSION, "StreamingCluster", namespace, "demo", {"spec": {"nodes": 3}}
        )
        await wait(lambda: ready_with(3), "scaled to 3 by the remaining replica")
        assert current["status"]["coordinator"] == f"{other}/{namespace}/demo"
    finally:
        await store.close()


async def test_operator_carries_out_a_rolling_upgrade_plan(
    operator: tuple[KubernetesApi, str, str], kube_cluster: KubeTestbed
) -> None:
    api, namespace, _metrics = operator
    await api.create(cluster_body(namespace, kube_cluster.cluster.etcd.endpoint))

    async def ready() -> bool:
        found = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
        return found is not None and is_ready(found)

    await wait(ready, "the cluster Ready")
    target = "headrace-node:v2"
    await api.create(
        {
            "apiVersion": models.API_VERSION,
            "kind": "UpgradePlan",
            "metadata": {"name": "demo-up", "namespace": namespace},
            "spec": {
                "clusterRef": {"name": "demo"},
                # the bed runs this tree whatever the image: its nodes register this version
                "version": headrace.__version__,
                "image": target,
                "soakSeconds": 1,
            },
        }
    )
    plan: dict[str, Any] = {}

    async def succeeded() -> bool:
        nonlocal plan
        plan = await api.get(models.API_VERSION, "UpgradePlan", namespace, "demo-up") or {}
        return (plan.get("status") or {}).get("phase") == "Succeeded"

    await wait(succeeded, "the UpgradePlan Succeeded", limit=240)
    pods = await api.list("v1", "Pod", namespace, {})
    assert {p["spec"]["containers"][0]["image"] for p in pods} == {target}
    assert plan["status"]["progress"] == "2/2"
    cluster = await api.get(models.API_VERSION, "StreamingCluster", namespace, "demo")
    assert cluster is not None
    assert (cluster["spec"]["image"], cluster["spec"]["version"]) == (target, headrace.__version__)
    assert cluster["status"]["runningImage"] == target
    assert cluster["status"]["runningVersion"] == headrace.__version__

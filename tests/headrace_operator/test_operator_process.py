"""The operator as shipped: ``python -m headrace_operator`` (kopf) on a real
API server, with node pods run by the test bed's kubelet as real
``headrace node`` processes and the control plane's etcd as metastore."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
async def operator(
    kube_cluster: KubeTestbed, tmp_path: Path
) -> AsyncIterator[tuple[KubernetesApi, str]]:
    api = KubernetesApi(kube_cluster.api_client())
    await install_crds(api)
    namespace = f"opp-{uuid.uuid4().hex[:8]}"
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OPERATOR_DIR), env.get("PYTHONPATH")]))
    log = (tmp_path / "operator.log").open("wb")
    process = subprocess.Popen(  # noqa: ASYNC220 - started once, outside the loop's hot path
        [
            sys.executable,
            "-m",
            "headrace_operator",
            f"--kubeconfig={kube_cluster.kubeconfig}",
            f"--namespace={namespace}",
            "--resync-seconds=2",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield api, namespace
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait(10)
        log.close()
        await api.delete("v1", "Namespace", "", namespace)
        api.close()
    assert code == 0, (tmp_path / "operator.log").read_text()[-4000:]


async def test_operator_runs_a_cluster_end_to_end(
    operator: tuple[KubernetesApi, str], kube_cluster: KubeTestbed
) -> None:
    api, namespace = operator
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": "demo", "namespace": namespace},
        "spec": {
            "nodes": 2,
            "pchannels": 2,
            "image": "headrace-node:test",
            "version": "0.1.0",
            "leaseTTLSeconds": 2,
            "metastore": {"etcdEndpoints": [kube_cluster.cluster.etcd.endpoint]},
        },
    }
    await api.create(body)
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

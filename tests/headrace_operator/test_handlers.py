"""The kopf handlers' own logic, on the fake API server: what the operator does
when it learns of a cluster (resume after a restart, create, each resync)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf
import pytest

from headrace.cluster import AssignmentState, Keys
from headrace.coordinator import read_snapshot
from headrace.metastore.sqlite import SqliteMetastore
from headrace_operator import handlers, models
from headrace_operator.coordinator_runner import CoordinatorRunners
from headrace_operator.events import KubeEventSink
from headrace_operator.probe import TcpProbe
from headrace_operator.results import DONE, FailureKind, PassResult, failed, waiting_on
from tests.headrace_operator.fake_kube import FakeKube
from tests.headrace_operator.op_harness import SimNode
from tests.headrace_operator.test_coordinator_runner import eventually, sqlite_opener

pytestmark = pytest.mark.timeout(60)
KEYS = Keys("ns.demo")


def paused_cluster() -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {
            "name": "demo",
            "namespace": "ns",
            "annotations": {models.PAUSED_ANNOTATION: "true"},
        },
        "spec": {
            "nodes": 2,
            "pchannels": 2,
            "image": "headrace-node:test",
            "version": "0.1.0",
            "leaseTTLSeconds": 1,
            "metastore": {"etcdEndpoints": ["127.0.0.1:2379"]},
        },
    }


async def test_a_paused_cluster_keeps_its_coordinator_across_an_operator_restart(
    tmp_path: Path,
) -> None:
    """A fresh operator process (empty memo) resumes a paused cluster: the pause
    holds the Kubernetes objects, but the coordinator starts and assigns and
    fails pchannels over."""
    opener = sqlite_opener(tmp_path / "meta.db")
    store = await opener("")
    assert isinstance(store, SqliteMetastore)
    kube = FakeKube()
    await kube.apply(paused_cluster())
    runtime = handlers.Runtime(
        kube=kube,
        runners=CoordinatorRunners("operator-b", opener),
        probe=TcpProbe(timeout=1.0),
        events=KubeEventSink(kube, "test"),
    )
    nodes = [SimNode(store, KEYS, f"demo-node-{i}") for i in range(2)]
    for node in nodes:
        await node.start()
    try:
        await handlers.reconcile(kopf.Memo(runtime=runtime), "ns", "demo")
        assert runtime.runners.get("ns/demo") is not None, "no coordinator for a paused cluster"

        async def on(held_by: set[str]) -> bool:
            snapshot = await read_snapshot(store, KEYS)
            records = list(snapshot.assignments.values())
            return len(records) == 2 and all(
                r.state is AssignmentState.ASSIGNED and r.node in held_by for r in records
            )

        await eventually(lambda: on({"demo-node-0", "demo-node-1"}), "both pchannels assigned")
        await nodes[0].stop()
        await eventually(lambda: on({"demo-node-1"}), "failover to demo-node-1 while paused")
        assert await kube.list("v1", "Pod", "ns", {}) == [], "paused: no Kubernetes object"
    finally:
        await runtime.runners.stop_all()
        for node in nodes:
            if node.task is not None and not node.task.done():
                await node.stop()
        await store.close()


async def test_an_invalid_spec_starts_no_coordinator(tmp_path: Path) -> None:
    kube = FakeKube()
    body = paused_cluster()
    body["metadata"]["annotations"] = {}
    body["spec"]["wal"] = {"backend": "kafka"}
    await kube.apply(body)
    runtime = handlers.Runtime(
        kube=kube,
        runners=CoordinatorRunners("operator-b", sqlite_opener(tmp_path / "meta.db")),
        probe=TcpProbe(timeout=1.0),
        events=KubeEventSink(kube, "test"),
    )
    try:
        await handlers.reconcile(kopf.Memo(runtime=runtime), "ns", "demo")
        assert runtime.runners.get("ns/demo") is None
        found = await kube.get(models.API_VERSION, "StreamingCluster", "ns", "demo")
        assert found is not None
        degraded = [c for c in found["status"]["conditions"] if c["type"] == "Degraded"]
        assert degraded[0]["reason"] == "InvalidSpec"
    finally:
        await runtime.runners.stop_all()


def test_a_retryable_failure_that_decides_the_pass_retries_soon() -> None:
    failure = failed("kafka unreachable", retryable=True, kind=FailureKind.BACKEND)
    with pytest.raises(kopf.TemporaryError) as raised:
        handlers.retry_soon(PassResult((("spec", DONE), ("backends", failure))))
    assert raised.value.delay == handlers.RETRY_S and "backends: kafka unreachable" in str(
        raised.value
    )
    handlers.retry_soon(PassResult((("coordinator", waiting_on("connecting")), ("b", failure))))
    handlers.retry_soon(PassResult((("pods", failed("forbidden", retryable=False)),)))
    handlers.retry_soon(None)

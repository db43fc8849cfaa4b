"""The StreamingCluster reconcile steps, on the fake and on the real API server.

Every test runs twice through the ``bed`` fixture (see ``op_harness.py``):
against the in-memory API fake with simulated nodes, and against a real
kube-apiserver whose node pods run the real ``headrace node`` processes.
"""

from __future__ import annotations

from typing import Any

import pytest

from headrace.cluster import AssignmentState
from headrace_operator import builders, models
from headrace_operator.results import (
    DONE,
    FailureKind,
    Halt,
    PassResult,
    combine,
    failed,
    halted,
    waiting_on,
)
from headrace_operator.steps import standby_reason
from tests.headrace_operator.op_harness import PCA, Bed, condition, is_ready

pytestmark = pytest.mark.timeout(240)


def summary(body: dict[str, Any]) -> tuple[str, str]:
    status = body.get("status") or {}
    return status.get("nodeSummary", ""), status.get("pchannelSummary", "")


async def test_creates_every_object_and_becomes_ready(bed: Bed) -> None:
    await bed.create_cluster("alpha")
    body = await bed.converge("alpha", is_ready, what="Ready")
    assert summary(body) == ("2/2", "4/4")
    assert body["status"]["observedGeneration"] == body["metadata"]["generation"]
    assert condition(body, "Degraded")["status"] == "False"
    assert condition(body, "ReconciliationPaused")["status"] == "False"
    ns = bed.namespace
    for api_version, kind, name in [
        ("v1", "ConfigMap", "alpha-config"),
        ("v1", "Service", "alpha"),
        ("v1", "Service", "alpha-nodes"),
        ("v1", "ServiceAccount", "alpha-node"),
        ("rbac.authorization.k8s.io/v1", "Role", "alpha-node"),
        ("rbac.authorization.k8s.io/v1", "RoleBinding", "alpha-node"),
        ("policy/v1", "PodDisruptionBudget", "alpha-nodes"),
        ("v1", "PersistentVolumeClaim", "alpha-wal"),
    ]:
        obj = await bed.kube.get(api_version, kind, ns, name)
        assert obj is not None, f"{kind} {name} missing"
    assert set(await bed.pods("alpha")) == {"alpha-node-0", "alpha-node-1"}
    claims = await bed.kube.list("v1", "PersistentVolumeClaim", ns, {})
    assert [c["metadata"]["name"] for c in claims] == ["alpha-wal"], "one volume, shared"
    assert claims[0]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert not claims[0]["metadata"].get("ownerReferences")
    for pod in (await bed.pods("alpha")).values():
        volumes = pod["spec"]["volumes"]
        assert {"name": "wal", "persistentVolumeClaim": {"claimName": "alpha-wal"}} in volumes
    assignments = await bed.kube.list(*PCA, ns, {builders.LABEL_CLUSTER: "alpha"})
    assert sorted(a["spec"]["pchannel"] for a in assignments) == [
        f"pchannel-00{i}" for i in range(4)
    ]
    for item in assignments:
        assert item["status"]["state"] == "ASSIGNED"
        assert item["status"]["node"] in {"alpha-node-0", "alpha-node-1"}
        assert item["status"]["term"] >= 1
        assert item["metadata"]["ownerReferences"][0]["uid"] == body["metadata"]["uid"]
    reasons = await bed.event_reasons()
    assert reasons.count("NodePodCreated") == 2


async def test_a_settled_pass_writes_nothing(bed: Bed) -> None:
    await bed.create_cluster("calm", nodes=1, pchannels=2)
    await bed.converge("calm", is_ready, what="Ready")
    await bed.reconcile("calm")
    objects = [
        ("v1", "ConfigMap", "calm-config"),
        ("v1", "Service", "calm"),
        ("v1", "Pod", "calm-node-0"),
        ("v1", "PersistentVolumeClaim", "calm-wal"),
        (models.API_VERSION, "StreamingCluster", "calm"),
    ]
    before = [await bed.kube.get(v, k, bed.namespace, n) for v, k, n in objects]
    await bed.reconcile("calm")
    after = [await bed.kube.get(v, k, bed.namespace, n) for v, k, n in objects]
    for old, new, (_, kind, name) in zip(before, after, objects, strict=True):
        assert old is not None and new is not None
        old_version = old["metadata"]["resourceVersion"]
        assert new["metadata"]["resourceVersion"] == old_version, f"{kind} {name} was rewritten"


async def test_scale_down_drains_the_highest_node_before_deleting_it(bed: Bed) -> None:
    await bed.create_cluster("shrink", nodes=3, pchannels=6)
    await bed.converge("shrink", is_ready, what="Ready with 3 nodes")
    await bed.patch_cluster("shrink", {"spec": {"nodes": 2}})
    first = await bed.reconcile("shrink")
    pods = await bed.pods("shrink")
    assert "shrink-node-2" in pods, "the pod must outlive its drain"
    assert pods["shrink-node-2"]["metadata"]["annotations"][builders.DRAINING] == "scale-down"
    assert not first.failures
    control = await bed.control("shrink")
    snapshot = await control.snapshot()
    assert snapshot.node_controls["shrink-node-2"].draining

    async def shrunk() -> bool:
        # The drained pod goes in the pass after the one that sees it drained.
        body = await bed.cluster("shrink")
        pods = set(await bed.pods("shrink"))
        done = is_ready(body) and summary(body) == ("2/2", "6/6")
        return done and pods == {"shrink-node-0", "shrink-node-1"}

    await bed.until("shrink", shrunk, what="2 nodes, node 2 deleted")
    snapshot = await control.snapshot()
    held = {r.node for r in snapshot.assignments.values() if r.state is AssignmentState.ASSIGNED}
    assert held <= {"shrink-node-0", "shrink-node-1"}
    reasons = await bed.event_reasons()
    assert reasons.index("NodeDrainStarted") < reasons.index("NodeDrained")
    assert "NodePodDeleted" in reasons
    claims = await bed.kube.list("v1", "PersistentVolumeClaim", bed.namespace, {})
    assert [c["metadata"]["name"] for c in claims] == ["shrink-wal"]


async def test_scale_down_with_delete_data_keeps_the_shared_volume(bed: Bed) -> None:
    """The shared volume holds the WALs the remaining nodes serve: scale-down
    never deletes it, even with deleteDataOnDelete (which only ties it to the
    cluster's lifetime)."""
    await bed.create_cluster("purge", nodes=2, pchannels=2, deleteDataOnDelete=True)
    await bed.converge("purge", is_ready, what="Ready")
    claim = await bed.kube.get("v1", "PersistentVolumeClaim", bed.namespace, "purge-wal")
    assert claim is not None
    assert claim["metadata"]["ownerReferences"][0]["kind"] == "StreamingCluster"
    await bed.patch_cluster("purge", {"spec": {"nodes": 1}})

    async def node_1_gone() -> bool:
        return set(await bed.pods("purge")) == {"purge-node-0"}

    await bed.until("purge", node_1_gone, what="node 1 drained and deleted")
    after = await bed.kube.get("v1", "PersistentVolumeClaim", bed.namespace, "purge-wal")
    assert after is not None and not after["metadata"].get("deletionTimestamp")
    assert after["metadata"]["uid"] == claim["metadata"]["uid"]
    reasons = await bed.event_reasons()
    assert reasons.index("NodeDrainStarted") < reasons.index("NodePodDeleted")


async def test_pause_annotation_stops_reconciliation(bed: Bed) -> None:
    await bed.create_cluster("still", nodes=1, pchannels=2)
    before = await bed.converge("still", is_ready, what="Ready")
    annotations = {models.PAUSED_ANNOTATION: "true"}
    await bed.patch_cluster(
        "still", {"metadata": {"annotations": annotations}, "spec": {"nodes": 2}}
    )
    paused = await bed.reconcile("still")
    assert paused.paused and paused.decision is not None
    assert paused.decision[0] == "pause" and paused.steps[-1][0] == "pause"
    body = await bed.cluster("still")
    assert condition(body, "ReconciliationPaused")["status"] == "True"
    assert condition(body, "ReconciliationPaused")["reason"] == "PausedByAnnotation"
    assert set(await bed.pods("still")) == {"still-node-0"}, "paused: no new pod"
    assert body["status"]["observedGeneration"] < body["metadata"]["generation"]
    # The last observed status stays while paused (pods still serve).
    assert summary(body) == summary(before)
    assert condition(body, "Ready") == condition(before, "Ready")
    assert "ReconciliationPaused" in await bed.event_reasons()
    unpaused = {"metadata": {"annotations": {models.PAUSED_ANNOTATION: None}}}
    await bed.patch_cluster("still", unpaused)
    body = await bed.converge("still", lambda b: summary(b)[0] == "2/2", what="2 nodes")
    assert condition(body, "ReconciliationPaused")["status"] == "False"
    assert "ReconciliationResumed" in await bed.event_reasons()


async def test_unreachable_backend_degrades_with_an_event(bed: Bed) -> None:
    wal = {"backend": "kafka", "kafka": {"bootstrapServers": ["127.0.0.1:1"]}}
    await bed.create_cluster("dark", nodes=0, pchannels=1, wal=wal)
    body = await bed.converge(
        "dark",
        lambda b: condition(b, "Degraded").get("status") == "True",
        what="Degraded",
    )
    degraded = condition(body, "Degraded")
    assert degraded["reason"] == "BackendUnreachable"
    assert "kafka unreachable at 127.0.0.1:1" in degraded["message"]
    assert condition(body, "Ready")["status"] == "False"
    assert "BackendUnreachable" in await bed.event_reasons()
    await bed.reconcile("dark")
    assert (await bed.event_reasons()).count("BackendUnreachable") == 1, "one event per change"


async def test_pinned_node_moves_the_pchannel_by_handoff(bed: Bed) -> None:
    await bed.create_cluster("pin", nodes=2, pchannels=2)
    await bed.converge("pin", is_ready, what="Ready")
    name = builders.assignment_name("pin", "pchannel-000")
    item = await bed.kube.get(*PCA, bed.namespace, name)
    assert item is not None
    current = item["status"]["node"]
    other = "pin-node-1" if current == "pin-node-0" else "pin-node-0"
    await bed.kube.patch_merge(*PCA, bed.namespace, name, {"spec": {"pinnedNode": other}})

    found: dict[str, Any] = {}

    async def moved() -> bool:
        nonlocal found
        found = await bed.kube.get(*PCA, bed.namespace, name) or {}
        return found["status"]["node"] == other and found["status"]["state"] == "ASSIGNED"

    await bed.until("pin", moved, what=f"pchannel-000 on {other}")
    assert found["status"]["pinned"] is True
    assert found["status"]["term"] > item["status"]["term"]
    assert found["spec"]["pinnedNode"] == other, "the operator never overwrites the user's pin"
    reasons = await bed.event_reasons()
    assert "PChannelMoveRequested" in reasons
    assert "PChannelMoved" in reasons


async def test_template_change_restarts_nodes_one_by_one(bed: Bed) -> None:
    await bed.create_cluster("roll", nodes=2, pchannels=4)
    body = await bed.converge("roll", is_ready, what="Ready")
    old = {n: p["metadata"]["uid"] for n, p in (await bed.pods("roll")).items()}
    await bed.patch_cluster("roll", {"spec": {"version": "0.1.1"}})
    seen_draining: set[str] = set()

    def rolled(b: dict[str, Any]) -> bool:
        return is_ready(b) and b["status"]["observedGeneration"] == b["metadata"]["generation"]

    async def replaced() -> bool:
        nonlocal body
        pods = await bed.pods("roll")
        draining = {
            n for n, p in pods.items() if builders.DRAINING in p["metadata"].get("annotations", {})
        }
        assert len(draining) <= 1, "one restart at a time"
        seen_draining.update(draining)
        new = {n for n, p in pods.items() if p["metadata"]["uid"] != old.get(n)}
        body = await bed.cluster("roll")
        return new == set(old) and rolled(body)

    await bed.until("roll", replaced, timeout=60, what="every pod replaced")
    assert {
        n for n, p in (await bed.pods("roll")).items() if p["metadata"]["uid"] != old[n]
    } == set(old)
    assert rolled(body)
    reasons = await bed.event_reasons()
    assert reasons.count("NodeRestarting") == 2
    assert seen_draining, "nodes holding pchannels are drained before their restart"


async def test_invalid_spec_is_reported_with_its_field(bed: Bed) -> None:
    if bed.real:
        pytest.skip("the real API server rejects this spec at admission (test_crd_server.py)")
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": "broken", "namespace": bed.namespace},
        "spec": bed.spec(wal={"backend": "kafka"}),
    }
    await bed.kube.apply(body)
    result = await bed.reconcile("broken")
    assert result.halt is Halt.INVALID_SPEC and "wal.kafka is required" in result.halt_reason
    assert [name for name, _ in result.steps] == ["pause", "spec"], "the pass ends at the spec"
    status = (await bed.cluster("broken"))["status"]
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "InvalidSpec"
    assert "wal.kafka" in degraded["message"]
    assert await bed.pods("broken") == {}
    assert "InvalidSpec" in await bed.event_reasons()


async def test_a_standby_replica_writes_nothing(bed: Bed) -> None:
    """Two operator replicas: the one whose coordinator leads the cluster
    reconciles it; the other's passes halt before changing any object."""
    await bed.create_cluster("twin", nodes=1, pchannels=2)
    await bed.converge("twin", is_ready, what="Ready")
    other = bed.replica("operator-b")
    try:
        await bed.patch_cluster("twin", {"spec": {"nodes": 2}})
        before = await bed.cluster("twin")
        for _ in range(3):
            result = await other.reconcile("twin")
            assert result.halt is Halt.STANDBY, result.steps
            assert "stands by" in result.halt_reason and result.status is None
        assert set(await bed.pods("twin")) == {"twin-node-0"}, "the standby created a pod"
        after = await bed.cluster("twin")
        assert after["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
        await bed.converge(
            "twin", lambda b: is_ready(b) and summary(b)[0] == "2/2", what="the leader scaled up"
        )
    finally:
        await other.runners.stop_all()


def test_standby_reason_names_the_leader() -> None:
    assert standby_reason("", "op-a/ns/c") == "", "no leader yet: every replica reconciles"
    assert standby_reason("op-a/ns/c", "op-a/ns/c") == ""
    assert standby_reason("op-a/ns/c", "") == "", "no local coordinator: nothing to defer to"
    assert "op-b/ns/c leads" in standby_reason("op-b/ns/c", "op-a/ns/c")


def test_the_first_result_that_is_not_done_decides_the_pass() -> None:
    result = PassResult(
        (
            ("pause", DONE),
            ("coordinator", waiting_on("connecting to the metastore")),
            ("backends", failed("kafka unreachable", retryable=True, kind=FailureKind.BACKEND)),
            ("pods", failed("forbidden", retryable=False)),
        )
    )
    assert result.decision == ("coordinator", waiting_on("connecting to the metastore"))
    assert result.retry_reason == "", "a wait decides: no early retry"
    assert result.failures == ("pods: forbidden",)
    assert result.failures_of(FailureKind.BACKEND) == ("kafka unreachable",)
    assert not result.completed and result.halt is None
    early = PassResult((("backends", failed("etcd down", retryable=True)),))
    assert early.retry_reason == "backends: etcd down"
    assert PassResult((("pause", DONE), ("spec", DONE))).completed


def test_combine_keeps_every_part_and_the_first_halt() -> None:
    parts = [
        waiting_on("a"),
        halted(Halt.PAUSED, "first"),
        failed("x", retryable=False),
        halted(Halt.STANDBY, "second"),
    ]
    merged = combine(parts)
    assert merged.waiting == ("a",) and merged.halt is Halt.PAUSED and merged.reason == "first"
    assert [f.message for f in merged.failures] == ["x"]
    assert combine([DONE, DONE]).done

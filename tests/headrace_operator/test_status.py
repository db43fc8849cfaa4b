"""Pure status: conditions per the API conventions, pchannel mirrors, pins."""

from __future__ import annotations

import dataclasses
import datetime

from headrace.cluster import Assignment, AssignmentState, NodeInfo
from headrace.coordinator.control import MoveRequest, NodeControl
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace_operator.flushplan import FlushReport
from headrace_operator.models import FlushRunStatus, FlushStatus, RunJob
from headrace_operator.nodeplan import PodView
from headrace_operator.status import (
    ClusterObservation,
    cluster_status,
    moved_from,
    pchannel_status,
    pin_step,
    pod_view,
)

T0 = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def snapshot(assigned: dict[str, str], live: list[str], **kw: object) -> ClusterSnapshot:
    return ClusterSnapshot(
        nodes={n: NodeInfo(node_id=n, address=f"{n}:1") for n in live},
        assignments={
            p: Assignment(pchannel=p, state=AssignmentState.ASSIGNED, term=3, node=n)
            for p, n in assigned.items()
        },
        **kw,  # type: ignore[arg-type]
    )


def ready_pods(count: int) -> tuple[PodView, ...]:
    return tuple(
        PodView(name=f"c-node-{i}", ordinal=i, phase="Running", ready=True) for i in range(count)
    )


def conditions(status: dict[str, object]) -> dict[str, dict[str, object]]:
    return {c["type"]: c for c in status["conditions"]}  # type: ignore[index, union-attr]


def test_ready_cluster() -> None:
    obs = ClusterObservation(
        cluster="c",
        generation=4,
        desired_nodes=2,
        total_pchannels=2,
        pods=ready_pods(2),
        snapshot=snapshot({"p0": "c-node-0", "p1": "c-node-1"}, ["c-node-0", "c-node-1"]),
        leader="op-1/ns/c",
        completed=True,
    )
    status = cluster_status(obs, None, T0)
    cond = conditions(status)
    assert cond["Ready"]["status"] == "True"
    assert cond["Ready"]["reason"] == "AllReady"
    assert cond["Progressing"]["status"] == "False"
    assert cond["Degraded"]["status"] == "False"
    assert cond["ReconciliationPaused"]["status"] == "False"
    assert all(c["observedGeneration"] == 4 for c in cond.values())
    assert all(c["lastTransitionTime"] == "2026-01-01T12:00:00Z" for c in cond.values())
    assert status["observedGeneration"] == 4
    assert (status["nodeSummary"], status["pchannelSummary"]) == ("2/2", "2/2")
    assert status["coordinator"] == "op-1/ns/c"
    assert (
        status["selector"]
        == "app.kubernetes.io/component=streaming-node,streaming.headrace.io/cluster=c"
    )
    assert [n["pchannels"] for n in status["nodeStatuses"]] == [1, 1]  # type: ignore[index]


def test_status_shows_the_images_and_versions_the_nodes_really_run() -> None:
    """Observed from the pods and the metastore registrations, not the spec:
    mid-upgrade the nodes disagree, and a node without a session has no version."""
    pods = (
        PodView(name="c-node-0", ordinal=0, phase="Running", ready=True, image="img:1"),
        PodView(name="c-node-1", ordinal=1, phase="Running", ready=True, image="img:2"),
        PodView(name="c-node-2", ordinal=2, phase="Running", ready=True, image="img:2"),
        PodView(name="c-node-3", ordinal=3, phase="Pending", image="img:2"),
    )
    versions = {"c-node-0": "0.1.0", "c-node-1": "0.2.0", "c-node-2": "0.2.0"}
    snap = ClusterSnapshot(
        nodes={n: NodeInfo(node_id=n, address=f"{n}:1", version=v) for n, v in versions.items()}
    )
    obs = ClusterObservation(
        cluster="c", generation=1, desired_nodes=4, total_pchannels=1, pods=pods, snapshot=snap
    )
    status = cluster_status(obs, None, T0)
    nodes = status["nodeStatuses"]
    assert [(n["image"], n["version"]) for n in nodes] == [  # type: ignore[index]
        ("img:1", "0.1.0"),
        ("img:2", "0.2.0"),
        ("img:2", "0.2.0"),
        ("img:2", ""),
    ]
    assert status["runningVersion"] == "0.1.0 (1), 0.2.0 (2)"
    assert status["runningImage"] == "img:1 (1), img:2 (3)"
    agreed = cluster_status(
        ClusterObservation(
            cluster="c",
            generation=1,
            desired_nodes=3,
            total_pchannels=1,
            pods=pods[1:3],
            snapshot=snap,
        ),
        None,
        T0,
    )
    assert (agreed["runningVersion"], agreed["runningImage"]) == ("0.2.0", "img:2")


def test_pod_view_reads_the_container_image() -> None:
    pod = {
        "metadata": {"name": "c-node-0"},
        "spec": {"containers": [{"name": "node", "image": "img:7"}]},
    }
    view = pod_view("c", pod)
    assert view is not None and view.image == "img:7"


def test_transition_time_moves_only_when_the_status_changes() -> None:
    base = ClusterObservation(
        cluster="c", generation=1, desired_nodes=1, total_pchannels=1, pods=ready_pods(1)
    )
    first = cluster_status(base, None, T0)
    same = cluster_status(base, first, T1)
    assert conditions(same)["Ready"]["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    degraded = ClusterObservation(
        cluster="c",
        generation=1,
        desired_nodes=1,
        total_pchannels=1,
        backend_problems=("etcd unreachable at e:2379",),
    )
    changed = cluster_status(degraded, first, T1)
    cond = conditions(changed)
    assert cond["Degraded"]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert cond["Degraded"]["reason"] == "BackendUnreachable"
    assert cond["Ready"]["lastTransitionTime"] == "2026-01-01T12:00:00Z", "Ready stayed False"


def test_incomplete_pass_keeps_observed_generation() -> None:
    obs = ClusterObservation(
        cluster="c", generation=7, desired_nodes=1, total_pchannels=1, paused=True
    )
    status = cluster_status(obs, {"observedGeneration": 5}, T0)
    assert status["observedGeneration"] == 5
    assert conditions(status)["ReconciliationPaused"]["status"] == "True"


def test_reasons_in_order_of_importance() -> None:
    def ready_reason(**kw: object) -> tuple[str, str]:
        values: dict[str, object] = {
            "cluster": "c",
            "generation": 1,
            "desired_nodes": 2,
            "total_pchannels": 2,
        }
        values.update(kw)
        cond = conditions(cluster_status(ClusterObservation(**values), None, T0))  # type: ignore[arg-type]
        return cond["Ready"]["reason"], cond["Degraded"]["reason"]  # type: ignore[return-value]

    assert ready_reason(spec_error="spec.wal.kafka: missing") == ("InvalidSpec", "InvalidSpec")
    assert ready_reason(failures=("pods: forbidden",)) == ("ReconcileFailed", "ReconcileFailed")
    assert ready_reason(coordinator_error="stored pchannels differ") == (
        "CoordinatorFailed",
        "CoordinatorFailed",
    )
    assert ready_reason(pods=ready_pods(1)) == ("NodesNotReady", "AsExpected")
    assert ready_reason(pods=ready_pods(2)) == ("MetastoreUnknown", "AsExpected")
    partial = snapshot({"p0": "c-node-0"}, ["c-node-0"])
    assert ready_reason(pods=ready_pods(2), snapshot=partial) == (
        "PChannelsNotAssigned",
        "AsExpected",
    )


def test_pod_view_parses_node_pods_only() -> None:
    pod = {
        "metadata": {
            "name": "c-node-1",
            "annotations": {
                "streaming.headrace.io/draining": "restart",
                "streaming.headrace.io/template-hash": "h",
            },
            "deletionTimestamp": "2026-01-01T00:00:00Z",
        },
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }
    view = pod_view("c", pod)
    assert view == PodView("c-node-1", 1, "Running", True, True, "h", "restart")
    assert pod_view("c", {"metadata": {"name": "c-config"}}) is None


def test_pchannel_status_mirrors_the_record_and_remembers_the_previous_node() -> None:
    record = Assignment(
        pchannel="p0", state=AssignmentState.UNASSIGNING, term=4, node="a", target="b"
    )
    first = pchannel_status(record, "b", "moving", generation=2)
    assert first == {
        "node": "a",
        "term": 4,
        "state": "UNASSIGNING",
        "target": "b",
        "previousNode": "",
        "pinned": True,
        "message": "moving",
        "observedGeneration": 2,
    }
    arriving = Assignment(pchannel="p0", state=AssignmentState.ASSIGNING, term=5, node="b")
    second = pchannel_status(arriving, "b", "", generation=2, before=first)
    assert second["previousNode"] == "a"
    assert moved_from(first, second) == ""
    served = Assignment(pchannel="p0", state=AssignmentState.ASSIGNED, term=5, node="b")
    third = pchannel_status(served, "b", "", generation=2, before=second)
    assert moved_from(second, third) == "a"
    assert moved_from(third, pchannel_status(served, "b", "", generation=2, before=third)) == ""
    assert pchannel_status(None, None, "not assigned yet", generation=1)["state"] == "UNKNOWN"


def test_pin_step() -> None:
    snap = snapshot({"p0": "a"}, ["a", "b", "c"], node_controls={"c": NodeControl(frozen=True)})
    assert not pin_step("p0", None, snap).move
    assert not pin_step("p0", "a", snap).move
    assert pin_step("p0", "b", snap).move
    assert "not alive" in pin_step("p0", "z", snap).message
    assert "frozen" in pin_step("p0", "c", snap).message
    pending = snapshot({"p0": "a"}, ["a", "b"], moves={"p0": MoveRequest(to="b")})
    assert not pin_step("p0", "b", pending).move


def test_flush_status_and_condition_follow_the_flush_step() -> None:
    base = ClusterObservation(cluster="c", generation=1, desired_nodes=0, total_pchannels=1)
    failing = FlushRunStatus(pchannel="p0", job=RunJob.FLUSH, failures=1, last_error="boom")
    report = FlushReport(
        FlushStatus(spark_api="x/v1", lag="7s", runs=[failing]), False, "RunsFailing", "p0"
    )
    first = cluster_status(dataclasses.replace(base, flush=report), None, T0)
    assert first["flush"]["lag"] == "7s"
    assert conditions(first)["FlushHealthy"]["status"] == "False"
    # A pass whose flush step did not run (a halt) keeps both as they were.
    kept = cluster_status(base, first, T1)
    assert kept["flush"] == first["flush"]
    assert conditions(kept)["FlushHealthy"] == conditions(first)["FlushHealthy"]
    # Healthy again: a new transition time; no flush section: both go.
    healthy = FlushReport(FlushStatus(spark_api="x/v1"), True, "RunsSucceeding", "ok")
    again = cluster_status(dataclasses.replace(base, flush=healthy), first, T1)
    assert conditions(again)["FlushHealthy"]["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    gone = cluster_status(dataclasses.replace(base, flush=FlushReport(None)), again, T1)
    assert "flush" not in gone and "FlushHealthy" not in conditions(gone)

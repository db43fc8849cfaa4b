"""The pure node plan: creation, drain-before-delete, restarts, one at a time."""

from __future__ import annotations

from collections.abc import Iterable

from headrace.cluster import Assignment, AssignmentState
from headrace_operator.nodeplan import (
    ActionKind,
    Disruption,
    NodeFacts,
    PodView,
    delete_blocked,
    drain_blocked,
    holdings,
    plan_nodes,
    restart_blocked,
)

H = {i: f"hash-{i}" for i in range(8)}


def pod(i: int, **kw: object) -> PodView:
    values: dict[str, object] = {
        "name": f"c-node-{i}",
        "ordinal": i,
        "phase": "Running",
        "ready": True,
        "template_hash": H[i],
    }
    values.update(kw)
    return PodView(**values)  # type: ignore[arg-type]


def facts(
    holding: dict[str, int], live: set[str] | None = None, frozen: Iterable[str] = ()
) -> NodeFacts:
    nodes = live if live is not None else set(holding) | {f"c-node-{i}" for i in range(3)}
    return NodeFacts(holding=holding, live=frozenset(nodes), frozen=frozenset(frozen))


def kinds(plan: object) -> list[tuple[ActionKind, str]]:
    return [(a.kind, a.node) for a in plan.actions]  # type: ignore[attr-defined]


def test_missing_pods_are_created() -> None:
    plan = plan_nodes("c", 3, H, {0: pod(0)}, None)
    assert kinds(plan) == [(ActionKind.CREATE, "c-node-1"), (ActionKind.CREATE, "c-node-2")]


def test_scale_down_drains_highest_first_and_waits() -> None:
    pods = {i: pod(i) for i in range(4)}
    plan = plan_nodes("c", 2, H, pods, facts({"c-node-3": 2, "c-node-2": 1, "c-node-0": 1}))
    assert kinds(plan) == [(ActionKind.START_DRAIN, "c-node-3")]
    pods[3] = pod(3, draining="scale-down")
    plan = plan_nodes("c", 2, H, pods, facts({"c-node-3": 1, "c-node-0": 1}))
    assert kinds(plan) == []
    assert "draining c-node-3: 1 pchannel(s) still on it" in plan.waiting
    plan = plan_nodes("c", 2, H, pods, facts({"c-node-0": 3}))
    assert kinds(plan) == [(ActionKind.DELETE_DRAINED, "c-node-3")]


def test_scale_down_without_the_metastore_never_deletes() -> None:
    pods = {0: pod(0), 1: pod(1, draining="scale-down")}
    plan = plan_nodes("c", 1, H, pods, None)
    assert kinds(plan) == []
    assert any("metastore unreachable" in w for w in plan.waiting)


def test_last_node_counts_as_drained() -> None:
    pods = {0: pod(0, draining="scale-down")}
    plan = plan_nodes(
        "c", 0, H, pods, facts({"c-node-0": 4}, live={"c-node-0"}, frozen={"c-node-0"})
    )
    assert kinds(plan) == [(ActionKind.DELETE_DRAINED, "c-node-0")]


def test_scale_up_cancels_a_scale_down_drain() -> None:
    pods = {0: pod(0), 1: pod(1, draining="scale-down")}
    plan = plan_nodes("c", 2, H, pods, facts({"c-node-0": 2}, frozen={"c-node-1"}))
    assert kinds(plan) == [(ActionKind.CANCEL_DRAIN, "c-node-1")]


def test_recreated_pod_of_a_frozen_node_is_unfrozen() -> None:
    plan = plan_nodes("c", 1, H, {0: pod(0)}, facts({}, frozen={"c-node-0"}))
    assert kinds(plan) == [(ActionKind.UNFREEZE, "c-node-0")]


def test_terminated_pods_are_replaced_and_terminating_ones_awaited() -> None:
    pods = {0: pod(0, phase="Failed", ready=False), 1: pod(1, terminating=True)}
    plan = plan_nodes("c", 2, H, pods, facts({}))
    assert kinds(plan) == [(ActionKind.DELETE_TERMINATED, "c-node-0")]
    assert plan.waiting == ("pod c-node-1 is terminating",)


def test_restart_drains_one_busy_pod_at_a_time_and_replaces_idle_ones() -> None:
    stale = {i: pod(i, template_hash="old") for i in range(3)}
    plan = plan_nodes("c", 3, H, stale, facts({"c-node-0": 1, "c-node-1": 1, "c-node-2": 0}))
    assert kinds(plan) == [(ActionKind.REPLACE_IDLE, "c-node-2")]
    stale[2] = pod(2)
    plan = plan_nodes("c", 3, H, stale, facts({"c-node-0": 1, "c-node-1": 1}))
    assert kinds(plan) == [(ActionKind.START_DRAIN, "c-node-1")]
    stale[1] = pod(1, template_hash="old", draining="restart")
    plan = plan_nodes("c", 3, H, stale, facts({"c-node-0": 1, "c-node-1": 1}))
    assert kinds(plan) == [], "node 0 waits for node 1"
    plan = plan_nodes("c", 3, H, stale, facts({"c-node-0": 1, "c-node-2": 1}))
    assert kinds(plan) == [(ActionKind.DELETE_DRAINED, "c-node-1")]


def test_restart_waits_for_every_pod_to_be_ready() -> None:
    pods = {0: pod(0, template_hash="old"), 1: pod(1, ready=False)}
    plan = plan_nodes("c", 2, H, pods, facts({"c-node-0": 2}))
    assert kinds(plan) == []
    assert "restart of c-node-0 waits until every node pod is ready" in plan.waiting


def test_holdings_count_holder_and_destination() -> None:
    records = [
        Assignment(pchannel="p0", state=AssignmentState.ASSIGNED, term=1, node="a"),
        Assignment(pchannel="p1", state=AssignmentState.UNASSIGNING, term=2, node="a", target="b"),
        Assignment(pchannel="p2", state=AssignmentState.UNASSIGNED, term=3, node="b"),
        Assignment(pchannel="p3", state=AssignmentState.ASSIGNING, term=1, node="c"),
    ]
    assert holdings(records) == {"a": 2, "b": 1, "c": 1}


def test_safety_gates_say_why_they_block() -> None:
    draining = [pod(2, draining="scale-down")]
    assert drain_blocked(pod(2), draining) == "", "its own drain does not block it"
    assert drain_blocked(pod(1), draining) == "waits for the drain of c-node-2"
    assert delete_blocked(pod(2), None).endswith("metastore unreachable")
    assert delete_blocked(pod(2), facts({"c-node-2": 3})) == "3 pchannel(s) still on it"
    assert delete_blocked(pod(2), facts({"c-node-2": 0})) == ""
    assert delete_blocked(pod(2), facts({"c-node-2": 1}, live={"c-node-2"})) == "", "no peer"
    assert restart_blocked(Disruption(), 1) == ""
    assert "c-node-2" in restart_blocked(Disruption(draining=("c-node-2",)), 1)
    assert restart_blocked(Disruption(not_ready=("c-node-0",)), 1).endswith("node pod is ready")
    assert restart_blocked(Disruption(acted=("c-node-1",)), 1) != ""
    assert restart_blocked(Disruption(scaling_down=True), 3) == "waits for the scale-down"
    assert restart_blocked(Disruption(draining=("c-node-2",)), 2) == ""
    assert restart_blocked(Disruption(draining=("c-node-2",), not_ready=("c-node-2",)), 2) == ""
    assert restart_blocked(Disruption(not_ready=("c-node-0", "c-node-1")), 2) == (
        "waits: 2 node pod(s) not ready (maxUnavailable 2)"
    )


def test_max_unavailable_drains_that_many_at_once_highest_first() -> None:
    stale = {i: pod(i, template_hash="old") for i in range(5)}
    held = facts({f"c-node-{i}": 1 for i in range(5)})
    plan = plan_nodes("c", 5, H, stale, held, max_unavailable=2)
    assert kinds(plan) == [
        (ActionKind.START_DRAIN, "c-node-4"),
        (ActionKind.START_DRAIN, "c-node-3"),
    ]
    stale[4] = pod(4, template_hash="old", draining="restart")
    stale[3] = pod(3, template_hash="old", draining="restart")
    plan = plan_nodes("c", 5, H, stale, held, max_unavailable=2)
    assert kinds(plan) == [], "two draining: the third waits"
    drained = facts({f"c-node-{i}": 1 for i in range(3)})
    plan = plan_nodes("c", 5, H, stale, drained, max_unavailable=2)
    assert kinds(plan) == [
        (ActionKind.DELETE_DRAINED, "c-node-4"),
        (ActionKind.DELETE_DRAINED, "c-node-3"),
    ], "deleted together; the next drain waits until they are back"
    back = {**stale, 4: pod(4), 3: pod(3, ready=False)}
    plan = plan_nodes("c", 5, H, back, drained, max_unavailable=2)
    assert kinds(plan) == [(ActionKind.START_DRAIN, "c-node-2")], "one down, one more may go"


def test_max_unavailable_never_takes_every_node() -> None:
    stale = {i: pod(i, template_hash="old") for i in range(3)}
    held = facts({f"c-node-{i}": 1 for i in range(3)})
    plan = plan_nodes("c", 3, H, stale, held, max_unavailable=5)
    assert kinds(plan) == [
        (ActionKind.START_DRAIN, "c-node-2"),
        (ActionKind.START_DRAIN, "c-node-1"),
    ], "one node stays to take the pchannels"
    single = plan_nodes(
        "c", 1, H, {0: pod(0, template_hash="old")}, facts({"c-node-0": 2}), max_unavailable=4
    )
    assert kinds(single) == [(ActionKind.START_DRAIN, "c-node-0")]


def test_offline_stops_every_stale_pod_at_once_without_a_drain_and_unfreezes_none() -> None:
    stale = {i: pod(i, template_hash="old") for i in range(3)}
    busy = facts({"c-node-0": 2, "c-node-1": 1, "c-node-2": 1}, frozen={"c-node-0", "c-node-1"})
    plan = plan_nodes("c", 3, H, stale, busy, offline=True)
    assert kinds(plan) == [
        (ActionKind.STOP_OFFLINE, "c-node-2"),
        (ActionKind.STOP_OFFLINE, "c-node-1"),
        (ActionKind.STOP_OFFLINE, "c-node-0"),
    ], "every node at once, holding pchannels or not (writes are stopped)"
    current = {0: pod(0), 1: pod(1), 2: pod(2, template_hash="old")}
    plan = plan_nodes("c", 3, H, current, busy, offline=True)
    assert kinds(plan) == [(ActionKind.STOP_OFFLINE, "c-node-2")], (
        "a recreated frozen node stays frozen (the plan unfreezes it); a current pod stays"
    )
    plan = plan_nodes("c", 3, H, {0: pod(0)}, None, offline=True)
    assert kinds(plan) == [(ActionKind.CREATE, "c-node-1"), (ActionKind.CREATE, "c-node-2")]

"""The pure UpgradePlan planner: ordering, coordinator last, spread, and each gate."""

from __future__ import annotations

import datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace_operator.upgradeplan import (
    ClusterView,
    NodeStep,
    UpgradeNode,
    cluster_missing,
    competing_plan,
    drain_overdue,
    node_step,
    nothing_to_upgrade,
    offline_plan,
    other_nodes_draining,
    pchannels_not_serving,
    plan_paused,
    rolling_plan,
    settling,
    stuck_nodes,
    version_mismatch,
)

OLD, NEW = "node:1", "node:2"
V1, V2 = "0.1.0", "0.2.0"


def view(
    nodes: int, pchannels: int, coordinator: str = "", images: dict[int, str] | None = None
) -> ClusterView:
    images = images or {}
    names = [f"c-node-{i}" for i in range(nodes)]
    channels = tuple(f"pchannel-{i:03d}" for i in range(pchannels))
    holdings: dict[str, list[str]] = {name: [] for name in names}
    for i, pchannel in enumerate(channels):
        holdings[names[i % nodes]].append(pchannel)
    return ClusterView(
        nodes=tuple(
            UpgradeNode(
                name,
                i,
                images.get(i, OLD),
                ready=True,
                registered=True,
                version=V2 if images.get(i, OLD) == NEW else V1,
            )
            for i, name in enumerate(names)
        ),
        coordinator=coordinator,
        holdings={k: tuple(v) for k, v in holdings.items()},
        pchannels=channels,
        serving={p: names[i % nodes] for i, p in enumerate(channels)},
    )


def test_one_node_at_a_time_highest_ordinal_first_coordinator_last() -> None:
    steps = rolling_plan(view(3, 6, coordinator="c-node-2"), NEW, 1)
    assert [s.nodes for s in steps] == [["c-node-1"], ["c-node-0"], ["c-node-2"]]
    assert [s.coordinator for s in steps] == [False, False, True]


def test_moves_spread_and_never_onto_the_restarted_node() -> None:
    steps = rolling_plan(view(3, 6), NEW, 1)
    first = steps[0]
    assert first.nodes == ["c-node-2"]
    assert sorted(m.to for m in first.moves) == ["c-node-0", "c-node-1"]
    second = steps[1]
    assert {m.to for m in second.moves} == {"c-node-2"} or len({m.to for m in second.moves}) > 1
    assert all(m.to != "c-node-1" for m in second.moves)


def test_nodes_already_on_the_target_are_not_planned() -> None:
    steps = rolling_plan(view(3, 6, images={1: NEW}), NEW, 1)
    assert [s.nodes for s in steps] == [["c-node-2"], ["c-node-0"]]


def test_max_unavailable_groups_but_leaves_one_node_up() -> None:
    steps = rolling_plan(view(3, 6), NEW, 5)
    assert [s.nodes for s in steps] == [["c-node-2", "c-node-1"], ["c-node-0"]]
    assert {m.to for m in steps[0].moves} == {"c-node-0"}


@settings(max_examples=150, deadline=None)
@given(
    nodes=st.integers(min_value=2, max_value=8),
    pchannels=st.integers(min_value=0, max_value=40),
    max_unavailable=st.integers(min_value=1, max_value=8),
    coordinator=st.integers(min_value=-1, max_value=7),
)
def test_plan_properties(
    nodes: int, pchannels: int, max_unavailable: int, coordinator: int
) -> None:
    leader = f"c-node-{coordinator}" if 0 <= coordinator < nodes else "elsewhere"
    v = view(nodes, pchannels, coordinator=leader)
    steps = rolling_plan(v, NEW, max_unavailable)
    order = [n for s in steps for n in s.nodes]
    assert sorted(order) == sorted(n.name for n in v.nodes), "every node exactly once"
    assert all(0 < len(s.nodes) <= max(1, min(max_unavailable, nodes - 1)) for s in steps)
    if leader != "elsewhere":
        assert steps[-1].nodes == [leader], "the coordinator's node last, alone"
    placement = {p: n for n, held in v.holdings.items() for p in held}
    for step in steps:
        leaving = sorted(p for p, n in placement.items() if n in step.nodes)
        assert sorted(m.pchannel for m in step.moves) == leaving, "every held pchannel moves"
        assert not {m.to for m in step.moves} & set(step.nodes), "never onto a restarting node"
        receivers = [n.name for n in v.nodes if n.name not in step.nodes]
        before = {r: sum(1 for n in placement.values() if n == r) for r in receivers}
        placement.update({m.pchannel: m.to for m in step.moves})
        after = {r: sum(1 for n in placement.values() if n == r) for r in receivers}
        fair = -(-sum(after.values()) // len(receivers))
        assert max(after.values()) <= max(*before.values(), fair), (
            "spread over the receivers, never piled onto one",
            before,
            after,
        )


def test_offline_plan_lists_every_phase() -> None:
    steps = offline_plan(view(2, 2))
    assert [s.action for s in steps] == [
        "stop-writes",
        "drain-and-fence",
        "flush",
        "stop-nodes",
        "start-nodes",
        "resume-writes",
    ]
    assert steps[3].nodes == ["c-node-0", "c-node-1"]
    assert steps[2].nodes == [] and steps[0].nodes == []


def test_gates_say_why() -> None:
    assert cluster_missing("alpha", True) == ""
    assert "alpha does not exist" in cluster_missing("alpha", False)
    assert competing_plan("alpha", []) == ""
    assert (
        competing_plan("alpha", ["first"]) == "UpgradePlan first is already upgrading cluster alpha"
    )
    assert plan_paused(False) == "" and "paused" in plan_paused(True)
    assert nothing_to_upgrade(view(2, 2), NEW, V2) == ""
    upgraded = view(2, 2, images={0: NEW, 1: NEW})
    assert "every node runs node:2" in nothing_to_upgrade(upgraded, NEW, V2)
    assert nothing_to_upgrade(upgraded, NEW, "0.3.0") == "", "the image, not the version"


def test_serving_gate_names_the_idle_pchannels() -> None:
    v = view(2, 3)
    assert pchannels_not_serving(v) == ""
    partial = ClusterView(v.nodes, v.coordinator, v.holdings, v.pchannels, {"pchannel-000": "x"})
    assert (
        pchannels_not_serving(partial)
    ) == "2 pchannel(s) not assigned and serving: pchannel-001, pchannel-002"


def test_draining_gate_ignores_the_plans_own_nodes() -> None:
    nodes = (
        UpgradeNode("c-node-0", 0, OLD, draining=True),
        UpgradeNode("c-node-1", 1, OLD),
    )
    v = ClusterView(nodes)
    assert other_nodes_draining(v, ["c-node-0"]) == ""
    assert "c-node-0 is draining" in other_nodes_draining(v, ["c-node-1"])


def test_drain_overdue() -> None:
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    node = UpgradeNode("n", 0, NEW)
    assert drain_overdue(node, None, start, 10) == ""
    assert drain_overdue(node, start, start + datetime.timedelta(seconds=10), 10) == ""
    late = drain_overdue(node, start, start + datetime.timedelta(seconds=11), 10)
    assert late == "node n has not come back on the target image within 10s"
    pulling = UpgradeNode("n", 0, NEW, problem="ImagePullBackOff: no such image")
    assert drain_overdue(pulling, start, start + datetime.timedelta(seconds=11), 10).endswith(
        "within 10s: ImagePullBackOff: no such image"
    )


def test_node_step() -> None:
    up = UpgradeNode("n", 0, NEW, ready=True, registered=True, version=V2)
    assert (
        node_step(up, target_image=NEW, target_version=V2, told=True, holding=0, soaked=False)
        is NodeStep.SOAKING
    )
    assert (
        node_step(up, target_image=NEW, target_version=V2, told=True, holding=2, soaked=True)
        is NodeStep.DONE
    )
    unregistered = UpgradeNode("n", 0, NEW, ready=True)
    assert node_step(
        unregistered, target_image=NEW, target_version=V2, told=True, holding=0, soaked=True
    ) is (NodeStep.RESTARTING)
    still_frozen = UpgradeNode("n", 0, NEW, ready=True, registered=True, version=V2, draining=True)
    assert node_step(
        still_frozen, target_image=NEW, target_version=V2, told=True, holding=0, soaked=True
    ) is (NodeStep.RESTARTING)
    mislabeled = UpgradeNode("n", 0, NEW, ready=True, registered=True, version=V1)
    assert node_step(
        mislabeled, target_image=NEW, target_version=V2, told=True, holding=0, soaked=True
    ) is (NodeStep.RESTARTING), "on the image but registered another version: not back"
    old = UpgradeNode("n", 0, OLD, ready=True, registered=True)
    assert node_step(
        old, target_image=NEW, target_version=V2, told=False, holding=3, soaked=False
    ) is (NodeStep.PENDING)
    assert node_step(
        old, target_image=NEW, target_version=V2, told=True, holding=3, soaked=False
    ) is (NodeStep.DRAINING)
    assert node_step(
        old, target_image=NEW, target_version=V2, told=True, holding=0, soaked=False
    ) is (NodeStep.RESTARTING)


def test_version_mismatch_says_what_the_node_registered() -> None:
    mislabeled = UpgradeNode("n", 0, NEW, ready=True, registered=True, version=V1)
    assert (
        version_mismatch(mislabeled, NEW, V2)
        == "node:2 registered version 0.1.0, not the plan's 0.2.0"
    )
    silent = UpgradeNode("n", 0, NEW, ready=True, registered=True)
    assert version_mismatch(silent, NEW, V2) == "node:2 registered no version, not the plan's 0.2.0"
    assert version_mismatch(UpgradeNode("n", 0, NEW, version=V2, registered=True), NEW, V2) == ""
    assert version_mismatch(UpgradeNode("n", 0, NEW), NEW, V2) == "", "not registered yet"
    assert version_mismatch(UpgradeNode("n", 0, OLD, registered=True), NEW, V2) == ""
    start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    why = version_mismatch(mislabeled, NEW, V2)
    late = drain_overdue(
        UpgradeNode("n", 0, NEW, problem=why), start, start + datetime.timedelta(seconds=11), 10
    )
    assert late.endswith("within 10s: node:2 registered version 0.1.0, not the plan's 0.2.0")


def test_stuck_nodes_go_first_only_when_they_hold_nothing() -> None:
    nodes = (
        UpgradeNode("c-node-0", 0, OLD, ready=True, registered=True),
        UpgradeNode("c-node-1", 1, NEW),
        UpgradeNode("c-node-2", 2, NEW),
        UpgradeNode("c-node-3", 3, ""),
    )
    v = ClusterView(nodes, holdings={"c-node-2": ("pchannel-000",)})
    assert stuck_nodes(v, OLD) == ["c-node-1"], "not Ready, nothing held, not on the target"
    assert stuck_nodes(v, NEW) == []


def test_settling_only_shortly_after_a_node_came_back() -> None:
    back = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    assert not settling(None, back, 60), "before any node came back a gate blocks"
    assert settling(back, back + datetime.timedelta(seconds=59), 60)
    assert not settling(back, back + datetime.timedelta(seconds=60), 60)

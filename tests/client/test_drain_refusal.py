"""``headrace drain`` refuses at once when no other node can take the pchannels
(a single-node cluster's preStop drain would otherwise wait out its timeout)."""

from __future__ import annotations

from headrace import errors
from headrace.client.api import drain_refusal
from headrace.cluster import Assignment, AssignmentState, NodeInfo
from headrace.coordinator.control import NodeControl
from headrace.coordinator.snapshot import ClusterSnapshot


def snapshot(
    nodes: dict[str, bool], controls: dict[str, NodeControl] | None = None
) -> ClusterSnapshot:
    """Live nodes (id -> frozen in its NodeInfo), n1 holding p-0 and p-1."""
    return ClusterSnapshot(
        nodes={n: NodeInfo(node_id=n, address="127.0.0.1:1", frozen=f) for n, f in nodes.items()},
        assignments={
            p: Assignment(pchannel=p, node="n1", term=1, state=AssignmentState.ASSIGNED)
            for p in ("p-0", "p-1")
        },
        node_controls=controls or {},
    )


def test_a_lone_node_holding_pchannels_is_refused_naming_them() -> None:
    refusal = drain_refusal("n1", ["p-0", "p-1"], snapshot({"n1": False}))
    assert isinstance(refusal, errors.Unavailable)
    assert "p-0, p-1" in refusal.message and "no other live, unfrozen node" in refusal.message


def test_frozen_or_draining_peers_cannot_take_them() -> None:
    frozen = snapshot({"n1": False, "n2": True})
    assert drain_refusal("n1", ["p-0"], frozen) is not None
    draining = snapshot({"n1": False, "n2": False}, {"n2": NodeControl(draining=True)})
    assert drain_refusal("n1", ["p-0"], draining) is not None


def test_a_live_peer_or_nothing_held_lets_the_drain_go_on() -> None:
    assert drain_refusal("n1", ["p-0"], snapshot({"n1": False, "n2": False})) is None
    assert drain_refusal("n1", [], snapshot({"n1": False})) is None

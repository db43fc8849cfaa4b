"""The assignment state machine and the pure reconcile pass."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.cluster import Assignment, AssignmentState, NodeInfo
from headrace.coordinator import state
from headrace.coordinator.control import MoveProgress, NodeControl, move_progress
from headrace.coordinator.reconcile import Decision, LiveNode, Policy, View, reconcile
from headrace.coordinator.status import layout_summary

S = AssignmentState
PCHANNELS = tuple(f"p{i:02d}" for i in range(16))


def live(
    *names: str, frozen: tuple[str, ...] = (), draining: tuple[str, ...] = ()
) -> dict[str, LiveNode]:
    return {
        name: LiveNode(
            NodeInfo(node_id=name, address=f"127.0.0.1:{7000 + i}"),
            frozen=name in frozen or name in draining,
            draining=name in draining,
        )
        for i, name in enumerate(names)
    }


def rec(name: str, st_: S, term: int, node: str = "", target: str = "") -> Assignment:
    return Assignment(pchannel=name, state=st_, term=term, node=node, target=target)


def apply(records: dict[str, Assignment], view: View, *, rebalance: bool = True) -> list[Decision]:
    decisions = reconcile(view, 0.0, Policy(), rebalance=rebalance).decisions
    for decision in decisions:
        state.check_transition(records.get(decision.pchannel), decision.record)
        records[decision.pchannel] = decision.record
    return list(decisions)


def ack_all(records: dict[str, Assignment]) -> None:
    for name, record in list(records.items()):
        if record.state in (S.ASSIGNING, S.UNASSIGNING):
            records[name] = state.acknowledge(record, 0.0)


def counts(records: dict[str, Assignment]) -> Counter[str]:
    return Counter(r.node for r in records.values() if r.state is S.ASSIGNED)


def test_edges() -> None:
    node = NodeInfo(node_id="a", address="127.0.0.1:1")
    first = state.assign("p", None, node, 1.0)
    assert (first.state, first.term, first.node, first.address) == (
        S.ASSIGNING,
        1,
        "a",
        node.address,
    )
    served = state.acknowledge(first, 2.0)
    assert served.state is S.ASSIGNED and served.term == 1
    moving = state.start_move(served, "b", 3.0)
    assert (moving.state, moving.node, moving.target, moving.term) == (S.UNASSIGNING, "a", "b", 1)
    released = state.acknowledge(moving, 4.0)
    assert released.state is S.UNASSIGNED and released.term == 1
    again = state.assign("p", released, NodeInfo(node_id="b", address="x"), 5.0)
    assert again.term == 2 and again.node == "b"
    chain = [first, served, moving, released, again]
    state.check_transition(None, first)
    for before, after in itertools.pairwise(chain):
        state.check_transition(before, after)
    assert state.unavailable("p", again, 6.0).term == 2


def test_invalid_edges_are_refused() -> None:
    served = rec("p", S.ASSIGNED, 3, "a")
    with pytest.raises(errors.InvalidArgument):
        state.start_move(rec("p", S.ASSIGNING, 3, "a"), "b", 0.0)
    with pytest.raises(errors.InvalidArgument):
        state.start_move(served, "a", 0.0)
    with pytest.raises(errors.InvalidArgument, match="term would go back"):
        state.check_transition(served, rec("p", S.ASSIGNED, 2, "a"))
    with pytest.raises(errors.InvalidArgument, match="ASSIGNING needs"):
        state.check_transition(served, rec("p", S.ASSIGNING, 3, "b"))
    with pytest.raises(errors.InvalidArgument, match="cannot follow"):
        state.check_transition(served, rec("p", S.UNASSIGNED, 3))
    with pytest.raises(errors.InvalidArgument, match="keep the node"):
        state.check_transition(rec("p", S.ASSIGNING, 3, "a"), rec("p", S.ASSIGNED, 3, "b"))
    with pytest.raises(errors.InvalidArgument, match="new record"):
        state.check_transition(None, rec("p", S.ASSIGNED, 1, "a"))
    with pytest.raises(errors.InvalidArgument):
        state.acknowledge(served, 0.0)


def test_initial_assignment_is_balanced() -> None:
    records: dict[str, Assignment] = {}
    apply(records, View(PCHANNELS, records, live("a", "b", "c")))
    assert all(r.state is S.ASSIGNING and r.term == 1 for r in records.values())
    assert len(records) == 16
    ack_all(records)
    assert sorted(counts(records).values()) == [5, 5, 6]
    assert apply(records, View(PCHANNELS, records, live("a", "b", "c"))) == []


def test_no_node_means_unavailable_then_assigned_when_one_joins() -> None:
    records: dict[str, Assignment] = {}
    apply(records, View(PCHANNELS[:2], records, {}))
    assert [r.state for r in records.values()] == [S.UNAVAILABLE, S.UNAVAILABLE]
    assert apply(records, View(PCHANNELS[:2], records, {})) == [], "written once"
    apply(records, View(PCHANNELS[:2], records, live("a")))
    assert all(r.state is S.ASSIGNING and r.term == 1 and r.node == "a" for r in records.values())


def test_crash_failover_goes_straight_to_assigning_with_a_higher_term() -> None:
    records = {p: rec(p, S.ASSIGNED, 4, "abc"[i % 3]) for i, p in enumerate(PCHANNELS)}
    lost = {p for p, r in records.items() if r.node == "c"}
    decisions = apply(records, View(PCHANNELS, records, live("a", "b")), rebalance=False)
    assert {d.pchannel for d in decisions} == lost
    for name in lost:
        assert records[name].state is S.ASSIGNING and records[name].term == 5
        assert records[name].node in ("a", "b")
    ack_all(records)
    assert sorted(counts(records).values()) == [8, 8]


def test_records_served_by_an_earlier_session_of_a_restarted_node_fail_over() -> None:
    records = {
        "p00": rec("p00", S.ASSIGNED, 3, "a"),
        "p01": rec("p01", S.ASSIGNED, 3, "a"),
        "p02": rec("p02", S.ASSIGNING, 3, "a"),
    }
    nodes = live("a", "b")
    nodes["a"] = LiveNode(nodes["a"].info, session_revision=50)
    # p00 was acknowledged before node a's current session (rev 50), p01 after.
    revisions = {"p00": 40, "p01": 60, "p02": 45}
    view = View(("p00", "p01", "p02"), records, nodes, record_revisions=revisions)
    decisions = apply(records, view, rebalance=False)
    assert [(d.pchannel, d.record.state, d.record.term) for d in decisions] == [
        ("p00", S.ASSIGNING, 4)
    ]
    assert "restarted" in decisions[0].reason


def test_failover_without_eligible_node_is_unavailable() -> None:
    records = {"p00": rec("p00", S.ASSIGNED, 2, "gone")}
    apply(records, View(("p00",), records, live("f", frozen=("f",))))
    assert records["p00"].state is S.UNAVAILABLE and records["p00"].term == 2
    apply(records, View(("p00",), records, live("f", "g", frozen=("f",))))
    assert records["p00"] == records["p00"].model_copy(
        update={"state": S.ASSIGNING, "term": 3, "node": "g"}
    )


def test_unassigning_of_a_lost_node_goes_to_its_target() -> None:
    records = {"p00": rec("p00", S.UNASSIGNING, 2, "gone", target="b")}
    apply(records, View(("p00",), records, live("a", "b")))
    assert (records["p00"].state, records["p00"].node, records["p00"].term) == (S.ASSIGNING, "b", 3)


def test_stuck_transitions_retry_elsewhere_with_a_higher_term() -> None:
    records = {
        "p00": rec("p00", S.ASSIGNING, 2, "a"),
        "p01": rec("p01", S.UNASSIGNING, 5, "a", target="b"),
        "p02": rec("p02", S.ASSIGNING, 1, "b"),
    }
    young = View(("p00", "p01", "p02"), records, live("a", "b"), ages={"p00": 9.0, "p01": 9.0})
    assert apply(records, young, rebalance=False) == []
    old = View(("p00", "p01", "p02"), records, live("a", "b"), ages={"p00": 10.0, "p01": 30.0})
    apply(records, old, rebalance=False)
    assert (records["p00"].state, records["p00"].node, records["p00"].term) == (S.ASSIGNING, "b", 3)
    assert (records["p01"].state, records["p01"].node, records["p01"].term) == (S.ASSIGNING, "b", 6)
    assert records["p02"].term == 1


def test_graceful_move_request_and_hint() -> None:
    records = {"p00": rec("p00", S.ASSIGNED, 1, "a"), "p01": rec("p01", S.ASSIGNED, 1, "b")}
    nodes = live("a", "b", "c")
    plan = reconcile(
        View(("p00", "p01"), records, nodes, move_requests={"p00": "c"}),
        0.0,
        Policy(),
        rebalance=False,
    )
    assert [
        (d.pchannel, d.record.state, d.record.target, d.request_done) for d in plan.decisions
    ] == [("p00", S.UNASSIGNING, "c", True)]
    # The node released it without keeping the target; the coordinator's hint places it.
    records["p00"] = rec("p00", S.UNASSIGNED, 1)
    apply(records, View(("p00", "p01"), records, nodes, hints={"p00": "c"}), rebalance=False)
    assert (records["p00"].state, records["p00"].node, records["p00"].term) == (S.ASSIGNING, "c", 2)


def test_requests_that_are_done_or_impossible_are_dropped() -> None:
    records = {"p00": rec("p00", S.ASSIGNED, 1, "a"), "p01": rec("p01", S.ASSIGNED, 1, "a")}
    view = View(
        ("p00", "p01"),
        records,
        live("a", "f", frozen=("f",)),
        move_requests={"p00": "a", "p01": "f", "nope": "a"},
    )
    plan = reconcile(view, 0.0, Policy(), rebalance=False)
    assert plan.decisions == ()
    assert sorted(plan.dropped_requests) == ["nope", "p00", "p01"]


def test_drain_proceeds_while_balancing_is_suspended() -> None:
    records = {p: rec(p, S.ASSIGNED, 1, "a") for p in PCHANNELS[:4]}
    nodes = live("a", "b", draining=("a",))
    view = View(PCHANNELS[:4], records, nodes, suspended=True)
    moved = apply(records, view, rebalance=True)
    assert len(moved) == 2, "bounded by max_moves_per_round"
    assert all(d.record.target == "b" for d in moved)
    balanced = View(
        PCHANNELS[:4],
        {p: rec(p, S.ASSIGNED, 1, "a") for p in PCHANNELS[:4]},
        live("a", "b"),
        suspended=True,
    )
    assert reconcile(balanced, 0.0, Policy(), rebalance=True).decisions == ()


actions = st.lists(
    st.tuples(
        st.sampled_from(["ack", "kill", "revive", "freeze", "request", "age", "pass"]),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from(PCHANNELS[:6]),
    ),
    max_size=40,
)


@settings(max_examples=150, deadline=None)
@given(actions)
def test_terms_never_decrease_and_targets_are_eligible(steps: list[tuple[str, str, str]]) -> None:
    """Any interleaving of node acknowledgements, crashes, freezes, requests
    and timeouts: every write is a valid edge, terms never go back, and
    nothing is assigned to a dead or frozen node."""
    names = PCHANNELS[:6]
    records: dict[str, Assignment] = {}
    alive = {"a", "b", "c"}
    frozen: set[str] = set()
    requests: dict[str, str] = {}
    ages: dict[str, float] = {}
    highest: dict[str, int] = {}
    for action, node, pchannel in steps:
        if action == "ack" and pchannel in records and records[pchannel].node in alive:
            if records[pchannel].state in (S.ASSIGNING, S.UNASSIGNING):
                records[pchannel] = state.acknowledge(records[pchannel], 0.0)
        elif action == "kill":
            alive.discard(node)
        elif action == "revive":
            alive.add(node)
        elif action == "freeze":
            frozen ^= {node}
        elif action == "request":
            requests[pchannel] = node
        elif action == "age":
            ages[pchannel] = 60.0
        view = View(
            names,
            dict(records),
            live(*sorted(alive), frozen=tuple(frozen)),
            ages=dict(ages),
            move_requests=dict(requests),
        )
        plan = reconcile(view, 0.0, Policy(), rebalance=action == "pass")
        for decision in plan.decisions:
            state.check_transition(records.get(decision.pchannel), decision.record)
            records[decision.pchannel] = decision.record
            ages.pop(decision.pchannel, None)
            if decision.request_done:
                requests.pop(decision.pchannel, None)
            destination = state.destination(decision.record)
            if destination:
                assert destination in alive and destination not in frozen
        for name in plan.dropped_requests:
            requests.pop(name, None)
        for name, record in records.items():
            assert record.term >= highest.get(name, 0)
            highest[name] = record.term


def test_layout_summary() -> None:
    nodes = [NodeInfo(node_id=n, address=f"127.0.0.1:{i}") for i, n in enumerate("abc")]
    records = [
        rec("p0", S.ASSIGNED, 2, "a"),
        rec("p1", S.ASSIGNED, 1, "a"),
        rec("p2", S.UNASSIGNING, 3, "a", target="b"),
        rec("p3", S.ASSIGNED, 1, "gone"),
        rec("p4", S.UNAVAILABLE, 4),
    ]
    summary = layout_summary(records, nodes, {"c": NodeControl(frozen=True, draining=True)})
    assert [(n.node_id, n.pchannels, n.frozen, n.draining) for n in summary.nodes] == [
        ("a", ("p0", "p1"), False, False),
        ("b", ("p2",), False, False),
        ("c", (), True, True),
    ]
    assert summary.not_ready == ("p2", "p3", "p4")
    assert not summary.ready
    assert summary.balanced  # a=2, b=1; the frozen c does not count
    text = "\n".join(summary.lines())
    assert "p2 UNASSIGNING node=a term=3 -> b" in text
    assert "p3 ASSIGNED node=gone term=1 (node gone)" in text
    assert summary.to_dict()["nodes"][2]["draining"] is True
    healthy = layout_summary([rec("p0", S.ASSIGNED, 1, "a"), rec("p1", S.ASSIGNED, 1, "b")], nodes)
    assert healthy.ready and healthy.balanced
    lopsided = [rec(f"p{i}", S.ASSIGNED, 1, "a") for i in range(3)]
    assert not layout_summary(lopsided, nodes).balanced


def test_move_progress() -> None:
    """Where a requested move stands, from the record and whether the request is pending."""
    P = MoveProgress
    on_a = rec("p0", S.ASSIGNED, 3, "a")
    # Pending: under way until the target holds it under a newer term.
    assert move_progress(on_a, True, "b", 3) is P.UNDER_WAY
    assert move_progress(None, True, "b", 0) is P.UNDER_WAY
    assert move_progress(rec("p0", S.ASSIGNED, 4, "b"), True, "b", 3) is P.DONE
    # The leader consumed the request and started the move: still under way.
    leaving = rec("p0", S.UNASSIGNING, 3, "a", "b")
    assert move_progress(leaving, False, "b", 3) is P.UNDER_WAY
    released = rec("p0", S.UNASSIGNED, 3, "a", "b")
    assert move_progress(released, False, "b", 3) is P.UNDER_WAY
    assert move_progress(rec("p0", S.ASSIGNING, 4, "b"), False, "b", 3) is P.UNDER_WAY
    assert move_progress(rec("p0", S.ASSIGNED, 4, "b"), False, "b", 3) is P.DONE
    # Already there when the request was consumed: done, no new term needed.
    assert move_progress(rec("p0", S.ASSIGNED, 3, "b"), False, "b", 3) is P.DONE
    # Consumed while the pchannel stays put or goes elsewhere: dropped.
    assert move_progress(on_a, False, "b", 3) is P.DROPPED
    assert move_progress(rec("p0", S.ASSIGNING, 4, "c"), False, "b", 3) is P.DROPPED
    elsewhere = rec("p0", S.UNASSIGNING, 3, "a", "c")
    assert move_progress(elsewhere, False, "b", 3) is P.DROPPED
    assert move_progress(None, False, "b", 0) is P.DROPPED

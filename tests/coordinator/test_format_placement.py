"""Version skew in the coordinator: a pchannel never goes to a node that cannot
read its log or write the cluster's message format (assignment, failover,
retries, requested moves, drains and balancing alike)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.cluster import Assignment, AssignmentState, NodeInfo
from headrace.coordinator import state
from headrace.coordinator.reconcile import (
    LiveNode,
    Policy,
    View,
    ineligibility,
    reconcile,
)
from headrace.coordinator.status import layout_summary
from headrace.message.formats import FormatSupport

S = AssignmentState
OLD = FormatSupport.of({1}, {1})
NEW = FormatSupport.of({1, 2}, {1, 2})
READER = FormatSupport.of({1, 2}, {1})
"""A release that reads format 2 but writes only 1 (the step before a new writer)."""


def node(
    name: str, support: FormatSupport, *, frozen: bool = False, draining: bool = False
) -> LiveNode:
    info = NodeInfo(
        node_id=name,
        address=f"{name}:1",
        reads=tuple(sorted(support.reads)),
        writes=tuple(sorted(support.writes)),
    )
    return LiveNode(info, frozen=frozen or draining, draining=draining)


def rec(name: str, st_: S, term: int, owner: str = "", target: str = "") -> Assignment:
    return Assignment(pchannel=name, state=st_, term=term, node=owner, target=target)


def destinations(view: View, *, rebalance: bool = True) -> dict[str, Assignment]:
    return {
        d.pchannel: d.record for d in reconcile(view, 0.0, Policy(), rebalance=rebalance).decisions
    }


def test_ineligibility_names_the_reason() -> None:
    assert ineligibility(node("a", NEW), frozenset({1, 2}), 2) == ""
    assert ineligibility(node("a", NEW, draining=True), frozenset({1}), 1) == "draining"
    assert ineligibility(node("a", NEW, frozen=True), frozenset({1}), 1) == "frozen"
    assert ineligibility(node("b", OLD), frozenset({1, 2}), 1) == (
        "its log holds message format {2}, which a node that reads {1}, writes {1} cannot read"
    )
    assert ineligibility(node("c", READER), frozenset({1, 2}), 2) == (
        "the cluster writes message format 2, which this release cannot write "
        "(reads {1, 2}, writes {1})"
    )
    assert ineligibility(node("c", READER), frozenset({1, 2}), 1) == ""


def test_new_assignments_go_only_to_nodes_that_read_the_log() -> None:
    nodes = {"a": node("a", OLD), "b": node("b", OLD), "c": node("c", NEW)}
    view = View(("p0", "p1", "p2"), {}, nodes, log_formats={"p0": frozenset({1, 2})})
    placed = destinations(view)
    assert placed["p0"].node == "c"
    assert {placed["p1"].node, placed["p2"].node} <= {"a", "b", "c"}


def test_a_cluster_on_format_2_assigns_only_to_writers_of_2() -> None:
    nodes = {"a": node("a", OLD), "b": node("b", READER), "c": node("c", NEW)}
    view = View(("p0", "p1", "p2", "p3"), {}, nodes, cluster_format=2)
    assert {r.node for r in destinations(view).values()} == {"c"}


def test_no_eligible_node_waits_unavailable_with_the_reason_in_status() -> None:
    nodes = {"a": node("a", OLD), "b": node("b", OLD, frozen=True)}
    view = View(("p0",), {}, nodes, log_formats={"p0": frozenset({1, 2})})
    record = destinations(view)["p0"]
    assert record.state is S.UNAVAILABLE
    assert record.reason == (
        "no eligible node: a: its log holds message format {2}, which a node that reads {1}, "
        "writes {1} cannot read; b: frozen"
    )
    # Nothing rewritten while the reason stays; rewritten (same term) when it changes.
    assert destinations(View(("p0",), {"p0": record}, nodes, log_formats=view.log_formats)) == {}
    fewer = View(("p0",), {"p0": record}, {"a": nodes["a"]}, log_formats=view.log_formats)
    again = destinations(fewer)["p0"]
    assert again.state is S.UNAVAILABLE and again.term == record.term
    assert again.reason.startswith("no eligible node: a: its log holds message format {2}")
    state.check_transition(record, again)
    # A node that reads it joins: assigned.
    joined = View(
        ("p0",), {"p0": again}, {**nodes, "c": node("c", NEW)}, log_formats=view.log_formats
    )
    assert destinations(joined)["p0"].node == "c"
    summary = layout_summary([record], [nodes["a"].info])
    assert summary.pchannels[0].reason == record.reason
    assert any("waits: no eligible node" in line for line in summary.lines())


def test_failover_and_handoff_targets_respect_formats() -> None:
    nodes = {"b": node("b", OLD), "c": node("c", NEW)}
    written = {"p0": frozenset({1, 2}), "p1": frozenset({1, 2})}
    records = {
        # owner a is gone: failover must skip b
        "p0": rec("p0", S.ASSIGNED, 3, "a"),
        # a graceful move towards b whose owner died: the target b cannot read it
        "p1": rec("p1", S.UNASSIGNING, 4, "a", target="b"),
    }
    placed = destinations(View(("p0", "p1"), records, nodes, log_formats=written))
    assert placed["p0"].node == "c" and placed["p0"].term == 4
    assert placed["p1"].node == "c" and placed["p1"].term == 5
    only_old = destinations(
        View(("p0",), {"p0": records["p0"]}, {"b": nodes["b"]}, log_formats=written)
    )
    assert only_old["p0"].state is S.UNAVAILABLE


def test_requested_move_to_a_node_that_cannot_read_is_dropped() -> None:
    nodes = {"b": node("b", OLD), "c": node("c", NEW)}
    view = View(
        ("p0",),
        {"p0": rec("p0", S.ASSIGNED, 2, "c")},
        nodes,
        move_requests={"p0": "b"},
        log_formats={"p0": frozenset({1, 2})},
    )
    plan = reconcile(view, 0.0, Policy(), rebalance=False)
    assert plan.decisions == () and plan.dropped_requests == ("p0",)


def test_drain_and_balance_never_target_a_node_that_cannot_read() -> None:
    pchannels = tuple(f"p{i}" for i in range(6))
    written = {name: frozenset({1, 2}) for name in pchannels[:4]}
    records = {name: rec(name, S.ASSIGNED, 1, "c") for name in pchannels}
    nodes = {"a": node("a", OLD), "b": node("b", OLD), "c": node("c", NEW)}
    view = View(pchannels, records, nodes, log_formats=written)
    plan = reconcile(view, 0.0, Policy(max_moves_per_round=10), rebalance=True)
    moved = {d.pchannel: d.record.target for d in plan.decisions}
    assert set(moved) == {"p4", "p5"} and set(moved.values()) == {"a", "b"}
    draining = {**nodes, "c": node("c", NEW, draining=True)}
    plan = reconcile(
        View(pchannels, records, draining, log_formats=written),
        0.0,
        Policy(max_moves_per_round=10),
        rebalance=True,
    )
    assert {d.pchannel for d in plan.decisions} == {"p4", "p5"}


SUPPORTS = [OLD, NEW, READER, FormatSupport.of({2}, {2})]
steps = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "ack",
                "kill",
                "revive",
                "upgrade",
                "freeze",
                "request",
                "age",
                "pass",
                "switch",
                "write",
            ]
        ),
        st.sampled_from(["a", "b", "c", "d"]),
        st.sampled_from([f"p{i}" for i in range(5)]),
        st.sampled_from(SUPPORTS),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(steps)
def test_no_decision_ever_targets_a_node_that_cannot_take_it(
    actions: list[tuple[str, str, str, FormatSupport]],
) -> None:
    """Any interleaving of upgrades (a node comes back with other formats),
    crashes, freezes, requests, timeouts, format switches and logs gaining a
    format: every ASSIGNING or UNASSIGNING the pass writes names a node that
    :func:`ineligibility` accepts for that pchannel, and every UNAVAILABLE
    says why."""
    names = tuple(f"p{i}" for i in range(5))
    records: dict[str, Assignment] = {}
    supports = {"a": OLD, "b": OLD, "c": OLD, "d": NEW}
    alive = {"a", "b", "c"}
    frozen: set[str] = set()
    requests: dict[str, str] = {}
    ages: dict[str, float] = {}
    written: dict[str, frozenset[int]] = {}
    cluster_format = 1
    for action, who, pchannel, support in actions:
        if action == "ack" and pchannel in records and records[pchannel].node in alive:
            if records[pchannel].state in (S.ASSIGNING, S.UNASSIGNING):
                records[pchannel] = state.acknowledge(records[pchannel], 0.0)
        elif action == "kill":
            alive.discard(who)
        elif action == "revive":
            alive.add(who)
        elif action == "upgrade":
            supports[who] = support
            alive.add(who)
        elif action == "freeze":
            frozen ^= {who}
        elif action == "request":
            requests[pchannel] = who
        elif action == "age":
            ages[pchannel] = 60.0
        elif action == "switch":
            cluster_format = max(cluster_format, *support.writes)
        elif action == "write":
            written[pchannel] = written.get(pchannel, frozenset({1})) | {cluster_format}
        nodes = {n: node(n, supports[n], frozen=n in frozen) for n in sorted(alive)}
        view = View(
            names,
            dict(records),
            nodes,
            ages=dict(ages),
            move_requests=dict(requests),
            cluster_format=cluster_format,
            log_formats=dict(written),
        )
        plan = reconcile(view, 0.0, Policy(), rebalance=action == "pass")
        for decision in plan.decisions:
            record = decision.record
            state.check_transition(records.get(decision.pchannel), record)
            records[decision.pchannel] = record
            ages.pop(decision.pchannel, None)
            if decision.request_done:
                requests.pop(decision.pchannel, None)
            log = view.written(decision.pchannel)
            if record.state is S.ASSIGNING:
                assert ineligibility(nodes[record.node], log, cluster_format) == ""
            elif record.state is S.UNASSIGNING:
                assert ineligibility(nodes[record.target], log, cluster_format) == ""
            elif record.state is S.UNAVAILABLE:
                assert record.reason.startswith("no eligible node: ")
        for name in plan.dropped_requests:
            requests.pop(name, None)

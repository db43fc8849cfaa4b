"""One reconcile pass of the coordinator, as a pure function.

:func:`reconcile` takes a :class:`View` of the cluster (records, live nodes,
pending requests, how long each record has been in its state) and returns the
:class:`Plan` of records to write. The coordinator writes each decision with
compare-and-swap on the revision it read, guarded by its leadership; a lost
race simply shows up in the next pass. Per pchannel, in order:

* no record, UNASSIGNED or UNAVAILABLE: ASSIGNING(term + 1) on the requested
  node, else on the move's target (hint), else on the least loaded eligible
  node; UNAVAILABLE when no node is eligible.
* its node's session is gone, or the node registered a new session after it
  acknowledged the record (it restarted and holds nothing): crash failover,
  ASSIGNING(term + 1) on the least loaded node (the backend's term fence stops
  the old owner) or UNAVAILABLE.
* ASSIGNING or UNASSIGNING for longer than the timeout: retried as
  ASSIGNING(term + 1) on another node when there is one.
* ASSIGNED with a pending move request: UNASSIGNING(target).

A node may receive a pchannel only when :func:`ineligibility` finds no reason
against it: not frozen, not draining, able to read every message format
written in the pchannel's log and to write the cluster's format. Assignment,
failover, retries, requested moves and the balancer's targets all go through
it; with no node left, the record says UNAVAILABLE with the reasons.

Then balancer moves (see :mod:`headrace.coordinator.balancer`) start further
UNASSIGNING transitions: the full plan when ``rebalance`` is set and balancing
is not suspended, drain moves only otherwise.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping

from headrace.cluster import ACTIVE_STATES, Assignment, AssignmentState, NodeInfo
from headrace.coordinator import balancer, state
from headrace.message.formats import DEFAULT_FORMAT, placement_refusal

LEGACY_LOG = frozenset({DEFAULT_FORMAT})
"""The formats of a log without a formats record: written before they were recorded."""


@dataclasses.dataclass(frozen=True, slots=True)
class LiveNode:
    """A node whose session key exists, with its effective switches."""

    info: NodeInfo
    frozen: bool = False
    draining: bool = False
    session_revision: int = 0
    """Create revision of the node's session key: a record this node
    acknowledged before it (the node restarted) is no longer served."""
    session_lease: int = 0
    """Lease of the node's session key (0: unknown)."""

    @property
    def eligible(self) -> bool:
        return not self.frozen and not self.draining


@dataclasses.dataclass(frozen=True, slots=True)
class View:
    pchannels: tuple[str, ...]
    assignments: Mapping[str, Assignment]
    nodes: Mapping[str, LiveNode]
    ages: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Seconds each record has been in its current state and term (as observed)."""
    move_requests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """pchannel -> requested target node."""
    hints: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """pchannel -> target of its last graceful move (for UNASSIGNED records)."""
    record_revisions: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """pchannel -> mod revision of its record (compared with node sessions)."""
    lagging: frozenset[str] = frozenset()
    pinned: frozenset[str] = frozenset()
    """pchannels an operator's move request placed (the balancer prefers others)."""
    collections: Mapping[str, frozenset[str]] = dataclasses.field(default_factory=dict)
    suspended: bool = False
    cluster_format: int = DEFAULT_FORMAT
    """The message format nodes write (the cluster's format record)."""
    log_formats: Mapping[str, frozenset[int]] = dataclasses.field(default_factory=dict)
    """pchannel -> formats written in its log (absent: :data:`LEGACY_LOG`)."""

    def written(self, pchannel: str) -> frozenset[int]:
        return self.log_formats.get(pchannel, LEGACY_LOG)


def ineligibility(node: LiveNode, written: frozenset[int], cluster_format: int) -> str:
    """Why ``node`` must not receive a pchannel whose log holds the message
    formats ``written`` in a cluster writing ``cluster_format``; empty when it may."""
    if node.draining:
        return "draining"
    if node.frozen:
        return "frozen"
    return placement_refusal(node.info.formats, written, cluster_format)


def why_unplaceable(view: View, pchannel: str) -> str:
    """Why no live node may receive ``pchannel`` (for the UNAVAILABLE record)."""
    if not view.nodes:
        return "no eligible node: no node is alive"
    written = view.written(pchannel)
    reasons = [
        f"{name}: {ineligibility(view.nodes[name], written, view.cluster_format)}"
        for name in sorted(view.nodes)
    ]
    return "no eligible node: " + "; ".join(reasons)


@dataclasses.dataclass(frozen=True, slots=True)
class Policy:
    assign_timeout: float = 10.0
    unassign_timeout: float = 10.0
    max_moves_per_round: int = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    pchannel: str
    record: Assignment
    reason: str
    request_done: bool = False
    """The pchannel's pending move request is carried out by this write."""


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    decisions: tuple[Decision, ...] = ()
    dropped_requests: tuple[str, ...] = ()
    """pchannels whose move request is already satisfied or cannot be done."""


class _Planner:
    def __init__(self, view: View) -> None:
        self.view = view
        self.records: dict[str, Assignment] = dict(view.assignments)
        self.loads: Counter[str] = Counter({node: 0 for node in view.nodes})
        self.spread: dict[str, Counter[str]] = {node: Counter() for node in view.nodes}
        for name in view.pchannels:
            self._count(name, state.destination(self.records.get(name)), 1)
        self.eligible = sorted(n for n, live in view.nodes.items() if live.eligible)
        self.barred: dict[str, frozenset[str]] = {
            name: frozenset(
                node
                for node, live in view.nodes.items()
                if live.eligible and ineligibility(live, view.written(name), view.cluster_format)
            )
            for name in view.pchannels
        }
        self.decisions: list[Decision] = []
        self.dropped: list[str] = []

    def _count(self, pchannel: str, node: str, sign: int) -> None:
        if node in self.loads:
            self.loads[node] += sign
            for name in self.view.collections.get(pchannel, frozenset()):
                self.spread[node][name] += sign

    def may_take(self, pchannel: str, node: str) -> bool:
        """``node`` may receive ``pchannel`` (:func:`ineligibility` says nothing)."""
        return node in self.eligible and node not in self.barred.get(pchannel, frozenset())

    def pick(self, pchannel: str, prefer: str, exclude: str) -> NodeInfo | None:
        if prefer and prefer != exclude and self.may_take(pchannel, prefer):
            return self.view.nodes[prefer].info
        wanted = self.view.collections.get(pchannel, frozenset())
        takers = [node for node in self.eligible if self.may_take(pchannel, node)]
        others = [node for node in takers if node != exclude]
        chosen = balancer.choose_target(self.loads, others or takers, wanted, self.spread)
        return None if chosen is None else self.view.nodes[chosen].info

    def decide(self, record: Assignment, reason: str, request: str = "") -> None:
        name = record.pchannel
        self._count(name, state.destination(self.records.get(name)), -1)
        self._count(name, state.destination(record), 1)
        self.records[name] = record
        done = bool(request) and request == state.destination(record)
        self.decisions.append(Decision(name, record, reason, request_done=done))

    def place(self, record: Assignment | None, move: _Placing, now: float) -> None:
        """ASSIGNING on a chosen node; UNAVAILABLE if none and ``move`` allows."""
        node = self.pick(move.pchannel, move.prefer, move.exclude)
        if node is not None:
            assigning = state.assign(move.pchannel, record, node, now)
            self.decide(assigning, move.reason, move.request)
        elif move.may_give_up:
            why = why_unplaceable(self.view, move.pchannel)
            if record is None or record.state is not AssignmentState.UNAVAILABLE:
                self.decide(state.unavailable(move.pchannel, record, now, why), why)
            elif record.reason != why:
                self.decide(state.unavailable(move.pchannel, record, record.updated_at, why), why)


@dataclasses.dataclass(frozen=True, slots=True)
class _Placing:
    pchannel: str
    reason: str
    prefer: str = ""
    exclude: str = ""
    request: str = ""
    may_give_up: bool = True
    """Write UNAVAILABLE when no node is eligible (not for a retry: the
    current node may still finish)."""


def _request_for(planner: _Planner, name: str) -> str:
    target = planner.view.move_requests.get(name, "")
    if target and not planner.may_take(name, target):
        planner.dropped.append(name)
        return ""
    return target


def _reconcile_one(planner: _Planner, name: str, now: float, policy: Policy) -> None:
    view = planner.view
    record = view.assignments.get(name)
    request = _request_for(planner, name)
    if record is None or record.state in state.IDLE_STATES:
        hint = "" if record is None else record.target or view.hints.get(name, "")
        placing = _Placing(name, "assign", prefer=request or hint, request=request)
        planner.place(record, placing, now)
        return
    owner = record.node
    if owner not in view.nodes or _restarted(view, record):
        prefer = record.target if record.state is AssignmentState.UNASSIGNING else request
        why = f"failover: {owner} is gone" if owner not in view.nodes else f"{owner} restarted"
        failover = _Placing(name, why, prefer=prefer, exclude=owner, request=request)
        planner.place(record, failover, now)
        return
    age = view.ages.get(name, 0.0)
    if record.state is AssignmentState.ASSIGNING and age >= policy.assign_timeout:
        reason = f"{owner} did not open it"
        retry = _Placing(name, reason, request, exclude=owner, request=request, may_give_up=False)
        planner.place(record, retry, now)
        return
    if record.state is AssignmentState.UNASSIGNING and age >= policy.unassign_timeout:
        reason = f"{owner} did not release it"
        retry = _Placing(
            name, reason, record.target, exclude=owner, request=request, may_give_up=False
        )
        planner.place(record, retry, now)
        return
    if record.state is AssignmentState.ASSIGNED and request:
        if request == owner:
            planner.dropped.append(name)
        else:
            planner.decide(state.start_move(record, request, now), "requested move", request)


def _restarted(view: View, record: Assignment) -> bool:
    """The record was acknowledged by an earlier session of its node: the node
    restarted and does not serve it (ASSIGNING is fine: the node reacts)."""
    if record.state not in (AssignmentState.ASSIGNED, AssignmentState.UNASSIGNING):
        return False
    node = view.nodes[record.node]
    if record.session and node.session_lease and record.session != node.session_lease:
        return True
    revision = view.record_revisions.get(record.pchannel, 0)
    return 0 < revision < node.session_revision


def _placements(planner: _Planner) -> dict[str, balancer.Placement]:
    view = planner.view
    decided = {decision.pchannel for decision in planner.decisions}
    layout: dict[str, balancer.Placement] = {}
    for name in view.pchannels:
        record = planner.records.get(name)
        busy = name in decided or name in view.move_requests or not state.is_stable(record)
        layout[name] = balancer.Placement(
            owner=state.destination(record),
            in_transition=busy and record is not None and record.state in ACTIVE_STATES,
            lagging=name in view.lagging,
            pinned=name in view.pinned,
            collections=view.collections.get(name, frozenset()),
            barred=planner.barred.get(name, frozenset()),
        )
    return layout


def reconcile(view: View, now: float, policy: Policy, *, rebalance: bool) -> Plan:
    """The records to write in this pass (see the module docstring)."""
    planner = _Planner(view)
    for name in view.pchannels:
        _reconcile_one(planner, name, now, policy)
    configured = set(view.pchannels)
    planner.dropped.extend(sorted(name for name in view.move_requests if name not in configured))
    layout = _placements(planner)
    statuses = {
        node: balancer.NodeStatus(frozen=live.frozen, draining=live.draining)
        for node, live in view.nodes.items()
    }
    config = balancer.BalanceConfig(
        max_moves_per_round=policy.max_moves_per_round, suspended=view.suspended
    )
    if rebalance and not view.suspended:
        moves = balancer.plan(layout, statuses, config)
    else:
        moves = balancer.drain_moves(layout, statuses, config)
    for move in moves:
        record = planner.records[move.pchannel]
        planner.decide(state.start_move(record, move.target, now), f"balance to {move.target}")
    return Plan(tuple(planner.decisions), tuple(planner.dropped))

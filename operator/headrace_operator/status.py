"""Status and conditions from observed objects, as pure functions.

The status of a StreamingCluster is rebuilt from observation on every pass
(pods, the metastore snapshot, backend checks, the outcome of the steps); the
previous status only contributes the ``lastTransitionTime`` of conditions whose
status did not change, as the Kubernetes API conventions ask.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from headrace.cluster import Assignment, AssignmentState
from headrace.coordinator import state
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace_operator import builders
from headrace_operator.flushplan import FlushReport
from headrace_operator.models import (
    AssignmentStateName,
    Condition,
    ConditionType,
    FlushStatus,
    NodeStatus,
    PChannelAssignmentStatus,
    StreamingClusterStatus,
)
from headrace_operator.nodeplan import NodeFacts, PodView, holdings


def timestamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_view(cluster: str, pod: Mapping[str, Any]) -> PodView | None:
    """Parse a node pod object; None for pods that are not node pods."""
    meta = pod.get("metadata", {})
    ordinal = builders.ordinal_of(cluster, meta.get("name", ""))
    if ordinal is None:
        return None
    status = pod.get("status") or {}
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    annotations = meta.get("annotations") or {}
    return PodView(
        name=meta["name"],
        ordinal=ordinal,
        phase=status.get("phase") or "Pending",
        ready=ready,
        terminating=bool(meta.get("deletionTimestamp")),
        template_hash=annotations.get(builders.TEMPLATE_HASH, ""),
        draining=annotations.get(builders.DRAINING, ""),
        image=pod_image(pod),
    )


def pod_image(pod: Mapping[str, Any]) -> str:
    """The image of a node pod's container ("" when it names none)."""
    containers = pod.get("spec", {}).get("containers") or [{}]
    return str(containers[0].get("image", ""))


def tally(values: Sequence[str]) -> str:
    """One value when all agree (``0.2.0``), else each with its count
    (``0.1.0 (2), 0.2.0 (1)``); "" for none. Empty values are left out."""
    counts: dict[str, int] = {}
    for value in values:
        if value:
            counts[value] = counts.get(value, 0) + 1
    if len(counts) <= 1:
        return next(iter(counts), "")
    return ", ".join(f"{value} ({count})" for value, count in sorted(counts.items()))


def node_facts(snapshot: ClusterSnapshot) -> NodeFacts:
    live = snapshot.live_nodes()
    frozen = {node for node, info in live.items() if info.frozen}
    frozen |= {node for node, c in snapshot.node_controls.items() if c.frozen or c.draining}
    return NodeFacts(
        holding=holdings(snapshot.assignments.values()),
        live=frozenset(live),
        frozen=frozenset(frozen),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterObservation:
    """Everything one pass saw and did, input of :func:`cluster_status`."""

    cluster: str
    generation: int
    desired_nodes: int
    total_pchannels: int
    paused: bool = False
    spec_error: str = ""
    pods: Sequence[PodView] = ()
    snapshot: ClusterSnapshot | None = None
    """None when the metastore could not be read."""
    leader: str = ""
    backend_problems: Sequence[str] = ()
    failures: Sequence[str] = ()
    """Steps that failed this pass (message each)."""
    progress: Sequence[str] = ()
    """What is under way or awaited (scaling, draining, restarting)."""
    coordinator_error: str = ""
    completed: bool = False
    """Every step ran (so ``observedGeneration`` may advance)."""
    flush: FlushReport | None = None
    """The flush step's report; None when it did not run this pass (the
    previous flush status and ``FlushHealthy`` stay)."""


def _condition(
    kind: ConditionType,
    status: bool,
    *,
    reason: str,
    message: str,
    generation: int,
    previous: Mapping[str, Mapping[str, Any]],
    now: datetime.datetime,
) -> Condition:
    value: Literal["True", "False"] = "True" if status else "False"
    before = previous.get(kind.value, {})
    since = before.get("lastTransitionTime") if before.get("status") == value else None
    return Condition(
        type=kind.value,
        status=value,
        reason=reason,
        message=message[:32768],
        observed_generation=generation,
        last_transition_time=since or timestamp(now),
    )


def _degraded(obs: ClusterObservation) -> tuple[str, str]:
    if obs.spec_error:
        return "InvalidSpec", obs.spec_error
    if obs.backend_problems:
        return "BackendUnreachable", "; ".join(obs.backend_problems)
    if obs.coordinator_error:
        return "CoordinatorFailed", obs.coordinator_error
    if obs.failures:
        return "ReconcileFailed", "; ".join(obs.failures)
    return "", ""


def _assigned(snapshot: ClusterSnapshot | None) -> int:
    if snapshot is None:
        return 0
    live = set(snapshot.nodes)
    return sum(
        1
        for record in snapshot.assignments.values()
        if record.state is AssignmentState.ASSIGNED and record.node in live
    )


def _ready(obs: ClusterObservation, ready_pods: int, assigned: int) -> tuple[bool, str, str]:
    degraded, message = _degraded(obs)
    if degraded:
        return False, degraded, message
    if ready_pods < obs.desired_nodes:
        return False, "NodesNotReady", f"{ready_pods}/{obs.desired_nodes} node pods ready"
    if obs.snapshot is None:
        return False, "MetastoreUnknown", "the metastore has not been read yet"
    if assigned < obs.total_pchannels:
        return (
            False,
            "PChannelsNotAssigned",
            f"{assigned}/{obs.total_pchannels} pchannels assigned to live nodes",
        )
    return True, "AllReady", "every node pod is ready and every pchannel is assigned"


def cluster_status(
    obs: ClusterObservation,
    previous: Mapping[str, Any] | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The new ``status`` of a StreamingCluster (API representation)."""
    previous = previous or {}
    before = {c.get("type", ""): c for c in previous.get("conditions") or []}
    desired_pods = [p for p in obs.pods if p.ordinal < obs.desired_nodes]
    ready_pods = sum(1 for p in desired_pods if p.ready and not p.terminating)
    assigned = _assigned(obs.snapshot)
    facts = node_facts(obs.snapshot) if obs.snapshot is not None else None
    gen = obs.generation

    def cond(kind: ConditionType, status: bool, reason: str, message: str) -> Condition:
        return _condition(
            kind,
            status,
            reason=reason,
            message=message,
            generation=gen,
            previous=before,
            now=now,
        )

    degraded_reason, degraded_message = _degraded(obs)
    ready, ready_reason, ready_message = _ready(obs, ready_pods, assigned)
    progressing = bool(obs.progress)
    conditions = [
        cond(ConditionType.READY, ready, ready_reason, ready_message),
        cond(
            ConditionType.PROGRESSING,
            progressing,
            "Reconciling" if progressing else "Reconciled",
            "; ".join(obs.progress) if progressing else "the cluster matches its spec",
        ),
        cond(
            ConditionType.DEGRADED,
            bool(degraded_reason),
            degraded_reason or "AsExpected",
            degraded_message or "no failure observed",
        ),
        cond(
            ConditionType.PAUSED,
            obs.paused,
            "PausedByAnnotation" if obs.paused else "Reconciling",
            "the streaming.headrace.io/paused annotation is true"
            if obs.paused
            else "reconciliation is active",
        ),
    ]
    flush_status, flush_condition = _flush_part(obs.flush, previous, cond)
    if flush_condition is not None:
        conditions.append(flush_condition)
    registered = {} if obs.snapshot is None else obs.snapshot.nodes
    nodes = [
        NodeStatus(
            node_id=p.name,
            pod=p.name,
            phase="Terminating" if p.terminating else p.phase,
            ready=p.ready,
            pchannels=0 if facts is None else facts.holding.get(p.name, 0),
            draining=bool(p.draining),
            image=p.image,
            version=registered[p.name].version if p.name in registered else "",
        )
        for p in sorted(obs.pods, key=lambda p: p.ordinal)
    ]
    observed = gen if obs.completed else int(previous.get("observedGeneration", 0))
    status = StreamingClusterStatus(
        observed_generation=observed,
        nodes_desired=obs.desired_nodes,
        nodes_ready=ready_pods,
        node_summary=f"{ready_pods}/{obs.desired_nodes}",
        pchannels_total=obs.total_pchannels,
        pchannels_assigned=assigned,
        pchannel_summary=f"{assigned}/{obs.total_pchannels}",
        selector=builders.selector(obs.cluster),
        coordinator=obs.leader,
        running_version=tally([n.version for n in nodes]),
        running_image=tally([n.image for n in nodes if n.phase != "Terminating"]),
        node_statuses=nodes,
        conditions=conditions,
        flush=flush_status,
    )
    return status.to_api()


def _flush_part(
    report: FlushReport | None,
    previous: Mapping[str, Any],
    cond: Callable[[ConditionType, bool, str, str], Condition],
) -> tuple[FlushStatus | None, Condition | None]:
    """The flush status and ``FlushHealthy``: from this pass's report, or as
    the previous status had them when the flush step did not run."""
    if report is None:
        kept = previous.get("flush")
        before = next(
            (
                c
                for c in previous.get("conditions") or []
                if c.get("type") == ConditionType.FLUSH_HEALTHY.value
            ),
            None,
        )
        try:
            return (
                None if kept is None else FlushStatus.model_validate(kept),
                None if before is None else Condition.model_validate(before),
            )
        except ValueError:  # a status written by hand: the next flush step rebuilds it
            return None, None
    if report.status is None:
        return None, None
    healthy = cond(ConditionType.FLUSH_HEALTHY, report.healthy, report.reason, report.message)
    return report.status, healthy


def pchannel_status(
    record: Assignment | None,
    pinned_node: str | None,
    message: str,
    *,
    generation: int,
    before: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The ``status`` of a PChannelAssignment mirroring its metastore record.

    ``before`` (the previous status) carries ``previousNode`` forward: the last
    node seen serving the pchannel before a different one.
    """
    before = before or {}
    previous = str(before.get("previousNode", ""))
    if record is None:
        status = PChannelAssignmentStatus(
            message=message, previous_node=previous, observed_generation=generation
        )
    else:
        old_node = str(before.get("node", ""))
        if old_node and old_node != record.node:
            previous = old_node
        status = PChannelAssignmentStatus(
            node=record.node,
            term=record.term,
            state=AssignmentStateName(record.state.value),
            target=record.target if record.state is AssignmentState.UNASSIGNING else "",
            previous_node=previous,
            pinned=bool(pinned_node) and state.destination(record) == pinned_node,
            message=message,
            observed_generation=generation,
        )
    data = status.to_api()
    data.pop("conditions", None)
    return data


def moved_from(before: Mapping[str, Any], after: Mapping[str, Any]) -> str:
    """The node a pchannel moved away from, when ``after`` is the first
    status showing it served (ASSIGNED) by another node; "" otherwise."""
    if after.get("state") != "ASSIGNED":
        return ""
    settled = before.get("state") == "ASSIGNED" and before.get("node") == after.get("node")
    previous = str(after.get("previousNode", ""))
    if settled or not previous or previous == after.get("node"):
        return ""
    return previous


@dataclasses.dataclass(frozen=True, slots=True)
class PinStep:
    """What to do about ``spec.pinnedNode`` of one pchannel."""

    move: bool
    """Submit a move request to the pinned node now."""
    message: str


def pin_step(pchannel: str, pinned: str | None, snapshot: ClusterSnapshot) -> PinStep:
    """Decide whether a pinned pchannel needs a (graceful) move request."""
    if not pinned:
        return PinStep(False, "")
    record = snapshot.assignments.get(pchannel)
    if record is not None and state.destination(record) == pinned:
        return PinStep(False, f"on its pinned node {pinned}")
    node = snapshot.live_nodes().get(pinned)
    if node is None:
        return PinStep(False, f"pinned node {pinned} is not alive; the pin waits for it")
    if node.frozen:
        return PinStep(False, f"pinned node {pinned} is frozen or draining; the pin waits")
    pending = snapshot.moves.get(pchannel)
    if pending is not None and pending.to == pinned:
        return PinStep(False, f"a move to pinned node {pinned} is pending")
    return PinStep(True, f"moving to pinned node {pinned}")

"""The StreamingCluster reconcile pass: ordered, small, idempotent steps.

Each step reads what it needs, builds the desired objects with the pure
:mod:`.builders`, compares and applies only on change, and records what it saw
in the :class:`Pass`. Every pass ends by rebuilding the status from those
observations (:func:`write_status`), whatever happened before. A step that
fails records the failure (it shows in ``Degraded``) and the pass goes on with
the next step; a step may also end the pass early (paused, invalid spec).

Order: pause check, spec, coordinator connection, node RBAC, ConfigMap and
Services, backend reachability, metastore observation, the shared local-WAL
volume, node pods (create, drain-then-delete, restarts), disruption budget,
PChannelAssignments, status.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from headrace import errors
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef
from headrace_operator.errors import InvalidSpec
from headrace_operator.events import Reason
from headrace_operator.interfaces import BackendProbe, ClusterControl, EventSink, KubeApi
from headrace_operator.models import StreamingClusterSpec
from headrace_operator.nodeplan import Action, ActionKind, DrainReason, PodView, plan_nodes
from headrace_operator.status import (
    ClusterObservation,
    cluster_status,
    moved_from,
    node_facts,
    pchannel_status,
    pin_step,
    pod_view,
)

log = logging.getLogger(__name__)

Connect = Callable[[ClusterRef, StreamingClusterSpec], Awaitable[ClusterControl | None]]


def cluster_ref(body: Mapping[str, Any]) -> ClusterRef:
    meta = body["metadata"]
    return ClusterRef(
        name=meta["name"],
        namespace=meta["namespace"],
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation", 0)),
    )


def is_paused(body: Mapping[str, Any]) -> bool:
    annotations = body.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(models.PAUSED_ANNOTATION, "")).lower() == "true"


@dataclasses.dataclass
class Pass:
    """Inputs and observations of one reconcile pass of one StreamingCluster."""

    body: Mapping[str, Any]
    kube: KubeApi
    events: EventSink
    probe: BackendProbe
    connect: Connect
    now: datetime.datetime
    ref: ClusterRef = dataclasses.field(init=False)
    spec: StreamingClusterSpec | None = None
    control: ClusterControl | None = None
    paused: bool = False
    spec_error: str = ""
    pods: dict[int, PodView] = dataclasses.field(default_factory=dict)
    snapshot: ClusterSnapshot | None = None
    leader: str = ""
    backend_problems: list[str] = dataclasses.field(default_factory=list)
    failures: list[str] = dataclasses.field(default_factory=list)
    progress: list[str] = dataclasses.field(default_factory=list)
    coordinator_error: str = ""
    retry: bool = False
    """A retryable failure happened: run again soon."""
    stopped: bool = False
    completed: bool = False

    def __post_init__(self) -> None:
        self.ref = cluster_ref(self.body)

    @property
    def desired_nodes(self) -> int:
        return 0 if self.spec is None else self.spec.nodes

    def fail(self, step: str, exc: errors.HeadraceError) -> None:
        self.failures.append(f"{step}: {exc.message}")
        self.retry = self.retry or exc.retryable
        log.warning("%s/%s: step %s failed: %s", self.ref.namespace, self.ref.name, step, exc)

    async def event(self, reason: Reason, message: str, *, warning: bool = False) -> None:
        await self.events.emit(self.body, reason.value, message, warning=warning)

    def need_spec(self) -> StreamingClusterSpec:
        if self.spec is None:
            raise errors.InvalidArgument("the spec was not parsed (a step ran out of order)")
        return self.spec


async def ensure(p: Pass, obj: dict[str, Any]) -> bool:
    """Apply ``obj`` (stamped with its digest) if missing or different."""
    desired = builders.stamped(obj)
    meta = desired["metadata"]
    current = await p.kube.get(
        desired["apiVersion"], desired["kind"], meta["namespace"], meta["name"]
    )
    if not builders.needs_apply(desired, current):
        return False
    await p.kube.apply(desired)
    log.info("applied %s %s/%s", desired["kind"], meta["namespace"], meta["name"])
    return True


async def check_paused(p: Pass) -> None:
    if is_paused(p.body):
        p.paused = True
        p.stopped = True


async def parse_spec(p: Pass) -> None:
    try:
        p.spec = models.parse_cluster_spec(p.body.get("spec") or {})
    except InvalidSpec as exc:
        p.spec_error = exc.message
        p.stopped = True


async def connect_coordinator(p: Pass) -> None:
    p.control = await p.connect(p.ref, p.need_spec())
    if p.control is None:
        p.progress.append("connecting to the metastore")


async def apply_cluster_objects(p: Pass) -> None:
    for obj in builders.cluster_objects(p.ref, p.need_spec()):
        await ensure(p, obj)


async def check_backends(p: Pass) -> None:
    p.backend_problems.extend(await p.probe.check(p.need_spec()))


async def observe_metastore(p: Pass) -> None:
    if p.control is None:
        return
    problem = p.control.coordinator_error()
    try:
        p.snapshot = await p.control.snapshot()
        p.leader = await p.control.leader()
    except errors.Unavailable as exc:
        p.backend_problems.append(f"metastore: {exc.message}")
        p.retry = True
        return
    p.coordinator_error = problem
    if p.snapshot.config is None:
        p.progress.append("waiting for the coordinator to store the cluster config")


async def apply_volume(p: Pass) -> None:
    """The one local-WAL volume all node pods share (see :func:`.builders.pvc`);
    scaling never touches it."""
    spec = p.need_spec()
    if spec.wal.backend == "local":
        await ensure(p, builders.pvc(p.ref, spec))


async def _list_pods(p: Pass) -> dict[int, PodView]:
    labels = builders.selector_labels(p.ref.name)
    pods = await p.kube.list("v1", "Pod", p.ref.namespace, labels)
    views = (pod_view(p.ref.name, pod) for pod in pods)
    return {view.ordinal: view for view in views if view is not None}


async def reconcile_pods(p: Pass) -> None:
    spec = p.need_spec()
    p.pods = await _list_pods(p)
    facts = node_facts(p.snapshot) if p.snapshot is not None else None
    hashes = {i: builders.template_hash(p.ref, spec, i) for i in range(spec.nodes)}
    plan = plan_nodes(p.ref.name, spec.nodes, hashes, p.pods, facts)
    p.progress.extend(plan.waiting)
    for action in plan.actions:
        await _carry_out(p, spec, action)
    starting = sorted(
        view.name
        for view in p.pods.values()
        if view.ordinal < spec.nodes and not view.ready and not view.terminating
    )
    if starting:
        p.progress.append(f"waiting for node pods to become ready: {', '.join(starting)}")


async def _set_draining(p: Pass, pod: str, value: str | None) -> None:
    patch = {"metadata": {"annotations": {builders.DRAINING: value}}}
    await p.kube.patch_merge("v1", "Pod", p.ref.namespace, pod, patch)


async def _delete_pod(p: Pass, pod: str) -> None:
    await p.kube.delete("v1", "Pod", p.ref.namespace, pod)


async def _carry_out(p: Pass, spec: StreamingClusterSpec, action: Action) -> None:
    node, kind = action.node, action.kind
    needs_control = kind in (ActionKind.START_DRAIN, ActionKind.CANCEL_DRAIN, ActionKind.UNFREEZE)
    if needs_control and p.control is None:
        p.progress.append(f"{kind.value} of {node} waits for the metastore connection")
        return
    if kind is ActionKind.CREATE:
        await p.kube.apply(builders.node_pod(p.ref, spec, action.ordinal))
        p.progress.append(f"creating pod {node}")
        await p.event(Reason.NODE_POD_CREATED, f"created node pod {node}")
    elif kind is ActionKind.DELETE_TERMINATED:
        await _delete_pod(p, node)
        p.progress.append(f"recreating pod {node}")
        await p.event(
            Reason.NODE_POD_RESTARTED,
            f"node pod {node} ended (phase {action.reason}); it is recreated",
            warning=True,
        )
    elif kind is ActionKind.START_DRAIN:
        assert p.control is not None
        await p.control.drain(node)
        await _set_draining(p, node, action.reason)
        p.progress.append(f"draining {node} ({action.reason})")
        await p.event(
            Reason.NODE_DRAIN_STARTED, f"draining node {node} before its pod goes ({action.reason})"
        )
    elif kind is ActionKind.DELETE_DRAINED:
        await _delete_pod(p, node)
        p.progress.append(f"deleting drained pod {node}")
        await p.event(Reason.NODE_DRAINED, f"node {node} holds no pchannel; deleting its pod")
        if action.reason == DrainReason.RESTART:
            await p.event(Reason.NODE_RESTARTING, f"restarting node {node} with its new template")
        else:
            await p.event(Reason.NODE_POD_DELETED, f"deleted node pod {node} (scale-down)")
    elif kind is ActionKind.REPLACE_IDLE:
        await _delete_pod(p, node)
        p.progress.append(f"replacing pod {node}")
        await p.event(
            Reason.NODE_RESTARTING, f"restarting node {node}: template changed, holds no pchannel"
        )
    elif kind is ActionKind.CANCEL_DRAIN:
        assert p.control is not None
        await p.control.undrain(node)
        await _set_draining(p, node, None)
        await p.event(Reason.NODE_DRAIN_CANCELLED, f"node {node} is desired again; drain cancelled")
    else:
        assert p.control is not None
        await p.control.undrain(node)
        await p.event(Reason.NODE_UNFROZEN, f"node {node} was recreated; unfrozen")


async def apply_disruption_budget(p: Pass) -> None:
    budget = builders.pod_disruption_budget(p.ref, p.need_spec())
    if budget is not None:
        await ensure(p, budget)
    else:
        await p.kube.delete(
            "policy/v1", "PodDisruptionBudget", p.ref.namespace, f"{p.ref.name}-nodes"
        )


def observation(p: Pass) -> ClusterObservation:
    spec = p.spec
    return ClusterObservation(
        cluster=p.ref.name,
        generation=p.ref.generation,
        desired_nodes=p.desired_nodes,
        total_pchannels=0 if spec is None else spec.pchannels,
        paused=p.paused,
        spec_error=p.spec_error,
        pods=tuple(p.pods.values()),
        snapshot=p.snapshot,
        leader=p.leader,
        backend_problems=tuple(p.backend_problems),
        failures=tuple(p.failures),
        progress=tuple(p.progress),
        coordinator_error=p.coordinator_error,
        completed=p.completed,
    )


def _conditions(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (status or {}).get("conditions") or []}


async def _transition_events(p: Pass, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
    """Events for changes of the pause and degraded conditions."""
    old, new = _conditions(before), _conditions(after)
    was_paused = old.get("ReconciliationPaused", {}).get("status") == "True"
    if p.paused and not was_paused:
        await p.event(Reason.RECONCILIATION_PAUSED, "reconciliation paused by annotation")
    elif was_paused and not p.paused:
        await p.event(Reason.RECONCILIATION_RESUMED, "reconciliation resumed")
    degraded_old, degraded_new = old.get("Degraded", {}), new.get("Degraded", {})
    if degraded_new.get("status") == "True":
        key = (degraded_new.get("reason"), degraded_new.get("message"))
        if degraded_old.get("status") != "True" or key != (
            degraded_old.get("reason"),
            degraded_old.get("message"),
        ):
            reason = Reason(degraded_new.get("reason", Reason.RECONCILE_FAILED.value))
            await p.event(reason, str(degraded_new.get("message", "")), warning=True)
    elif degraded_old.get("status") == "True":
        await p.event(Reason.RECOVERED, f"recovered from {degraded_old.get('reason')}")


async def write_status(p: Pass) -> dict[str, Any]:
    """Rebuild the status from this pass's observations; patch if changed."""
    previous = p.body.get("status") or {}
    status = cluster_status(observation(p), previous, p.now)
    if p.paused:
        status = paused_status(previous, status)
    if status != previous:
        patch = {"status": status}
        await p.kube.patch_merge(
            models.API_VERSION,
            "StreamingCluster",
            p.ref.namespace,
            p.ref.name,
            patch,
            subresource="status",
        )
    await _transition_events(p, previous, status)
    return status


def paused_status(previous: Mapping[str, Any], fresh: Mapping[str, Any]) -> dict[str, Any]:
    """While paused a pass observes nothing, so the last observed status stays;
    only the ReconciliationPaused condition comes from this pass (pure)."""
    paused = [c for c in fresh.get("conditions", []) if c.get("type") == "ReconciliationPaused"]
    kept = [c for c in previous.get("conditions", []) if c.get("type") != "ReconciliationPaused"]
    return {**previous, "conditions": kept + paused}


def _assignment_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


async def sync_pchannels(p: Pass) -> None:
    """One PChannelAssignment per pchannel, its status mirroring the metastore
    record; a ``spec.pinnedNode`` that differs from the placement becomes a
    move request (a fenced graceful handoff carried out by the coordinator)."""
    spec = p.need_spec()
    if p.snapshot is None:
        p.progress.append("PChannelAssignments wait for the metastore")
        return
    labels = {builders.LABEL_CLUSTER: p.ref.name, builders.LABEL_COMPONENT: "pchannel"}
    existing = {
        obj["metadata"]["name"]: obj
        for obj in await p.kube.list(
            models.API_VERSION, "PChannelAssignment", p.ref.namespace, labels
        )
    }
    wanted = {builders.assignment_name(p.ref.name, name): name for name in spec.pchannel_names}
    for name in sorted(set(existing) - set(wanted)):
        await p.kube.delete(models.API_VERSION, "PChannelAssignment", p.ref.namespace, name)
    for obj_name, pchannel in wanted.items():
        obj = existing.get(obj_name)
        if obj is None:
            obj = await p.kube.apply(builders.pchannel_assignment(p.ref, pchannel))
        await _sync_one(p, obj, pchannel)


async def _sync_one(p: Pass, obj: Mapping[str, Any], pchannel: str) -> None:
    assert p.snapshot is not None
    meta = obj["metadata"]
    pinned = (obj.get("spec") or {}).get("pinnedNode") or None
    decision = pin_step(pchannel, pinned, p.snapshot)
    message = decision.message
    if decision.move and p.control is not None:
        try:
            await p.control.move(pchannel, str(pinned))
        except errors.InvalidArgument as exc:
            message = f"cannot move to pinned node {pinned}: {exc.message}"
            await p.events.emit(obj, Reason.PCHANNEL_PIN_FAILED.value, message, warning=True)
        else:
            await p.events.emit(
                obj, Reason.PCHANNEL_MOVE_REQUESTED.value, f"{pchannel}: {decision.message}"
            )
    record = p.snapshot.assignments.get(pchannel)
    if record is None:
        message = message or "not assigned yet"
    before = _assignment_status(obj)
    status = pchannel_status(
        record, pinned, message, generation=int(meta.get("generation", 0)), before=before
    )
    if status == before:
        return
    await p.kube.patch_merge(
        models.API_VERSION,
        "PChannelAssignment",
        p.ref.namespace,
        meta["name"],
        {"status": status},
        subresource="status",
    )
    origin = moved_from(before, status)
    if origin:
        await p.event(
            Reason.PCHANNEL_MOVED,
            f"{pchannel} moved from {origin} to {status['node']} (term {status['term']})",
        )


Step = Callable[[Pass], Awaitable[None]]

STEPS: Sequence[tuple[str, Step]] = (
    ("pause", check_paused),
    ("spec", parse_spec),
    ("coordinator", connect_coordinator),
    ("cluster-objects", apply_cluster_objects),
    ("backends", check_backends),
    ("metastore", observe_metastore),
    ("volume", apply_volume),
    ("pods", reconcile_pods),
    ("disruption-budget", apply_disruption_budget),
    ("pchannels", sync_pchannels),
)


async def run_pass(p: Pass, steps: Sequence[tuple[str, Step]] = STEPS) -> dict[str, Any]:
    """Run the steps in order, then write the status; the new status."""
    for name, step in steps:
        if p.stopped:
            break
        try:
            await step(p)
        except errors.HeadraceError as exc:
            p.fail(name, exc)
    p.completed = not p.stopped and not p.failures
    return await write_status(p)

"""The StreamingCluster reconcile pass: ordered, small, idempotent steps.

Each step reads what it needs, builds the desired objects with the pure
:mod:`.builders`, applies only on change, and returns a
:class:`~.results.StepResult`: done, waiting on something, failed (why, and
whether a retry can help), or halting the pass. :func:`run_pass` runs the steps
in order and combines their results into a :class:`~.results.PassResult`: a
halt ends the pass, a failure is kept (it shows in ``Degraded``) and the pass
goes on, and the first result that is not done decides what the handler does
next. The :class:`Pass` carries only the inputs and the data later steps need
(the parsed spec, the metastore connection and snapshot, the pods), never
flags. Every pass that is not a standby's ends by rebuilding the status
(:func:`write_status`).

The coordinator is not started here: the handlers start it whenever the
operator learns of a cluster, paused or not (:mod:`.coordinator_runner`); a
pass only uses its connection.

Order: pause gate, spec, coordinator connection, metastore observation,
standby gate (another operator replica's coordinator leads the cluster), node
RBAC, ConfigMap and Services, backend reachability, the shared local-WAL
volume, node pods (create, drain-then-delete, restarts), disruption budget,
PChannelAssignments, flush and compaction runs (:mod:`.flush_steps`); then the
status.
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
from headrace_operator.flush_steps import reconcile_flush
from headrace_operator.flushplan import FlushReport
from headrace_operator.interfaces import BackendProbe, ClusterControl, EventSink, KubeApi
from headrace_operator.models import StreamingClusterSpec
from headrace_operator.nodeplan import Action, ActionKind, DrainReason, PodView, plan_nodes
from headrace_operator.offline_steps import release_orphan
from headrace_operator.results import (
    DONE,
    FailureKind,
    Halt,
    PassResult,
    StepResult,
    combine,
    failed,
    halted,
    waiting_on,
)
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


def paused_reason(body: Mapping[str, Any]) -> str:
    """Why reconciliation of the cluster is held ("" when it is not)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    if str(annotations.get(models.PAUSED_ANNOTATION, "")).lower() == "true":
        return f"the {models.PAUSED_ANNOTATION} annotation is true"
    return ""


def standby_reason(leader: str, candidate: str) -> str:
    """Why this operator replica leaves the cluster to another ("" when it
    reconciles): the coordinator of another replica leads the cluster, and the
    replica whose coordinator leads is the one that changes its objects."""
    if leader and candidate and leader != candidate:
        return f"coordinator {leader} leads; this replica ({candidate}) stands by"
    return ""


@dataclasses.dataclass
class Pass:
    """Inputs of one reconcile pass of one StreamingCluster, and the data its
    steps hand on to later steps."""

    body: Mapping[str, Any]
    kube: KubeApi
    events: EventSink
    probe: BackendProbe
    connect: Connect
    now: datetime.datetime
    ref: ClusterRef = dataclasses.field(init=False)
    spec: StreamingClusterSpec | None = None
    targets: Mapping[str, builders.NodeTarget] = dataclasses.field(default_factory=dict)
    """Node name -> the image an UpgradePlan set for it (:data:`.builders.NODE_IMAGES`)."""
    max_unavailable: int = 1
    """Node pods the restarts may take down at once (:data:`.builders.MAX_UNAVAILABLE`)."""
    offline: bool = False
    """An Offline UpgradePlan runs (:data:`.builders.OFFLINE_UPGRADE`)."""
    control: ClusterControl | None = None
    pods: dict[int, PodView] = dataclasses.field(default_factory=dict)
    snapshot: ClusterSnapshot | None = None
    leader: str = ""
    flush: FlushReport | None = None
    """The flush runs' status and health (None: the flush step did not run)."""

    def __post_init__(self) -> None:
        self.ref = cluster_ref(self.body)

    @property
    def desired_nodes(self) -> int:
        return 0 if self.spec is None else self.spec.nodes

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


async def check_paused(p: Pass) -> StepResult:
    reason = paused_reason(p.body)
    return halted(Halt.PAUSED, reason) if reason else DONE


async def parse_spec(p: Pass) -> StepResult:
    try:
        p.spec = models.parse_cluster_spec(p.body.get("spec") or {})
        p.targets = builders.node_targets(p.body)
        p.max_unavailable = builders.max_unavailable(p.body)
        p.offline = bool(builders.offline_upgrade(p.body))
    except InvalidSpec as exc:
        return halted(Halt.INVALID_SPEC, exc.message)
    return DONE


async def connect_coordinator(p: Pass) -> StepResult:
    p.control = await p.connect(p.ref, p.need_spec())
    return DONE if p.control is not None else waiting_on("connecting to the metastore")


async def observe_metastore(p: Pass) -> StepResult:
    if p.control is None:
        return DONE
    problem = p.control.coordinator_error()
    try:
        p.snapshot = await p.control.snapshot()
        p.leader = await p.control.leader()
    except errors.Unavailable as exc:
        return failed(f"metastore: {exc.message}", retryable=True, kind=FailureKind.BACKEND)
    results = []
    if problem:
        results.append(failed(problem, retryable=False, kind=FailureKind.COORDINATOR))
    if p.snapshot.config is None:
        results.append(waiting_on("waiting for the coordinator to store the cluster config"))
    return combine(results)


async def check_standby(p: Pass) -> StepResult:
    if p.control is None:
        return DONE
    reason = standby_reason(p.leader, p.control.candidate_id())
    return halted(Halt.STANDBY, reason) if reason else DONE


async def release_offline_upgrade(p: Pass) -> StepResult:
    """An Offline plan deleted or ended mid-way leaves no stop behind
    (:func:`.offline_steps.release_orphan`)."""
    if p.control is None or not p.offline:
        return DONE
    if await release_orphan(p.kube, p.events, p.control, p.body):
        p.offline = False
    return DONE


async def apply_cluster_objects(p: Pass) -> StepResult:
    for obj in builders.cluster_objects(p.ref, p.need_spec()):
        await ensure(p, obj)
    return DONE


async def check_backends(p: Pass) -> StepResult:
    problems = await p.probe.check(p.need_spec())
    return combine(
        [failed(problem, retryable=True, kind=FailureKind.BACKEND) for problem in problems]
    )


async def apply_volume(p: Pass) -> StepResult:
    """The one local-WAL volume all node pods share (see :func:`.builders.pvc`);
    scaling never touches it."""
    spec = p.need_spec()
    if spec.wal.backend == "local":
        await ensure(p, builders.pvc(p.ref, spec))
    return DONE


async def _list_pods(p: Pass) -> dict[int, PodView]:
    labels = builders.selector_labels(p.ref.name)
    pods = await p.kube.list("v1", "Pod", p.ref.namespace, labels)
    views = (pod_view(p.ref.name, pod) for pod in pods)
    return {view.ordinal: view for view in views if view is not None}


async def reconcile_pods(p: Pass) -> StepResult:
    spec = p.need_spec()
    p.pods = await _list_pods(p)
    facts = node_facts(p.snapshot) if p.snapshot is not None else None
    hashes = {
        i: builders.template_hash(p.ref, builders.node_spec(p.ref, spec, p.targets, i), i)
        for i in range(spec.nodes)
    }
    plan = plan_nodes(
        p.ref.name,
        spec.nodes,
        hashes,
        p.pods,
        facts,
        max_unavailable=p.max_unavailable,
        offline=p.offline,
    )
    results = [waiting_on(*plan.waiting)]
    for action in plan.actions:
        results.append(await _carry_out(p, spec, action))
    starting = sorted(
        view.name
        for view in p.pods.values()
        if view.ordinal < spec.nodes and not view.ready and not view.terminating
    )
    if starting:
        results.append(waiting_on(f"waiting for node pods to become ready: {', '.join(starting)}"))
    return combine(results)


def control_gate(kind: ActionKind, connected: bool) -> str:
    """Why a node action cannot be carried out now ("" when it can): drains,
    their cancellation and unfreezing are requests through the metastore."""
    needs_control = kind in (ActionKind.START_DRAIN, ActionKind.CANCEL_DRAIN, ActionKind.UNFREEZE)
    if needs_control and not connected:
        return f"{kind.value} waits for the metastore connection"
    return ""


async def _set_draining(p: Pass, pod: str, value: str | None) -> None:
    patch = {"metadata": {"annotations": {builders.DRAINING: value}}}
    await p.kube.patch_merge("v1", "Pod", p.ref.namespace, pod, patch)


async def _delete_pod(p: Pass, pod: str) -> None:
    await p.kube.delete("v1", "Pod", p.ref.namespace, pod)


async def _carry_out(p: Pass, spec: StreamingClusterSpec, action: Action) -> StepResult:
    node, kind = action.node, action.kind
    gate = control_gate(kind, p.control is not None)
    if gate:
        return waiting_on(f"{node}: {gate}")
    if p.control is not None and kind in (
        ActionKind.START_DRAIN,
        ActionKind.CANCEL_DRAIN,
        ActionKind.UNFREEZE,
    ):
        return await _request(p, p.control, action)
    if kind is ActionKind.CREATE:
        node_spec = builders.node_spec(p.ref, spec, p.targets, action.ordinal)
        await p.kube.apply(builders.node_pod(p.ref, node_spec, action.ordinal))
        await p.event(Reason.NODE_POD_CREATED, f"created node pod {node}")
        return waiting_on(f"creating pod {node}")
    await _delete_pod(p, node)
    if kind is ActionKind.DELETE_TERMINATED:
        await p.event(
            Reason.NODE_POD_RESTARTED,
            f"node pod {node} ended (phase {action.reason}); it is recreated",
            warning=True,
        )
        return waiting_on(f"recreating pod {node}")
    if kind is ActionKind.DELETE_DRAINED:
        await p.event(Reason.NODE_DRAINED, f"node {node} holds no pchannel; deleting its pod")
        if action.reason == DrainReason.RESTART:
            await p.event(Reason.NODE_RESTARTING, f"restarting node {node} with its new template")
        else:
            await p.event(Reason.NODE_POD_DELETED, f"deleted node pod {node} (scale-down)")
        return waiting_on(f"deleting drained pod {node}")
    if kind is ActionKind.STOP_OFFLINE:
        await p.event(
            Reason.NODE_RESTARTING,
            f"stopping node {node} for an offline upgrade (writes stopped, every node restarts)",
        )
        return waiting_on(f"replacing pod {node} (offline upgrade)")
    await p.event(
        Reason.NODE_RESTARTING, f"restarting node {node}: template changed, holds no pchannel"
    )
    return waiting_on(f"replacing pod {node}")


async def _request(p: Pass, control: ClusterControl, action: Action) -> StepResult:
    """A node action that is a request to the coordinator through the metastore."""
    node = action.node
    if action.kind is ActionKind.START_DRAIN:
        await control.drain(node)
        await _set_draining(p, node, action.reason)
        await p.event(
            Reason.NODE_DRAIN_STARTED, f"draining node {node} before its pod goes ({action.reason})"
        )
        return waiting_on(f"draining {node} ({action.reason})")
    await control.undrain(node)
    if action.kind is ActionKind.CANCEL_DRAIN:
        await _set_draining(p, node, None)
        await p.event(Reason.NODE_DRAIN_CANCELLED, f"node {node} is desired again; drain cancelled")
    else:
        await p.event(Reason.NODE_UNFROZEN, f"node {node} was recreated; unfrozen")
    return DONE


async def apply_disruption_budget(p: Pass) -> StepResult:
    budget = builders.pod_disruption_budget(p.ref, p.need_spec())
    if budget is not None:
        await ensure(p, budget)
    else:
        name = builders.disruption_budget_name(p.ref.name)
        await p.kube.delete("policy/v1", "PodDisruptionBudget", p.ref.namespace, name)
    return DONE


def observation(p: Pass, result: PassResult) -> ClusterObservation:
    spec = p.spec
    return ClusterObservation(
        cluster=p.ref.name,
        generation=p.ref.generation,
        desired_nodes=p.desired_nodes,
        total_pchannels=0 if spec is None else spec.pchannels,
        paused=result.paused,
        spec_error=result.halt_reason if result.halt is Halt.INVALID_SPEC else "",
        pods=tuple(p.pods.values()),
        snapshot=p.snapshot,
        leader=p.leader,
        backend_problems=result.failures_of(FailureKind.BACKEND),
        failures=result.failures,
        progress=result.waiting,
        coordinator_error="; ".join(result.failures_of(FailureKind.COORDINATOR)),
        completed=result.completed,
        flush=p.flush,
    )


def _conditions(status: Mapping[str, Any] | None) -> dict[str, Mapping[str, Any]]:
    return {c.get("type", ""): c for c in (status or {}).get("conditions") or []}


async def _transition_events(
    p: Pass, paused: bool, before: Mapping[str, Any], after: Mapping[str, Any]
) -> None:
    """Events for changes of the pause and degraded conditions."""
    old, new = _conditions(before), _conditions(after)
    was_paused = old.get("ReconciliationPaused", {}).get("status") == "True"
    if paused and not was_paused:
        await p.event(Reason.RECONCILIATION_PAUSED, "reconciliation paused by annotation")
    elif was_paused and not paused:
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


async def write_status(p: Pass, result: PassResult) -> dict[str, Any]:
    """Rebuild the status from this pass's observations and step results;
    patch if changed."""
    previous = p.body.get("status") or {}
    status = cluster_status(observation(p, result), previous, p.now)
    if result.paused:
        status = paused_status(previous, status)
    if status != previous:
        # A merge patch keeps what it does not name: a part that went (the
        # flush status of a cluster whose flush section was removed) is nulled.
        gone = {key: None for key in previous if key not in status}
        patch = {"status": {**gone, **status}}
        await p.kube.patch_merge(
            models.API_VERSION,
            "StreamingCluster",
            p.ref.namespace,
            p.ref.name,
            patch,
            subresource="status",
        )
    await _transition_events(p, result.paused, previous, status)
    return status


def paused_status(previous: Mapping[str, Any], fresh: Mapping[str, Any]) -> dict[str, Any]:
    """While paused a pass observes nothing, so the last observed status stays;
    only the ReconciliationPaused condition comes from this pass (pure)."""
    paused = [c for c in fresh.get("conditions", []) if c.get("type") == "ReconciliationPaused"]
    kept = [c for c in previous.get("conditions", []) if c.get("type") != "ReconciliationPaused"]
    return {**previous, "conditions": kept + paused}


def _assignment_status(obj: Mapping[str, Any]) -> dict[str, Any]:
    return dict(obj.get("status") or {})


async def sync_pchannels(p: Pass) -> StepResult:
    """One PChannelAssignment per pchannel, its status mirroring the metastore
    record; a ``spec.pinnedNode`` that differs from the placement becomes a
    move request (a fenced graceful handoff carried out by the coordinator)."""
    spec = p.need_spec()
    if p.snapshot is None:
        return waiting_on("PChannelAssignments wait for the metastore")
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
    return DONE


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


Step = Callable[[Pass], Awaitable[StepResult]]

STEPS: Sequence[tuple[str, Step]] = (
    ("pause", check_paused),
    ("spec", parse_spec),
    ("coordinator", connect_coordinator),
    ("metastore", observe_metastore),
    ("standby", check_standby),
    ("offline-upgrade", release_offline_upgrade),
    ("cluster-objects", apply_cluster_objects),
    ("backends", check_backends),
    ("volume", apply_volume),
    ("pods", reconcile_pods),
    ("disruption-budget", apply_disruption_budget),
    ("pchannels", sync_pchannels),
    ("flush", reconcile_flush),
)


async def run_pass(p: Pass, steps: Sequence[tuple[str, Step]] = STEPS) -> PassResult:
    """Run the steps in order until one halts the pass, then write the status
    (a standby writes nothing)."""
    results: list[tuple[str, StepResult]] = []
    for name, step in steps:
        try:
            result = await step(p)
        except errors.HeadraceError as exc:
            log.warning("%s/%s: step %s failed: %s", p.ref.namespace, p.ref.name, name, exc)
            result = failed(exc.message, retryable=exc.retryable)
        results.append((name, result))
        if result.halt is not None:
            break
    outcome = PassResult(tuple(results))
    if outcome.halt is Halt.STANDBY:
        return outcome
    return dataclasses.replace(outcome, status=await write_status(p, outcome))

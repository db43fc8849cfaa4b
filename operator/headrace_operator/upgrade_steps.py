"""The UpgradePlan pass: ordered, idempotent steps, the status rebuilt each pass.

Same shape as :mod:`.steps`: each step returns a :class:`~.results.StepResult`
and :func:`run_upgrade_pass` writes the status at the end of every pass.

A Rolling plan changes one thing: the :data:`.builders.NODE_IMAGES` annotation
of its StreamingCluster (with :data:`.builders.MAX_UNAVAILABLE` beside it),
which tells the cluster's own pass to build the named nodes from the target
image and version, restarting up to ``maxUnavailable`` of them at once. The
cluster pass restarts each such node the way it restarts any node whose
template changed: it freezes the node in the balancer and drains it by fenced
graceful handoff, deletes its pod once it holds no pchannel, recreates it and
unfreezes it (:mod:`.nodeplan`). The plan decides which nodes go next, only
when its gates allow it, waits for them to be Ready, registered with the
target version and soaked on the target image, and finally writes the target
image and version into the cluster's spec and removes the annotations.
Everything it needs to resume after an operator restart is in the
annotations, the pods and its status: a node already on the target image is
never restarted again.

An Offline plan (the upgrade with downtime) goes another way from the
progress step on: :mod:`.offline_steps` stops writes cluster-wide, waits for
in-flight appends, freezes the nodes, restarts all of them at once on the
target and resumes writes (see :mod:`.offline`).

Order: spec, finished gate, cluster, one active plan per cluster, target (the
plan's image, or with ``rollback`` the cluster's), observation (pods and
metastore, the write stop), message formats (what the release the plan started
from reads; a rollback to it is Blocked once the cluster writes a format it
cannot read), plan (a dry run stops here), pause gate, progress (finish, wait,
or start the next nodes after the safety gates; a node not on the target that
is not Ready and holds nothing goes first, which is how a rollback gets past an
image that never becomes Ready).

Finishing takes two passes when the target release writes a newer message
format than the cluster's: once every node runs the target, the plan switches
the cluster's format version in the metastore (the last step, recorded in
``status.formats``), then writes the target into the cluster's spec. Until
that switch no node writes the new format, so a rollback is always possible
before it.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Literal

from headrace import errors
from headrace.cluster import AssignmentState
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace.coordinator.writestop import StopState
from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef, NodeTarget
from headrace_operator.errors import InvalidSpec
from headrace_operator.events import Reason
from headrace_operator.interfaces import ClusterControl, EventSink, KubeApi
from headrace_operator.models import (
    Condition,
    NodeProgress,
    PlannedStep,
    StreamingClusterSpec,
    UpgradeConditionType,
    UpgradeFlush,
    UpgradeFormats,
    UpgradeMode,
    UpgradePhase,
    UpgradePlanSpec,
)
from headrace_operator.nodeplan import holdings
from headrace_operator.offline_flush import previous_record
from headrace_operator.offline_steps import advance_offline, plan_id
from headrace_operator.results import (
    DONE,
    FailureKind,
    Halt,
    PassResult,
    StepResult,
    failed,
    halted,
    waiting_on,
)
from headrace_operator.status import pod_image, timestamp
from headrace_operator.steps import Connect
from headrace_operator.upgradeplan import (
    ClusterView,
    NodeStep,
    UpgradeNode,
    cluster_missing,
    competing_plan,
    drain_overdue,
    format_to_switch,
    node_step,
    nothing_to_upgrade,
    offline_plan,
    other_nodes_draining,
    pchannels_not_serving,
    plan_paused,
    rollback_refusal,
    rolling_plan,
    settling,
    source_reads,
    stuck_nodes,
    version_mismatch,
)

log = logging.getLogger(__name__)

KIND = "UpgradePlan"
CLUSTER_KIND = "StreamingCluster"
FINAL_PHASES = (
    UpgradePhase.SUCCEEDED.value,
    UpgradePhase.ROLLED_BACK.value,
    UpgradePhase.FAILED.value,
)


def parse_time(value: str) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def pod_problem(pod: Mapping[str, Any]) -> str:
    """Why the node container does not run ("" when nothing is said): the
    waiting or terminated reason and message of its container status."""
    status = pod.get("status") or {}
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        for kind in ("waiting", "terminated"):
            detail = state.get(kind) or {}
            if detail.get("reason") and detail.get("reason") != "Completed":
                message = detail.get("message", "")
                return f"{detail['reason']}: {message}" if message else str(detail["reason"])
    return str(status.get("reason", ""))


def cluster_view(
    cluster: str,
    desired: int,
    pods: Sequence[Mapping[str, Any]],
    snapshot: ClusterSnapshot,
    leader: str,
) -> ClusterView:
    """The plan's view of the cluster from its node pods and the metastore. A
    desired node whose pod does not exist (being replaced) is in the view with
    no image: it runs nothing yet, least of all the target."""
    live = snapshot.live_nodes()
    held: dict[str, list[str]] = {}
    serving: dict[str, str] = {}
    for pchannel, record in sorted(snapshot.assignments.items()):
        if record.state is AssignmentState.ASSIGNED and record.node in live:
            serving[pchannel] = record.node
        if record.state is not AssignmentState.UNASSIGNED and record.node:
            held.setdefault(record.node, []).append(pchannel)
    nodes = []
    for pod in pods:
        meta = pod.get("metadata", {})
        ordinal = builders.ordinal_of(cluster, meta.get("name", ""))
        if ordinal is None:
            continue
        status = pod.get("status") or {}
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        name = meta["name"]
        nodes.append(
            UpgradeNode(
                name=name,
                ordinal=ordinal,
                image=pod_image(pod),
                ready=ready,
                registered=name in live,
                version=live[name].info.version if name in live else "",
                terminating=bool(meta.get("deletionTimestamp")),
                draining=name in live and live[name].frozen,
                problem=pod_problem(pod),
            )
        )
    seen = {node.ordinal for node in nodes}
    nodes += [
        UpgradeNode(name=builders.node_name(cluster, i), ordinal=i, image="")
        for i in range(desired)
        if i not in seen
    ]
    return ClusterView(
        nodes=tuple(sorted(nodes, key=lambda n: n.ordinal)),
        coordinator=leader,
        holdings={node: tuple(p) for node, p in held.items()},
        pchannels=snapshot.pchannels,
        serving=serving,
    )


@dataclasses.dataclass
class UpgradePass:
    """Inputs of one pass of one UpgradePlan, and what its steps hand on."""

    body: Mapping[str, Any]
    kube: KubeApi
    events: EventSink
    connect: Connect
    now: datetime.datetime
    spec: UpgradePlanSpec | None = None
    cluster: Mapping[str, Any] | None = None
    cluster_spec: StreamingClusterSpec | None = None
    targets: dict[str, NodeTarget] = dataclasses.field(default_factory=dict)
    target: NodeTarget | None = None
    """What every node should run when the pass is done: the plan's image, or
    with ``rollback`` the cluster's own (unchanged until the plan succeeds)."""
    view: ClusterView | None = None
    snapshot: ClusterSnapshot | None = None
    control: ClusterControl | None = None
    stop: StopState | None = None
    """The cluster-wide write stop, as observed this pass."""
    plan: list[PlannedStep] = dataclasses.field(default_factory=list)
    progress: dict[str, NodeProgress] = dataclasses.field(default_factory=dict)
    succeeded: bool = False
    formats: UpgradeFormats | None = None
    """The message formats around this upgrade (observed, and the switch)."""
    flush: UpgradeFlush | None = None
    """An Offline plan's flush of every collection (:mod:`.offline_flush`)."""

    @property
    def name(self) -> str:
        return str(self.body["metadata"]["name"])

    @property
    def namespace(self) -> str:
        return str(self.body["metadata"]["namespace"])

    @property
    def generation(self) -> int:
        return int(self.body["metadata"].get("generation", 0))

    @property
    def previous(self) -> Mapping[str, Any]:
        return self.body.get("status") or {}

    def need_spec(self) -> UpgradePlanSpec:
        if self.spec is None:
            raise errors.InvalidArgument("the plan's spec was not parsed (a step ran out of order)")
        return self.spec

    def need_target(self) -> NodeTarget:
        if self.target is None:
            raise errors.InvalidArgument("the target was not chosen (a step ran out of order)")
        return self.target

    @property
    def rolling_back(self) -> bool:
        return self.spec is not None and self.spec.rollback

    def node_image(self, node: str) -> str:
        """The image the cluster's pass builds ``node`` from."""
        target = self.targets.get(node)
        cluster_spec = self.cluster_spec
        assert cluster_spec is not None
        return cluster_spec.image if target is None else target.image

    def cluster_ref(self) -> ClusterRef:
        if self.cluster is None:
            raise errors.InvalidArgument("the cluster was not read (a step ran out of order)")
        meta = self.cluster["metadata"]
        return ClusterRef(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta.get("uid", ""),
            generation=int(meta.get("generation", 0)),
        )

    async def event(self, reason: Reason, message: str, *, warning: bool = False) -> None:
        await self.events.emit(self.body, reason.value, message, warning=warning)


async def parse_plan(p: UpgradePass) -> StepResult:
    try:
        p.spec = models.parse_upgrade_spec(p.body.get("spec") or {})
    except InvalidSpec as exc:
        return halted(Halt.INVALID_SPEC, exc.message)
    return DONE


async def check_finished(p: UpgradePass) -> StepResult:
    """A plan that succeeded or rolled back for this generation does nothing
    more (a later change of the cluster's image is not undone by it)."""
    previous = p.previous
    phase = previous.get("phase")
    if phase in (UpgradePhase.SUCCEEDED, UpgradePhase.ROLLED_BACK) and (
        previous.get("observedGeneration") == p.generation
    ):
        return halted(Halt.FINISHED, f"the plan ended {phase}")
    return DONE


async def read_cluster(p: UpgradePass) -> StepResult:
    name = p.need_spec().cluster_ref.name
    p.cluster = await p.kube.get(models.API_VERSION, CLUSTER_KIND, p.namespace, name)
    missing = cluster_missing(name, p.cluster is not None)
    if missing:
        return halted(Halt.BLOCKED, missing)
    assert p.cluster is not None
    try:
        p.cluster_spec = models.parse_cluster_spec(p.cluster.get("spec") or {})
        p.targets = builders.node_targets(p.cluster)
    except InvalidSpec as exc:
        return halted(Halt.BLOCKED, f"StreamingCluster {name}: {exc.message}")
    return DONE


def _age_key(body: Mapping[str, Any]) -> tuple[str, str]:
    meta = body.get("metadata", {})
    return str(meta.get("creationTimestamp") or ""), str(meta.get("name", ""))


def is_active(body: Mapping[str, Any]) -> bool:
    """A plan that may change its cluster: not a dry run, not finished."""
    spec = body.get("spec") or {}
    phase = (body.get("status") or {}).get("phase", "")
    return not spec.get("dryRun") and phase not in FINAL_PHASES


async def check_competing(p: UpgradePass) -> StepResult:
    """One active plan per cluster: the oldest goes, the others are Blocked."""
    spec = p.need_spec()
    if spec.dry_run:
        return DONE
    plans = await p.kube.list(models.API_VERSION, KIND, p.namespace, {})
    mine = _age_key(p.body)
    older = sorted(
        (
            other
            for other in plans
            if other["metadata"]["name"] != p.name
            and (other.get("spec") or {}).get("clusterRef", {}).get("name") == spec.cluster_ref.name
            and is_active(other)
            and _age_key(other) < mine
        ),
        key=_age_key,
    )
    reason = competing_plan(spec.cluster_ref.name, [o["metadata"]["name"] for o in older])
    return halted(Halt.BLOCKED, reason) if reason else DONE


async def observe(p: UpgradePass) -> StepResult:
    ref = p.cluster_ref()
    cluster_spec = p.cluster_spec
    assert cluster_spec is not None
    control = await p.connect(ref, cluster_spec)
    if control is None:
        return waiting_on("connecting to the cluster's metastore")
    p.control = control
    try:
        p.snapshot = await control.snapshot()
        leader = await control.leader()
        p.stop = await control.write_stop()
    except errors.Unavailable as exc:
        return failed(f"metastore: {exc.message}", retryable=True, kind=FailureKind.BACKEND)
    pods = await p.kube.list("v1", "Pod", p.namespace, builders.selector_labels(ref.name))
    p.view = cluster_view(ref.name, cluster_spec.nodes, pods, p.snapshot, leader)
    return DONE


def _previous_formats(p: UpgradePass) -> UpgradeFormats:
    recorded = p.previous.get("formats")
    return UpgradeFormats.model_validate(recorded) if recorded else UpgradeFormats()


async def check_formats(p: UpgradePass) -> StepResult:
    """Record the cluster's format and what the release the plan started from
    reads; refuse a rollback to it once the cluster writes a format it cannot
    read (after the plan's last step switched it)."""
    snapshot, view, cluster_spec = p.snapshot, p.view, p.cluster_spec
    if snapshot is None or view is None or cluster_spec is None:
        return DONE
    before = _previous_formats(p)
    supports = {name: info.formats for name, info in snapshot.nodes.items()}
    images = {node.name: node.image for node in view.nodes}
    reads = source_reads(supports, images, cluster_spec.image, before.source_reads)
    cluster = snapshot.cluster_format.version
    p.formats = before.model_copy(update={"cluster": cluster, "source_reads": sorted(reads)})
    if not p.rolling_back:
        return DONE
    written = {cluster}.union(*(f.written for f in snapshot.log_formats.values()))
    refusal = rollback_refusal(written, reads, cluster_spec.image)
    return halted(Halt.BLOCKED, refusal) if refusal else DONE


async def make_plan(p: UpgradePass) -> StepResult:
    spec = p.need_spec()
    if p.view is None:
        return DONE
    if spec.mode is UpgradeMode.OFFLINE:
        p.plan = offline_plan(p.view)
    else:
        p.plan = rolling_plan(p.view, p.need_target().image, spec.max_unavailable)
    if spec.dry_run:
        return halted(Halt.PLANNED, f"dry run: {len(p.plan)} step(s) planned, nothing changed")
    return DONE


async def check_paused(p: UpgradePass) -> StepResult:
    reason = plan_paused(p.need_spec().paused)
    return halted(Halt.PAUSED, reason) if reason else DONE


async def choose_target(p: UpgradePass) -> StepResult:
    """The plan's image and version, or with ``rollback`` the cluster's: its
    spec keeps the image the nodes ran before until the plan succeeds, so
    rolling back is the same loop towards it."""
    spec, cluster_spec = p.need_spec(), p.cluster_spec
    assert cluster_spec is not None
    if not spec.rollback:
        p.target = NodeTarget(spec.image, spec.version)
        return DONE
    if p.previous.get("phase") == UpgradePhase.SUCCEEDED:
        return halted(
            Halt.BLOCKED,
            "rollback after the plan succeeded: the cluster's spec already names "
            f"{spec.image}; create a new UpgradePlan to the previous image instead",
        )
    p.target = NodeTarget(cluster_spec.image, cluster_spec.version)
    return DONE


def _previous_progress(p: UpgradePass) -> dict[str, NodeProgress]:
    nodes = p.previous.get("nodes") or []
    return {item["node"]: NodeProgress.model_validate(item) for item in nodes}


def _problem(node: UpgradeNode, target: NodeTarget) -> str:
    """Why ``node`` is not on the target yet, as far as is known: what the
    kubelet says of its container, or the version it registered."""
    return node.problem or version_mismatch(node, target.image, target.version)


def track_nodes(p: UpgradePass) -> dict[str, NodeProgress]:
    """Per-node progress from observation; the previous status only gives the
    times (start, first Ready on the target) and the image a node came from."""
    spec, view, cluster_spec, target = p.need_spec(), p.view, p.cluster_spec, p.need_target()
    assert view is not None and cluster_spec is not None
    before = _previous_progress(p)
    held = holdings(p.snapshot.assignments.values()) if p.snapshot is not None else {}
    progress: dict[str, NodeProgress] = {}
    for node in view.nodes:
        old = before.get(node.name)
        told = p.node_image(node.name) == target.image and (
            node.name in p.targets or p.rolling_back
        )
        on_target = node.image == target.image and node.ready and node.registered
        on_target = on_target and node.version == target.version and not node.draining
        ready_since = (old.ready_since if old else "") or (timestamp(p.now) if on_target else "")
        since = parse_time(ready_since) if on_target else None
        soaked = since is not None and (p.now - since).total_seconds() >= spec.soak_seconds
        holding = held.get(node.name, 0)
        step = node_step(
            node,
            target_image=target.image,
            target_version=target.version,
            told=told,
            holding=holding,
            soaked=soaked,
        )
        started = old.started if told and old is not None else ""
        at_start = old.pchannels_at_start if old is not None and started else holding
        moved = 0 if not started else at_start - holding if step is NodeStep.DRAINING else at_start
        origin = (old.from_ if old else "") or (
            node.image if node.image != spec.image else cluster_spec.image
        )
        progress[node.name] = NodeProgress.model_validate(
            {
                "node": node.name,
                "from": origin,
                "to": target.image,
                "step": step.value,
                "pchannelsMoved": max(0, moved),
                "pchannelsAtStart": at_start,
                "started": started,
                "readySince": ready_since if on_target else "",
                "error": _problem(node, target) if step is not NodeStep.DONE else "",
            }
        )
    return progress


async def advance(p: UpgradePass) -> StepResult:
    """Finish, wait for the nodes in progress, or start the next ones."""
    spec, view, target = p.need_spec(), p.view, p.need_target()
    if view is None:
        return DONE
    if spec.mode is UpgradeMode.OFFLINE:
        assert p.control is not None and p.stop is not None
        return await advance_offline(p, p.control, p.stop)
    p.progress = track_nodes(p)
    before = _previous_progress(p)
    for name, item in p.progress.items():
        old = before.get(name)
        if item.step == NodeStep.DONE and (old is None or old.step != NodeStep.DONE):
            await p.event(Reason.UPGRADE_NODE_DONE, f"node {name} runs {target.image}")
    unfinished = [
        item for item in p.progress.values() if item.step not in (NodeStep.PENDING, NodeStep.DONE)
    ]
    if nothing_to_upgrade(view, target.image, target.version) and not unfinished:
        return await _finish(p)
    if unfinished:
        for item in unfinished:
            node = view.node(item.node)
            if node is None:
                continue
            overdue = drain_overdue(
                dataclasses.replace(node, problem=_problem(node, target)),
                parse_time(item.started),
                p.now,
                spec.drain_timeout_seconds,
            )
            if overdue and item.step in (NodeStep.DRAINING, NodeStep.RESTARTING):
                return halted(Halt.BLOCKED, overdue)
        return waiting_on(*(f"node {item.node}: {item.step}" for item in unfinished))
    broken = stuck_nodes(view, target.image)
    if broken:
        return await _start(p, broken)
    back = [parse_time(item.ready_since) for item in p.progress.values() if item.ready_since]
    last_back = max((t for t in back if t is not None), default=None)
    for gate in (pchannels_not_serving(view), other_nodes_draining(view, ())):
        if gate and settling(last_back, p.now, spec.drain_timeout_seconds):
            return waiting_on(f"the cluster settles after the last node came back: {gate}")
        if gate:
            return halted(Halt.BLOCKED, gate)
    not_ready = [n.name for n in view.nodes if not (n.ready and n.registered)]
    if not_ready:
        return waiting_on(f"waiting until every node is Ready: {', '.join(not_ready)}")
    return await _start(p, p.plan[0].nodes if p.plan else [])


async def _start(p: UpgradePass, nodes: Sequence[str]) -> StepResult:
    target, cluster_spec = p.need_target(), p.cluster_spec
    assert cluster_spec is not None
    targets = dict(p.targets)
    for node in nodes:
        if (target.image, target.version) == (cluster_spec.image, cluster_spec.version):
            targets.pop(node, None)
        else:
            targets[node] = target
    annotations = {
        builders.NODE_IMAGES: builders.encode_node_targets(targets),
        builders.MAX_UNAVAILABLE: str(p.need_spec().max_unavailable) if targets else None,
    }
    patch = {"metadata": {"annotations": annotations}}
    ref = p.cluster_ref()
    await p.kube.patch_merge(models.API_VERSION, CLUSTER_KIND, ref.namespace, ref.name, patch)
    p.targets = targets
    for node in nodes:
        item = p.progress[node]
        p.progress[node] = item.model_copy(
            update={"step": NodeStep.DRAINING.value, "started": timestamp(p.now)}
        )
        await p.event(
            Reason.UPGRADE_NODE_STARTED,
            f"restarting node {node} on {target.image} (from {item.from_}); "
            f"its {item.pchannels_at_start} pchannel(s) move by graceful handoff first",
        )
    return waiting_on(*(f"node {node}: {NodeStep.DRAINING.value}" for node in nodes))


async def _switch_format(p: UpgradePass) -> StepResult | None:
    """The plan's last step: when every node runs the target and its release
    writes a newer message format than the cluster's, switch the cluster's
    format (recorded in ``status.formats``); None when there is nothing to switch."""
    snapshot, control = p.snapshot, p.control
    if p.rolling_back or snapshot is None or control is None:
        return None
    supports = {name: info.formats for name, info in snapshot.nodes.items()}
    current = snapshot.cluster_format.version
    version = format_to_switch(supports, current)
    if not version:
        return None
    try:
        switch = await control.set_format(version, reason=f"UpgradePlan {p.namespace}/{p.name}")
    except errors.InvalidArgument as exc:
        return halted(Halt.BLOCKED, exc.message)
    formats = p.formats or UpgradeFormats()
    p.formats = formats.model_copy(
        update={
            "cluster": switch.version,
            "switched_from": switch.previous,
            "switched_to": switch.version,
            "switched_at": timestamp(p.now),
        }
    )
    await p.event(
        Reason.UPGRADE_FORMAT_SWITCHED,
        f"every node of {p.cluster_ref().name} runs {p.need_target().image}: the cluster "
        f"writes message format {switch.version} (was {switch.previous})",
    )
    return waiting_on(f"switched the message format from {switch.previous} to {switch.version}")


async def _finish(p: UpgradePass) -> StepResult:
    """Every node runs the target: switch the message format if the target
    writes a newer one (:func:`_switch_format`, a pass of its own), then write
    the target into the cluster's spec (the nodes keep their template hash,
    see :func:`.builders.node_spec`) and drop the per-node targets."""
    switched = await _switch_format(p)
    if switched is not None:
        return switched
    target = p.need_target()
    ref = p.cluster_ref()
    cluster_spec = p.cluster_spec
    assert cluster_spec is not None
    annotations = (p.cluster or {}).get("metadata", {}).get("annotations") or {}
    if (
        (cluster_spec.image, cluster_spec.version) != (target.image, target.version)
        or p.targets
        or builders.MAX_UNAVAILABLE in annotations
    ):
        patch = {
            "metadata": {
                "annotations": {builders.NODE_IMAGES: None, builders.MAX_UNAVAILABLE: None}
            },
            "spec": {"image": target.image, "version": target.version},
        }
        await p.kube.patch_merge(models.API_VERSION, CLUSTER_KIND, ref.namespace, ref.name, patch)
    p.succeeded = True
    return DONE


UpgradeStep = Callable[[UpgradePass], Awaitable[StepResult]]

UPGRADE_STEPS: Sequence[tuple[str, UpgradeStep]] = (
    ("spec", parse_plan),
    ("finished", check_finished),
    ("cluster", read_cluster),
    ("one-plan-per-cluster", check_competing),
    ("target", choose_target),
    ("observe", observe),
    ("formats", check_formats),
    ("plan", make_plan),
    ("pause", check_paused),
    ("progress", advance),
)


def _phase(p: UpgradePass, result: PassResult) -> UpgradePhase:
    halt = result.halt
    if halt is Halt.INVALID_SPEC:
        return UpgradePhase.FAILED
    if halt is Halt.BLOCKED:
        return UpgradePhase.BLOCKED
    if halt is Halt.PAUSED:
        return UpgradePhase.PAUSED
    if halt is Halt.PLANNED:
        return UpgradePhase.PLANNED
    if p.succeeded:
        return UpgradePhase.ROLLED_BACK if p.rolling_back else UpgradePhase.SUCCEEDED
    started = any(item.step != NodeStep.PENDING for item in p.progress.values())
    return UpgradePhase.RUNNING if started or p.targets or _stopped_by(p) else UpgradePhase.PENDING


def _stopped_by(p: UpgradePass) -> bool:
    """This plan's write stop is in place."""
    stop = p.stop.stop if p.stop is not None else None
    return stop is not None and stop.by == plan_id(p.namespace, p.name)


def writes_condition(p: UpgradePass, previous: Mapping[str, Any]) -> Condition:
    """``WritesStopped``: whether the cluster's writes are stopped, by whom
    and why, so a stop left in place (a Blocked plan) is never silent."""
    stop = p.stop.stop if p.stop is not None else None
    value: Literal["True", "False"] = "True" if stop is not None else "False"
    since = previous.get("lastTransitionTime") if previous.get("status") == value else None
    message = ""
    if stop is not None:
        at = timestamp(datetime.datetime.fromtimestamp(stop.since, datetime.UTC))
        message = f"writes stopped by {stop.by or 'unknown'} since {at}: {stop.reason}"
    return Condition(
        type=UpgradeConditionType.WRITES_STOPPED.value,
        status=value,
        reason="WritesStopped" if stop is not None else "WritesFlowing",
        message=message,
        observed_generation=p.generation,
        last_transition_time=since or timestamp(p.now),
    )


def _conditions(phase: UpgradePhase, message: str, p: UpgradePass) -> list[Condition]:
    previous = {c.get("type"): c for c in p.previous.get("conditions") or []}
    truth = {
        UpgradeConditionType.PROGRESSING: phase in (UpgradePhase.RUNNING, UpgradePhase.PENDING),
        UpgradeConditionType.PAUSED: phase is UpgradePhase.PAUSED,
        UpgradeConditionType.BLOCKED: phase is UpgradePhase.BLOCKED,
        UpgradeConditionType.SUCCEEDED: phase is UpgradePhase.SUCCEEDED,
        UpgradeConditionType.ROLLED_BACK: phase is UpgradePhase.ROLLED_BACK,
        UpgradeConditionType.FAILED: phase is UpgradePhase.FAILED,
    }
    conditions = []
    for kind, on in truth.items():
        value: Literal["True", "False"] = "True" if on else "False"
        before = previous.get(kind.value, {})
        since = before.get("lastTransitionTime") if before.get("status") == value else None
        conditions.append(
            Condition(
                type=kind.value,
                status=value,
                reason=phase.value,
                message=message if on else "",
                observed_generation=p.generation,
                last_transition_time=since or timestamp(p.now),
            )
        )
    if p.stop is not None:
        before = previous.get(UpgradeConditionType.WRITES_STOPPED.value, {})
        conditions.append(writes_condition(p, before))
    elif UpgradeConditionType.WRITES_STOPPED.value in previous:
        kept = previous[UpgradeConditionType.WRITES_STOPPED.value]
        conditions.append(Condition.model_validate(kept))
    return conditions


def upgrade_status(p: UpgradePass, result: PassResult) -> dict[str, Any]:
    """The plan's status from this pass's observations and step results."""
    phase = _phase(p, result)
    message = result.halt_reason or "; ".join(result.failures) or "; ".join(result.waiting)
    if phase in (UpgradePhase.SUCCEEDED, UpgradePhase.ROLLED_BACK):
        message = f"every node runs {p.need_target().image}"
    done = sum(1 for item in p.progress.values() if item.step == NodeStep.DONE)
    current = [
        item.node
        for item in p.progress.values()
        if item.step not in (NodeStep.PENDING, NodeStep.DONE)
    ]
    nodes = list(p.progress.values()) or [
        NodeProgress.model_validate(item) for item in p.previous.get("nodes") or []
    ]
    status = models.UpgradePlanStatus(
        phase=phase.value,
        progress=f"{done}/{len(p.progress)}" if p.progress else str(p.previous.get("progress", "")),
        plan=p.plan,
        nodes=nodes,
        current_node=current[0] if current else "",
        observed_generation=p.generation,
        formats=p.formats or (_previous_formats(p) if p.previous.get("formats") else None),
        flush=p.flush if p.flush is not None else previous_record(p.previous)[0],
        conditions=_conditions(phase, message, p),
    )
    return status.to_api()


async def write_upgrade_status(p: UpgradePass, result: PassResult) -> dict[str, Any]:
    previous = p.previous
    status = upgrade_status(p, result)
    if status != previous:
        await p.kube.patch_merge(
            models.API_VERSION, KIND, p.namespace, p.name, {"status": status}, subresource="status"
        )
    phase = status["phase"]
    if phase == previous.get("phase"):
        return status
    if phase == UpgradePhase.BLOCKED:
        await p.event(Reason.UPGRADE_BLOCKED, result.halt_reason, warning=True)
    elif phase in (UpgradePhase.SUCCEEDED, UpgradePhase.ROLLED_BACK):
        target = p.need_target()
        reason = (
            Reason.UPGRADE_SUCCEEDED
            if phase == UpgradePhase.SUCCEEDED
            else Reason.UPGRADE_ROLLED_BACK
        )
        await p.event(
            reason,
            f"every node of {p.cluster_ref().name} runs {target.image}; "
            f"cluster version is {target.version}",
        )
    return status


async def run_upgrade_pass(
    p: UpgradePass, steps: Sequence[tuple[str, UpgradeStep]] = UPGRADE_STEPS
) -> PassResult:
    """Run the steps in order until one halts the pass, then write the status
    (a finished plan keeps its status)."""
    results: list[tuple[str, StepResult]] = []
    for name, step in steps:
        try:
            result = await step(p)
        except errors.HeadraceError as exc:
            log.warning("%s/%s: upgrade step %s failed: %s", p.namespace, p.name, name, exc)
            result = failed(exc.message, retryable=exc.retryable)
        results.append((name, result))
        if result.halt is not None:
            break
    outcome = PassResult(tuple(results))
    if outcome.halt is Halt.FINISHED:
        return outcome
    return dataclasses.replace(outcome, status=await write_upgrade_status(p, outcome))

"""The progress step of an Offline UpgradePlan: carry out :func:`.offline.decide`.

Called by :func:`.upgrade_steps.advance` for ``mode: Offline`` with the pass's
observations. Each pass does at most one thing (stop writes, freeze, request a
flush of every collection, tell the cluster's pass to restart every node,
unfreeze, resume writes, finish) and records in ``status.plan`` which step runs
and what it waits for. A wait longer than ``drainTimeoutSeconds`` (appends that
never finish, a node that never comes back on the target, pchannels not served
again), or than ``flushTimeoutSeconds`` for the flush (checkpoints that never
reach the plan's request), is Blocked with the reason; the write stop stays in
place (the cluster is down anyway) and the
``WritesStopped`` condition says so; ``rollback: true`` then brings every node
back to the cluster's image the same way and resumes writes.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from headrace.cluster import AssignmentState
from headrace.coordinator.writestop import StopState, drained
from headrace_operator import builders, models
from headrace_operator.events import Reason
from headrace_operator.interfaces import ClusterControl, EventSink, KubeApi
from headrace_operator.models import NodeProgress, PlannedStep
from headrace_operator.offline import (
    Act,
    Decision,
    OfflineFacts,
    decide,
    done_steps,
    node_step,
    orphaned,
    step_states,
)
from headrace_operator.offline_flush import FlushFacts, requested_why
from headrace_operator.offline_flush_steps import flush_events, observe_flush, request_flush
from headrace_operator.results import DONE, Halt, StepResult, failed, halted, waiting_on
from headrace_operator.status import timestamp
from headrace_operator.upgradeplan import NodeStep, OfflineAction, pchannels_not_serving

if TYPE_CHECKING:
    from headrace_operator.upgrade_steps import UpgradePass

CLUSTER_KIND = "StreamingCluster"
_MOVING = (AssignmentState.ASSIGNING, AssignmentState.UNASSIGNING)


def plan_id(namespace: str, name: str) -> str:
    """How a plan signs the write stop it puts in place."""
    return f"UpgradePlan {namespace}/{name}"


def stop_reason(image: str, version: str) -> str:
    return f"offline upgrade to {image} (version {version})"


def facts(p: UpgradePass, stop: StopState, flush: FlushFacts) -> OfflineFacts:
    """The decision's inputs from the pass ``p`` (an :class:`.upgrade_steps.UpgradePass`)."""
    view, target, snapshot = p.view, p.need_target(), p.snapshot
    assert view is not None and snapshot is not None
    annotations = (p.cluster or {}).get("metadata", {}).get("annotations") or {}
    live = snapshot.live_nodes()
    return OfflineFacts(
        nodes=view.nodes,
        target_image=target.image,
        target_version=target.version,
        marked=annotations.get(builders.OFFLINE_UPGRADE) == p.name,
        told=all(p.node_image(n.name) == target.image for n in view.nodes),
        stopped=stop.stop is not None,
        ours=stop.stop is not None and stop.stop.by == plan_id(p.namespace, p.name),
        drained=drained(stop, live),
        frozen=tuple(sorted(n for n, node in live.items() if node.frozen)),
        moving=tuple(
            sorted(name for name, a in snapshot.assignments.items() if a.state in _MOVING)
        ),
        not_serving=pchannels_not_serving(view),
        flush=flush,
    )


async def advance_offline(p: UpgradePass, control: ClusterControl, stop: StopState) -> StepResult:
    """One pass of the Offline plan (see the module docstring)."""
    flush = await observe_flush(p, control)
    f = facts(p, stop, flush)
    decision = decide(f)
    names = [n.name for n in f.nodes]
    now = timestamp(p.now)
    previous = [PlannedStep.model_validate(s) for s in p.previous.get("plan") or []]
    p.plan = step_states(decision, names, previous, now, flush)
    p.progress = node_progress(p, f, decision, now)
    await _node_events(p)
    await flush_events(p)
    if decision.act is Act.STOP:
        return await _stop(p, control, announce=not f.stopped)
    if decision.act is Act.FREEZE:
        for node in decision.nodes:
            await control.freeze(node)
        return waiting_on(decision.why)
    if decision.act is Act.FLUSH:
        problem = await request_flush(p, control)
        if problem:
            refused = dataclasses.replace(decision, why=problem)
            p.plan = step_states(refused, names, previous, now, flush)
            return _overdue(p, refused, stop) or failed(problem, retryable=True)
        assert p.flush is not None
        requested = dataclasses.replace(decision, why=requested_why(p.flush))
        p.plan = step_states(requested, names, previous, now, flush)
        return waiting_on(requested.why)
    if decision.act is Act.TELL:
        return await _tell(p, decision)
    if decision.act is Act.UNFREEZE:
        for node in decision.nodes:
            await control.undrain(node)
        return waiting_on(decision.why)
    if decision.act is Act.RESUME:
        await control.resume_writes()
        await p.event(Reason.UPGRADE_WRITES_RESUMED, "every node runs the target; writes resumed")
        return waiting_on("writes resumed; finishing")
    if decision.act is Act.FINISH:
        p.plan = done_steps(names, previous, now, flush)
        return await _finish(p)
    return _overdue(p, decision, stop) or waiting_on(decision.why)


async def _stop(p: UpgradePass, control: ClusterControl, *, announce: bool) -> StepResult:
    target = p.need_target()
    state = await control.stop_writes(
        stop_reason(target.image, target.version), plan_id(p.namespace, p.name)
    )
    await _annotate(p, {builders.OFFLINE_UPGRADE: p.name})
    if announce and state.stop is not None:
        await p.event(Reason.UPGRADE_WRITES_STOPPED, f"writes stopped: {state.stop.reason}")
    return waiting_on("writes stopped; waiting for in-flight appends")


async def _tell(p: UpgradePass, decision: Decision) -> StepResult:
    """Point every node at the target: the cluster's pass (offline) deletes
    every stale pod at once and recreates it from the target."""
    target, cluster_spec = p.need_target(), p.cluster_spec
    assert cluster_spec is not None and p.view is not None
    same = (target.image, target.version) == (cluster_spec.image, cluster_spec.version)
    targets = {} if same else {n.name: target for n in p.view.nodes}
    await _annotate(p, {builders.NODE_IMAGES: builders.encode_node_targets(targets)})
    p.targets = targets
    for item in p.progress.values():
        await p.event(
            Reason.UPGRADE_NODE_STARTED,
            f"stopping node {item.node} to start it on {target.image} (offline: writes stopped)",
        )
    return waiting_on(decision.why)


async def _finish(p: UpgradePass) -> StepResult:
    target = p.need_target()
    ref = p.cluster_ref()
    patch: dict[str, Any] = {
        "metadata": {
            "annotations": {
                builders.NODE_IMAGES: None,
                builders.MAX_UNAVAILABLE: None,
                builders.OFFLINE_UPGRADE: None,
            }
        },
        "spec": {"image": target.image, "version": target.version},
    }
    await p.kube.patch_merge(models.API_VERSION, CLUSTER_KIND, ref.namespace, ref.name, patch)
    p.succeeded = True
    return DONE


async def _annotate(p: UpgradePass, annotations: Mapping[str, str | None]) -> None:
    ref = p.cluster_ref()
    patch = {"metadata": {"annotations": dict(annotations)}}
    await p.kube.patch_merge(models.API_VERSION, CLUSTER_KIND, ref.namespace, ref.name, patch)


def _overdue(p: UpgradePass, decision: Decision, stop: StopState) -> StepResult | None:
    """Blocked when the step under way waited longer than ``drainTimeoutSeconds``
    (the flush: ``flushTimeoutSeconds`` since its request)."""
    spec = p.need_spec()
    timeout = spec.drain_timeout_seconds
    step = next((s for s in p.plan if s.action == decision.step.value), None)
    since = _parse(step.started) if step is not None else None
    if decision.step is OfflineAction.DRAIN_AND_FENCE and stop.stop is not None:
        since = datetime.datetime.fromtimestamp(stop.stop.since, datetime.UTC)
    if decision.step is OfflineAction.FLUSH:
        timeout = spec.flush_timeout_seconds
        since = _parse(p.flush.requested) if p.flush is not None else since
    if since is None or (p.now - since).total_seconds() <= timeout:
        return None
    nodes = p.view.nodes if p.view is not None else ()
    problems = [f"{n.name}: {n.problem}" for n in nodes if n.problem]
    why = f" ({'; '.join(problems)})" if problems else ""
    return halted(
        Halt.BLOCKED,
        f"{decision.step.value} has not finished within {timeout}s: {decision.why}{why}; "
        "writes stay stopped (set rollback: true to go back to the cluster's image)",
    )


def _parse(value: str) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.UTC)


def node_progress(
    p: UpgradePass, f: OfflineFacts, decision: Decision, now: str
) -> dict[str, NodeProgress]:
    """Per node: Pending until the plan stops the nodes, Restarting until it
    is back on the target, then Done."""
    before = {item["node"]: item for item in p.previous.get("nodes") or []}
    cluster_spec = p.cluster_spec
    assert cluster_spec is not None
    progress = {}
    for node in f.nodes:
        old = before.get(node.name, {})
        back = f.back(node)
        step = node_step(decision, back, old.get("step") == NodeStep.DONE)
        started = old.get("started") or (now if step is not NodeStep.PENDING else "")
        origin = old.get("from") or (
            node.image if node.image and node.image != f.target_image else cluster_spec.image
        )
        progress[node.name] = NodeProgress.model_validate(
            {
                "node": node.name,
                "from": origin,
                "to": f.target_image,
                "step": step.value,
                "started": started if step is not NodeStep.PENDING else "",
                "readySince": old.get("readySince") or (now if back else ""),
                "error": "" if back else node.problem,
            }
        )
    return progress


async def _node_events(p: UpgradePass) -> None:
    before = {item["node"]: item.get("step") for item in p.previous.get("nodes") or []}
    for name, item in p.progress.items():
        if item.step == NodeStep.DONE and before.get(name) != NodeStep.DONE:
            await p.event(Reason.UPGRADE_NODE_DONE, f"node {name} runs {item.to}")


async def release_orphan(
    kube: KubeApi, events: EventSink, control: ClusterControl, cluster: Mapping[str, Any]
) -> str:
    """The cluster's side of an Offline plan that went away mid-way: when the
    plan its :data:`~.builders.OFFLINE_UPGRADE` annotation names no longer
    runs (:func:`.offline.orphaned`), resume the writes that plan stopped and
    remove the annotation, so the cluster's pass unfreezes its nodes again and
    no cluster is left stopped by a plan nobody sees. Returns what it did
    ("" when nothing)."""
    plan = builders.offline_upgrade(cluster)
    if not plan:
        return ""
    meta = cluster["metadata"]
    namespace = meta["namespace"]
    why = orphaned(plan, await kube.get(models.API_VERSION, "UpgradePlan", namespace, plan))
    if not why:
        return ""
    state = await control.write_stop()
    resumed = state.stop is not None and state.stop.by == plan_id(namespace, plan)
    if resumed:
        await control.resume_writes()
    patch = {"metadata": {"annotations": {builders.OFFLINE_UPGRADE: None}}}
    await kube.patch_merge(models.API_VERSION, CLUSTER_KIND, namespace, meta["name"], patch)
    done = f"{why}: {'writes resumed, ' if resumed else ''}offline-upgrade annotation removed"
    await events.emit(cluster, Reason.UPGRADE_WRITES_RESUMED.value, done, warning=True)
    return done

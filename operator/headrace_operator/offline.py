"""What an Offline UpgradePlan does next, as a pure function of what is observed.

The upgrade with downtime (the seed's plan 1), in order (:class:`OfflineAction`):

1. **stop-writes**: the cluster-wide write stop (its metastore record, by this
   plan) and the :data:`~.builders.OFFLINE_UPGRADE` annotation on the
   StreamingCluster, so the cluster's pass leaves the nodes' freezes alone.
2. **drain-and-fence**: wait until every live node obeys the stop with no
   append in flight (its ack in the metastore), freeze every node (no
   pchannel moves onto a node about to stop, and a node's preStop drain finds
   no peer and returns at once), and wait until no pchannel is mid-move. What
   every WAL acknowledged is then durable and nothing more is appended; the
   new nodes open every WAL under a new term, which fences the old writers.
3. **flush**: with a flush section on the cluster, request a flush of every
   collection, record the per-pchannel targets in ``status.flush`` and wait
   until every checkpoint reaches its target (:mod:`.offline_flush`); without
   one, Skipped (:data:`~.offline_flush.FLUSH_SKIPPED`).
4. **stop-nodes**: tell the cluster's pass to build every node from the target
   (the :data:`~.builders.NODE_IMAGES` annotation; with ``rollback`` it is
   removed, the cluster's own image being the target); it deletes every stale
   pod at once and recreates it. Done when no pod runs another image.
5. **start-nodes**: wait until every node is Ready, registered and reports the
   target version.
6. **resume-writes**: unfreeze every node, wait until every pchannel is served
   again, remove this plan's write stop, write the target into the cluster's
   spec and remove the annotations.

:func:`decide` reads the stage from observation only (pods, annotations and
metastore; of the plan's status only the flush targets it requested), so an
operator restarted mid-plan
resumes where the cluster is, and a node whose pod already runs the target is
never restarted again (its template no longer changes).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any

from headrace_operator.models import PlannedStep
from headrace_operator.offline_flush import FlushFacts, FlushNext, next_flush, step_outcome
from headrace_operator.upgradeplan import OFFLINE_NODE_STEPS, NodeStep, OfflineAction, UpgradeNode


class Act(enum.StrEnum):
    """What the pass does now."""

    STOP = "stop"
    """Write the stop record and the offline annotation."""
    FREEZE = "freeze"
    """Freeze the nodes in :attr:`Decision.nodes`."""
    FLUSH = "flush"
    """Request a flush of every collection and record its targets."""
    TELL = "tell"
    """Point every node at the target (NODE_IMAGES)."""
    UNFREEZE = "unfreeze"
    RESUME = "resume"
    """Remove this plan's write stop."""
    FINISH = "finish"
    """Write the target into the cluster's spec, remove the annotations."""
    WAIT = "wait"


class StepState(enum.StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    DONE = "Done"
    SKIPPED = "Skipped"


@dataclasses.dataclass(frozen=True, slots=True)
class OfflineFacts:
    """What one pass observed, reduced to what the decision needs."""

    nodes: tuple[UpgradeNode, ...]
    target_image: str
    target_version: str
    marked: bool
    """The cluster carries the OFFLINE_UPGRADE annotation (of this plan)."""
    told: bool
    """Every node is built from the target image (NODE_IMAGES, or none with rollback)."""
    stopped: bool
    """A write stop is in place (this plan's or another's)."""
    ours: bool
    """The write stop in place is this plan's."""
    drained: str
    """Why the stop is not complete yet (:func:`headrace.coordinator.writestop.drained`)."""
    frozen: tuple[str, ...]
    """Live nodes frozen (by this plan, or before it)."""
    moving: tuple[str, ...]
    """pchannels mid-move (ASSIGNING or UNASSIGNING)."""
    not_serving: str
    """Why not every pchannel is served (:func:`.upgradeplan.pchannels_not_serving`)."""
    flush: FlushFacts = dataclasses.field(default_factory=FlushFacts)
    """The flush of every collection (:mod:`.offline_flush`)."""

    def back(self, node: UpgradeNode) -> bool:
        """``node`` runs the target: Ready, registered with the target version."""
        return (
            node.image == self.target_image
            and node.ready
            and node.registered
            and node.version == self.target_version
            and not node.terminating
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    step: OfflineAction
    """The step under way (every earlier one is done)."""
    act: Act
    why: str
    nodes: tuple[str, ...] = ()
    """The nodes :attr:`act` concerns (FREEZE, UNFREEZE)."""


def decide(f: OfflineFacts) -> Decision:
    """The next thing to do (see the module docstring)."""
    if f.nodes and all(f.back(n) for n in f.nodes) and (f.told or not f.marked):
        return _resume(f)
    if f.marked and f.told and f.stopped:
        old = sorted(n.name for n in f.nodes if n.image and n.image != f.target_image)
        if old:
            return Decision(
                OfflineAction.STOP_NODES, Act.WAIT, f"stopping node pods: {', '.join(old)}"
            )
        waiting = sorted(n.name for n in f.nodes if not f.back(n))
        return Decision(
            OfflineAction.START_NODES,
            Act.WAIT,
            f"waiting until every node is Ready on {f.target_image} and registered "
            f"with version {f.target_version}: {', '.join(waiting)}",
        )
    if not (f.stopped and f.marked):
        return Decision(OfflineAction.STOP_WRITES, Act.STOP, "stopping writes cluster-wide")
    if f.drained:
        return Decision(
            OfflineAction.DRAIN_AND_FENCE, Act.WAIT, f"waiting for in-flight appends: {f.drained}"
        )
    live = {n.name for n in f.nodes if n.registered}
    unfrozen = tuple(sorted(live - set(f.frozen)))
    if unfrozen:
        return Decision(
            OfflineAction.DRAIN_AND_FENCE,
            Act.FREEZE,
            f"freezing {', '.join(unfrozen)} (no pchannel moves while nodes stop)",
            unfrozen,
        )
    if f.moving:
        return Decision(
            OfflineAction.DRAIN_AND_FENCE,
            Act.WAIT,
            f"waiting for pchannels mid-move: {', '.join(f.moving[:5])}",
        )
    flushing = next_flush(f.flush)
    if flushing.next is FlushNext.REQUEST:
        return Decision(OfflineAction.FLUSH, Act.FLUSH, flushing.why)
    if flushing.next is FlushNext.WAIT:
        return Decision(OfflineAction.FLUSH, Act.WAIT, flushing.why)
    return Decision(
        OfflineAction.STOP_NODES, Act.TELL, f"stopping every node to start it on {f.target_image}"
    )


def _resume(f: OfflineFacts) -> Decision:
    if f.marked and f.frozen:
        return Decision(
            OfflineAction.RESUME_WRITES,
            Act.UNFREEZE,
            f"unfreezing {', '.join(f.frozen)}",
            f.frozen,
        )
    if f.marked and f.not_serving:
        return Decision(
            OfflineAction.RESUME_WRITES,
            Act.WAIT,
            f"waiting until every pchannel is served again: {f.not_serving}",
        )
    if f.ours:
        return Decision(OfflineAction.RESUME_WRITES, Act.RESUME, "resuming writes")
    return Decision(OfflineAction.RESUME_WRITES, Act.FINISH, "every node runs the target")


_NODES_GOING = frozenset(
    {OfflineAction.STOP_NODES, OfflineAction.START_NODES, OfflineAction.RESUME_WRITES}
)


def node_step(decision: Decision, back: bool, was_done: bool) -> NodeStep:
    """Where one node is: Pending until the plan points the nodes at the
    target, Restarting until the node is back on it (``back``), then Done
    (``was_done``: an earlier pass said Done)."""
    told = decision.step in _NODES_GOING and decision.act is not Act.TELL
    if back and (told or was_done):
        return NodeStep.DONE
    if told or decision.act is Act.TELL:
        return NodeStep.RESTARTING
    return NodeStep.PENDING


def step_states(
    decision: Decision,
    nodes: Sequence[str],
    previous: Sequence[PlannedStep],
    now: str,
    flush: FlushFacts,
) -> list[PlannedStep]:
    """``status.plan`` of an Offline plan: every step before the one under way
    Done (the flush Done or Skipped, :func:`.offline_flush.step_outcome`), that
    one Running with what it does, the rest Pending; ``started`` kept from
    ``previous`` (set to ``now`` when a step is first seen running)."""
    before = {s.action: s for s in previous}
    order = list(OfflineAction)
    current = order.index(decision.step)
    steps = []
    for index, action in enumerate(order):
        if action is OfflineAction.FLUSH and index < current:
            flushed, message = step_outcome(flush)
            state = StepState.DONE if flushed else StepState.SKIPPED
        elif index < current:
            state, message = StepState.DONE, ""
        elif index == current:
            state, message = StepState.RUNNING, decision.why
        else:
            state, message = StepState.PENDING, ""
        old = before.get(action.value)
        started = (old.started if old is not None else "") or (now if index <= current else "")
        steps.append(
            PlannedStep(
                index=index,
                action=action.value,
                nodes=list(nodes) if action in OFFLINE_NODE_STEPS else [],
                state=state.value,
                message=message,
                started=started if index <= current else "",
            )
        )
    return steps


def done_steps(
    nodes: Sequence[str], previous: Sequence[PlannedStep], now: str, flush: FlushFacts
) -> list[PlannedStep]:
    """``status.plan`` once the plan has finished: every step Done (the flush
    Done or Skipped)."""
    finish = Decision(OfflineAction.RESUME_WRITES, Act.FINISH, "")
    steps = step_states(finish, nodes, previous, now, flush)
    last = steps[-1]
    return [*steps[:-1], last.model_copy(update={"state": StepState.DONE.value})]


ENDED = ("Succeeded", "RolledBack", "Failed")


def orphaned(plan: str, body: Mapping[str, Any] | None) -> str:
    """Why the Offline plan ``plan`` named on a cluster no longer runs it
    ("" while it does): deleted, being deleted, or ended (a plan that
    failed on its spec never gets to resume the writes it stopped)."""
    if body is None:
        return f"UpgradePlan {plan} no longer exists"
    if body.get("metadata", {}).get("deletionTimestamp"):
        return f"UpgradePlan {plan} is being deleted"
    phase = (body.get("status") or {}).get("phase", "")
    return f"UpgradePlan {plan} ended {phase}" if phase in ENDED else ""

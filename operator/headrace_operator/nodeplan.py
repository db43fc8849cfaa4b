"""What to do with the node pods next, as a pure function of what is observed.

:func:`plan_nodes` compares the desired node count and pod template with the
pods that exist and with what the metastore says each node holds, and returns
the actions of this pass. The rules, in order:

* A terminating pod is left alone until it is gone.
* A pod that has terminated (phase ``Failed``/``Succeeded``) is deleted; the
  next pass creates it again.
* A missing pod of a desired ordinal is created.
* Scale-down: the highest excess ordinal is drained first (the coordinator
  moves its pchannels away), and deleted only once it holds none. One drain at
  a time.
* A desired pod whose template changed is replaced: at once if its node holds
  no pchannel, else by drain-then-delete, highest ordinal first, while fewer
  than ``max_unavailable`` desired pods (one unless an UpgradePlan says more,
  never all of them) are draining, missing, not ready or replaced this pass,
  and no scale-down is under way.
* A scale-down drain of an ordinal that is desired again is cancelled; a node
  the metastore still shows frozen after its pod was recreated is unfrozen.
* During an Offline UpgradePlan (``offline``: writes are stopped and the plan
  froze every node) every pod whose template changed is deleted at once,
  without a drain (there is nowhere to drain to: every node goes), and no
  node is unfrozen: the plan unfreezes them once all are back.

A node with no other eligible node to take its pchannels (the last one, or
scaling to zero) counts as drained: waiting could never end.

The safety gates are named pure predicates that say why they block
(:func:`drain_blocked`, :func:`delete_blocked`, :func:`restart_blocked`; ""
when the action may go ahead); what they say lands in ``Progressing``.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping

from headrace.cluster import Assignment
from headrace.coordinator import state
from headrace_operator.builders import node_name


class ActionKind(enum.Enum):
    CREATE = "create"
    DELETE_TERMINATED = "delete-terminated"
    START_DRAIN = "start-drain"
    DELETE_DRAINED = "delete-drained"
    REPLACE_IDLE = "replace-idle"
    STOP_OFFLINE = "stop-offline"
    """Delete a stale pod without a drain: an Offline upgrade stops every node."""
    CANCEL_DRAIN = "cancel-drain"
    UNFREEZE = "unfreeze"


class DrainReason(enum.StrEnum):
    SCALE_DOWN = "scale-down"
    RESTART = "restart"


@dataclasses.dataclass(frozen=True, slots=True)
class PodView:
    """The parts of a node pod the plan looks at."""

    name: str
    ordinal: int
    phase: str = "Pending"
    ready: bool = False
    terminating: bool = False
    template_hash: str = ""
    draining: str = ""
    """Value of the draining annotation ("" when not draining)."""
    image: str = ""
    """Image of the node container, as the pod runs it."""

    @property
    def terminated(self) -> bool:
        return self.phase in ("Failed", "Succeeded")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the metastore says about the nodes."""

    holding: Mapping[str, int]
    """Node id -> pchannels it holds or that are on their way to it."""
    live: frozenset[str]
    """Nodes with a session."""
    frozen: frozenset[str]
    """Nodes frozen or draining (by request or by themselves)."""

    def has_peer(self, node: str) -> bool:
        return any(other != node and other not in self.frozen for other in self.live)

    def drained(self, node: str) -> bool:
        return self.holding.get(node, 0) == 0 or not self.has_peer(node)


def holdings(records: Iterable[Assignment]) -> dict[str, int]:
    """Node -> pchannels it holds or is receiving (from assignment records)."""
    counts: dict[str, int] = {}
    for record in records:
        for node in {state.holder(record), state.destination(record)} - {""}:
            counts[node] = counts.get(node, 0) + 1
    return counts


@dataclasses.dataclass(frozen=True, slots=True)
class Action:
    kind: ActionKind
    ordinal: int
    node: str
    reason: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class NodePlan:
    actions: tuple[Action, ...]
    waiting: tuple[str, ...]
    """Why nothing more could be done this pass (for Progressing)."""

    @property
    def busy(self) -> bool:
        return bool(self.actions or self.waiting)


def plan_nodes(
    cluster: str,
    desired: int,
    template_hashes: Mapping[int, str],
    pods: Mapping[int, PodView],
    facts: NodeFacts | None,
    *,
    max_unavailable: int = 1,
    offline: bool = False,
) -> NodePlan:
    """The node actions of one pass (see the module docstring).

    ``facts`` is None when the metastore is unreachable, which blocks every
    step that needs to know what a node holds. ``max_unavailable``: how many
    desired pods may be out of service at once for restarts. ``offline``: an
    Offline UpgradePlan runs (writes stopped, every node frozen by it).
    """
    actions: list[Action] = []
    waiting: list[str] = []
    live_pods = {o: p for o, p in pods.items() if not p.terminating}
    waiting += [f"pod {p.name} is terminating" for p in pods.values() if p.terminating]
    for pod in live_pods.values():
        if pod.terminated:
            actions.append(Action(ActionKind.DELETE_TERMINATED, pod.ordinal, pod.name, pod.phase))
    usable = {o: p for o, p in live_pods.items() if not p.terminated}
    for ordinal in range(desired):
        if ordinal not in pods:
            actions.append(Action(ActionKind.CREATE, ordinal, node_name(cluster, ordinal)))
    draining = [p for p in usable.values() if p.draining]
    excess = sorted((p for o, p in usable.items() if o >= desired), key=lambda p: -p.ordinal)
    actions += _scale_down(excess, draining, facts, waiting)
    current = [p for o, p in usable.items() if o < desired]
    for pod in current:
        if pod.draining == DrainReason.SCALE_DOWN:
            actions.append(Action(ActionKind.CANCEL_DRAIN, pod.ordinal, pod.name))
        elif (
            not offline
            and not pod.draining
            and facts is not None
            and pod.name in facts.frozen
            and pod.template_hash == template_hashes.get(pod.ordinal)
        ):
            actions.append(Action(ActionKind.UNFREEZE, pod.ordinal, pod.name))
    if offline:
        actions += [
            Action(ActionKind.STOP_OFFLINE, pod.ordinal, pod.name)
            for pod in sorted(current, key=lambda p: -p.ordinal)
            if pod.template_hash != template_hashes.get(pod.ordinal)
        ]
        return NodePlan(tuple(actions), tuple(waiting))
    present = {p.ordinal for p in current}
    not_ready = [p.name for p in current if not p.ready]
    not_ready += [node_name(cluster, o) for o in range(desired) if o not in present]
    actions += _restarts(
        current,
        hashes=template_hashes,
        facts=facts,
        down=Disruption(
            draining=tuple(p.name for p in draining),
            not_ready=tuple(not_ready),
            scaling_down=bool(excess),
        ),
        limit=max(1, min(max_unavailable, desired - 1)),
        waiting=waiting,
    )
    return NodePlan(tuple(actions), tuple(waiting))


@dataclasses.dataclass(frozen=True, slots=True)
class Disruption:
    """Node pods out of service or on their way out, by why."""

    draining: tuple[str, ...] = ()
    """Pods being drained (restart or scale-down)."""
    acted: tuple[str, ...] = ()
    """Pods deleted by this pass's restarts (drained, or idle and replaced)."""
    not_ready: tuple[str, ...] = ()
    """Desired pods missing or not Ready."""
    scaling_down: bool = False

    @property
    def count(self) -> int:
        return len(set(self.draining) | set(self.acted) | set(self.not_ready))

    def with_drain(self, node: str) -> Disruption:
        return dataclasses.replace(self, draining=(*self.draining, node))


def drain_blocked(pod: PodView, draining: list[PodView]) -> str:
    """Why the drain of ``pod`` cannot start now ("" when it can): one drain
    at a time."""
    others = [p for p in draining if p.ordinal != pod.ordinal]
    return f"waits for the drain of {others[0].name}" if others else ""


def delete_blocked(pod: PodView, facts: NodeFacts | None) -> str:
    """Why the draining ``pod`` cannot be deleted yet ("" when it can): only a
    node seen holding no pchannel (or with no peer to take them) goes."""
    if facts is None:
        return f"cannot see whether {pod.name} is drained: metastore unreachable"
    if facts.drained(pod.name):
        return ""
    return f"{facts.holding.get(pod.name, 0)} pchannel(s) still on it"


def restart_blocked(down: Disruption, limit: int) -> str:
    """Why a node holding pchannels cannot start its drain-then-restart now
    ("" when it can): no scale-down under way, and fewer than ``limit`` pods
    draining, down, not ready or acted on this pass."""
    if down.scaling_down:
        return "waits for the scale-down"
    if down.count < limit:
        return ""
    if down.draining:
        return f"waits for the drain of {down.draining[0]}"
    if down.acted:
        return "waits for this pass's other restarts"
    if limit == 1:
        return "waits until every node pod is ready"
    return f"waits: {down.count} node pod(s) not ready (maxUnavailable {limit})"


def _scale_down(
    excess: list[PodView],
    draining: list[PodView],
    facts: NodeFacts | None,
    waiting: list[str],
) -> list[Action]:
    if not excess:
        return []
    pod = excess[0]
    if not pod.draining:
        blocked = drain_blocked(pod, draining)
        if blocked:
            waiting.append(f"scale-down {blocked}")
            return []
        return [Action(ActionKind.START_DRAIN, pod.ordinal, pod.name, DrainReason.SCALE_DOWN)]
    blocked = delete_blocked(pod, facts)
    if blocked:
        waiting.append(f"draining {pod.name}: {blocked}")
        return []
    return [Action(ActionKind.DELETE_DRAINED, pod.ordinal, pod.name, DrainReason.SCALE_DOWN)]


def _restarts(
    current: list[PodView],
    *,
    hashes: Mapping[int, str],
    facts: NodeFacts | None,
    down: Disruption,
    limit: int,
    waiting: list[str],
) -> list[Action]:
    stale = sorted(
        (p for p in current if p.template_hash != hashes.get(p.ordinal)),
        key=lambda p: -p.ordinal,
    )
    if not stale:
        return []
    if facts is None:
        waiting.append("pod template changed; restarts wait for the metastore")
        return []
    actions: list[Action] = []
    for pod in (p for p in stale if p.draining == DrainReason.RESTART):
        blocked = delete_blocked(pod, facts)
        if blocked:
            waiting.append(f"restarting {pod.name}: {blocked}")
        else:
            actions.append(
                Action(ActionKind.DELETE_DRAINED, pod.ordinal, pod.name, DrainReason.RESTART)
            )
    for pod in stale:
        if not pod.draining and facts.holding.get(pod.name, 0) == 0:
            actions.append(Action(ActionKind.REPLACE_IDLE, pod.ordinal, pod.name))
    down = dataclasses.replace(down, acted=(*down.acted, *(a.node for a in actions)))
    quiet = not (down.draining or down.acted)
    for pod in (p for p in stale if not p.draining and facts.holding.get(p.name, 0) > 0):
        blocked = restart_blocked(down, limit)
        if blocked:
            if quiet:
                waiting.append(f"restart of {pod.name} {blocked}")
            break
        actions.append(Action(ActionKind.START_DRAIN, pod.ordinal, pod.name, DrainReason.RESTART))
        down = down.with_drain(pod.name)
    return actions

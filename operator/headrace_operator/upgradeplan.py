"""What an UpgradePlan does next, as pure functions of what is observed (no I/O).

:func:`rolling_plan` orders the nodes still on another image into steps of at
most ``maxUnavailable`` nodes, highest ordinal first and the node that runs the
active coordinator last (alone), and says for each step which pchannels leave
its nodes and where they go: each to the least loaded node that is neither in
the step nor still draining, so they spread over the others and never pile onto
one. Nodes of an earlier step count as back and empty (the balancer refills
them), which is what lets later steps' pchannels land on upgraded nodes; the
pchannels a step moves onto a node leave it again at that node's own step.
:func:`offline_plan` lists the steps of the upgrade with downtime.

The safety gates are named predicates that say why they block ("" when the
plan may go ahead): :func:`cluster_missing`, :func:`competing_plan`,
:func:`plan_paused`, :func:`nothing_to_upgrade`, :func:`pchannels_not_serving`,
:func:`other_nodes_draining`, :func:`drain_overdue`, :func:`version_mismatch`;
:func:`settling` says when a failing gate is only the cluster settling after a
node came back. :func:`node_step` says where one node is in its upgrade.

Message formats (:mod:`headrace.message.formats`): :func:`format_to_switch` is
the format the plan's last step switches the cluster to once every node runs
the target (0: none newer); :func:`source_reads` what the release the plan
started from reads; :func:`rollback_refusal` why a rollback to it is refused
once the cluster writes a format it cannot read.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Iterable, Mapping, Sequence

from headrace.message.formats import DEFAULT_FORMAT, FormatSupport, common_writable, describe
from headrace_operator.models import PlannedMove, PlannedStep


class NodeStep(enum.StrEnum):
    PENDING = "Pending"
    DRAINING = "Draining"
    RESTARTING = "Restarting"
    SOAKING = "Soaking"
    DONE = "Done"


class OfflineAction(enum.StrEnum):
    STOP_WRITES = "stop-writes"
    DRAIN_AND_FENCE = "drain-and-fence"
    FLUSH = "flush"
    STOP_NODES = "stop-nodes"
    START_NODES = "start-nodes"
    RESUME_WRITES = "resume-writes"


RESTART = "restart"
"""The action of every Rolling step."""


@dataclasses.dataclass(frozen=True, slots=True)
class UpgradeNode:
    """One node pod as the plan sees it."""

    name: str
    ordinal: int
    image: str
    ready: bool = False
    registered: bool = False
    """The node has a session in the metastore."""
    version: str = ""
    """The Headrace version the node registered with ("" without a session)."""
    terminating: bool = False
    draining: bool = False
    """The node is frozen or draining in the balancer."""
    problem: str = ""
    """Why its container does not run, as the kubelet says (e.g. ImagePullBackOff)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterView:
    """The observed cluster: node pods, the coordinator, the pchannels."""

    nodes: tuple[UpgradeNode, ...]
    coordinator: str = ""
    """Id of the active coordinator (a node id when a node runs it)."""
    holdings: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Node -> pchannels it holds, sorted."""
    pchannels: tuple[str, ...] = ()
    """Every pchannel of the cluster."""
    serving: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """pchannel -> the live node serving it (ASSIGNED); absent when it is not served."""

    def node(self, name: str) -> UpgradeNode | None:
        return next((n for n in self.nodes if n.name == name), None)


def restart_order(view: ClusterView, target_image: str, max_unavailable: int) -> list[list[str]]:
    """Batches of node names to restart, in order: highest ordinal first, at
    most ``max_unavailable`` a batch, never more than all nodes but one (a
    drain needs somewhere to go), and the coordinator's node last, alone."""
    stale = sorted((n for n in view.nodes if n.image != target_image), key=lambda n: -n.ordinal)
    last = [n.name for n in stale if n.name == view.coordinator]
    rest = [n.name for n in stale if n.name != view.coordinator]
    size = max(1, min(max_unavailable, len(view.nodes) - 1))
    batches = [rest[i : i + size] for i in range(0, len(rest), size)]
    return batches + ([last] if last else [])


def spread_moves(
    leaving: Sequence[str], load: Mapping[str, int], receivers: Iterable[str]
) -> list[PlannedMove]:
    """Each pchannel of ``leaving`` to the receiver with the fewest pchannels
    so far (ties by name); nothing when there is no receiver."""
    counts = {node: load.get(node, 0) for node in receivers}
    moves: list[PlannedMove] = []
    if not counts:
        return moves
    for pchannel in leaving:
        to = min(counts, key=lambda node: (counts[node], node))
        counts[to] += 1
        moves.append(PlannedMove(pchannel=pchannel, to=to))
    return moves


def rolling_plan(view: ClusterView, target_image: str, max_unavailable: int) -> list[PlannedStep]:
    """The Rolling steps (see the module docstring)."""
    placement = {p: node for node, held in view.holdings.items() for p in held}
    steps: list[PlannedStep] = []
    for index, batch in enumerate(restart_order(view, target_image, max_unavailable)):
        load = {node.name: 0 for node in view.nodes}
        for node in placement.values():
            load[node] = load.get(node, 0) + 1
        leaving = sorted(p for p, node in placement.items() if node in batch)
        receivers = [
            n.name
            for n in view.nodes
            if n.name not in batch and not (n.draining and n.image != target_image)
        ]
        moves = spread_moves(leaving, load, receivers)
        placement.update({move.pchannel: move.to for move in moves})
        steps.append(
            PlannedStep(
                index=index,
                action=RESTART,
                nodes=batch,
                moves=moves,
                coordinator=view.coordinator in batch,
            )
        )
    return steps


OFFLINE_NODE_STEPS = frozenset(
    {OfflineAction.DRAIN_AND_FENCE, OfflineAction.STOP_NODES, OfflineAction.START_NODES}
)
"""Offline steps that act on every node (the others act on the cluster)."""


def offline_plan(view: ClusterView) -> list[PlannedStep]:
    """The steps of the upgrade with downtime, every node at once (see
    :mod:`.offline`)."""
    nodes = sorted(n.name for n in view.nodes)
    return [
        PlannedStep(
            index=i, action=action.value, nodes=nodes if action in OFFLINE_NODE_STEPS else []
        )
        for i, action in enumerate(OfflineAction)
    ]


def cluster_missing(cluster: str, exists: bool) -> str:
    return "" if exists else f"StreamingCluster {cluster} does not exist in this namespace"


def competing_plan(cluster: str, active_before: Sequence[str]) -> str:
    """Why this plan waits for another: an older active plan of the same
    cluster (one active plan per cluster)."""
    if not active_before:
        return ""
    return f"UpgradePlan {active_before[0]} is already upgrading cluster {cluster}"


def plan_paused(paused: bool) -> str:
    return "spec.paused is true" if paused else ""


def nothing_to_upgrade(view: ClusterView, target_image: str, target_version: str) -> str:
    """Why there is nothing left to do ("" while a node runs another image or
    has not registered with the target version)."""
    if view.nodes and all(
        n.image == target_image and n.version == target_version for n in view.nodes
    ):
        return f"every node runs {target_image} and registered version {target_version}"
    return ""


def version_mismatch(node: UpgradeNode, target_image: str, target_version: str) -> str:
    """Why a node on the target image is not on the target yet as far as its
    version goes: it registered in the metastore with another version (the
    image does not carry the version the plan names). "" when it matches or
    the node has not registered yet."""
    if node.image != target_image or not node.registered or node.version == target_version:
        return ""
    told = f"version {node.version}" if node.version else "no version"
    return f"{target_image} registered {told}, not the plan's {target_version}"


def settling(last_back: datetime.datetime | None, now: datetime.datetime, timeout_s: int) -> bool:
    """Whether a failing gate is still expected to clear by itself: a node of
    the plan came back less than ``drainTimeoutSeconds`` ago, and the balancer
    is bringing pchannels back to it. Then the plan waits (Progressing) rather
    than being Blocked."""
    return last_back is not None and (now - last_back).total_seconds() < timeout_s


def stuck_nodes(view: ClusterView, target_image: str) -> list[str]:
    """Nodes not on the target that are not Ready and hold nothing (e.g. on
    an image that never becomes Ready): restarting them takes nothing away, so
    they go first and no gate holds them."""
    return [
        n.name
        for n in view.nodes
        if n.image != target_image
        and n.image
        and not n.ready
        and not n.terminating
        and not view.holdings.get(n.name)
    ]


def pchannels_not_serving(view: ClusterView) -> str:
    """Why a node may not start draining: a pchannel unassigned or not served."""
    idle = [p for p in view.pchannels if p not in view.serving]
    if not idle:
        return ""
    shown = ", ".join(idle[:5]) + (" ..." if len(idle) > 5 else "")
    return f"{len(idle)} pchannel(s) not assigned and serving: {shown}"


def other_nodes_draining(view: ClusterView, ours: Iterable[str]) -> str:
    """Why the plan waits: a node outside the plan's current step drains."""
    mine = set(ours)
    others = sorted(n.name for n in view.nodes if n.draining and n.name not in mine)
    return f"node {others[0]} is draining (not by this plan)" if others else ""


def drain_overdue(
    node: UpgradeNode, started: datetime.datetime | None, now: datetime.datetime, timeout_s: int
) -> str:
    """Why a node's upgrade is stuck: its drain and restart took longer than
    ``drainTimeoutSeconds`` (with the kubelet's reason when there is one)."""
    if started is None or (now - started).total_seconds() <= timeout_s:
        return ""
    why = f": {node.problem}" if node.problem else ""
    return f"node {node.name} has not come back on the target image within {timeout_s}s{why}"


def node_step(
    node: UpgradeNode,
    *,
    target_image: str,
    target_version: str,
    told: bool,
    holding: int,
    soaked: bool,
) -> NodeStep:
    """Where ``node`` is: ``told`` says its pod template carries the target
    image; ``soaked`` that it has been Ready on it for ``soakSeconds``. A node
    on the target image is back only once Ready, registered with the target
    version and unfrozen."""
    if node.image == target_image and not node.terminating:
        back = node.ready and node.registered and node.version == target_version
        if not back or node.draining:
            return NodeStep.RESTARTING
        return NodeStep.DONE if soaked else NodeStep.SOAKING
    if not told:
        return NodeStep.PENDING
    return NodeStep.DRAINING if holding > 0 else NodeStep.RESTARTING


def format_to_switch(nodes: Mapping[str, FormatSupport], current: int) -> int:
    """The format every registered node reads and writes, when newer than the
    cluster's ``current``: what the plan's last step switches to; 0 when the
    target release writes nothing newer (or no node is registered)."""
    best = common_writable(nodes)
    return best if best > current else 0


def source_reads(
    nodes: Mapping[str, FormatSupport],
    images: Mapping[str, str],
    source_image: str,
    recorded: Iterable[int] = (),
) -> frozenset[int]:
    """The formats the release the plan started from (``source_image``) reads:
    common to the registered nodes running it; else what the status recorded
    while some did; else format 1 (every release before formats were
    advertised read only that)."""
    sources = [support.reads for node, support in nodes.items() if images.get(node) == source_image]
    if sources:
        return frozenset.intersection(*sources)
    return frozenset(recorded) or frozenset({DEFAULT_FORMAT})


def rollback_refusal(written: Iterable[int], reads: Iterable[int], image: str) -> str:
    """Why rolling back to ``image``, whose release reads ``reads``, is refused
    while the cluster's logs may hold the formats ``written`` ("" when it may)."""
    unreadable = set(written) - set(reads)
    if not unreadable:
        return ""
    return (
        f"rollback to {image} refused: the cluster writes message format "
        f"{describe(unreadable)} since the format switch, and the release of {image} reads "
        f"only {describe(reads)}, so it could not read the logs; roll forward, or restore "
        "the cluster from before the switch"
    )

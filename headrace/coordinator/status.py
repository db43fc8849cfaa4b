"""``headrace status``: a pure summary of the assignment layout."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from headrace.cluster import Assignment, AssignmentState, NodeInfo
from headrace.coordinator import state
from headrace.coordinator.control import NodeControl


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSummary:
    node_id: str
    address: str
    frozen: bool
    draining: bool
    pchannels: tuple[str, ...]
    """pchannels on this node or on their way to it."""


@dataclasses.dataclass(frozen=True, slots=True)
class PChannelSummary:
    pchannel: str
    state: str
    node: str
    term: int
    target: str
    node_alive: bool
    reason: str = ""
    """Why it waits (an UNAVAILABLE record's reason: no eligible node, and why)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LayoutSummary:
    nodes: tuple[NodeSummary, ...]
    pchannels: tuple[PChannelSummary, ...]
    ready: bool
    """Every pchannel is ASSIGNED to a live node."""
    balanced: bool
    """pchannel counts of unfrozen nodes differ by at most one."""
    not_ready: tuple[str, ...]
    """pchannels not ASSIGNED to a live node."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def lines(self) -> list[str]:
        """Human-readable table."""
        out = [
            f"{len(self.nodes)} node(s), {len(self.pchannels)} pchannel(s), "
            f"ready={self.ready} balanced={self.balanced}"
        ]
        for node in self.nodes:
            flags = "draining" if node.draining else "frozen" if node.frozen else ""
            out.append(
                f"node {node.node_id} {node.address} {flags} count={len(node.pchannels)}".rstrip()
            )
        for item in self.pchannels:
            extra = f" -> {item.target}" if item.target else ""
            gone = "" if item.node_alive or not item.node else " (node gone)"
            out.append(
                f"{item.pchannel} {item.state} node={item.node or '-'} term={item.term}"
                f"{extra}{gone}"
            )
            if item.reason:
                out.append(f"  {item.pchannel} waits: {item.reason}")
        return out


def layout_summary(
    assignments: Iterable[Assignment],
    nodes: Iterable[NodeInfo],
    controls: Mapping[str, NodeControl] | None = None,
) -> LayoutSummary:
    """Summarise records and live nodes (``controls``: freeze/drain requests)."""
    controls = controls or {}
    live = {info.node_id: info for info in nodes}
    records = sorted(assignments, key=lambda record: record.pchannel)
    per_node: dict[str, list[str]] = {node: [] for node in live}
    for record in records:
        place = state.destination(record)
        if place in per_node:
            per_node[place].append(record.pchannel)
    node_rows = []
    for node_id in sorted(live):
        control = controls.get(node_id, NodeControl())
        node_rows.append(
            NodeSummary(
                node_id=node_id,
                address=live[node_id].address,
                frozen=live[node_id].frozen or control.frozen or control.draining,
                draining=control.draining,
                pchannels=tuple(per_node[node_id]),
            )
        )
    rows = tuple(
        PChannelSummary(
            pchannel=record.pchannel,
            state=record.state.value,
            node=record.node,
            term=record.term,
            target=record.target if record.state is AssignmentState.UNASSIGNING else "",
            node_alive=record.node in live,
            reason=record.reason if record.state is AssignmentState.UNAVAILABLE else "",
        )
        for record in records
    )
    not_ready = tuple(
        record.pchannel
        for record in records
        if record.state is not AssignmentState.ASSIGNED or record.node not in live
    )
    counts = [len(row.pchannels) for row in node_rows if not row.frozen]
    return LayoutSummary(
        nodes=tuple(node_rows),
        pchannels=rows,
        ready=bool(records) and not not_ready,
        balanced=not counts or max(counts) - min(counts) <= 1,
        not_ready=not_ready,
    )

"""Operations behind the CLI's ``status``, ``move`` and ``drain``.

``cluster_status`` merges what the metastore records (owner, term, state) with
what each node reports (its WALs' last timetick), so a pchannel's ``lag_ms``
is how far its last timetick trails the wall clock: a serving WAL ticks every
sync interval, so a large lag means a stuck or unreachable owner.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from headrace import errors, tso
from headrace.client.client import HeadraceClient
from headrace.client.manager import ManagerClient, NodeWALs, WALStatus
from headrace.client.status import status
from headrace.cluster import DEFAULT_CLUSTER, AssignmentState, Keys
from headrace.coordinator.control import ClusterAdmin
from headrace.coordinator.snapshot import ClusterSnapshot, read_snapshot, wait_for
from headrace.metastore.factory import open_metastore

__all__ = ["HeadraceClient", "cluster_status", "request_drain", "request_move"]


async def _node_wals(address: str, timeout: float) -> NodeWALs | None:
    manager = ManagerClient(address, timeout=timeout)
    try:
        return await manager.list_wals(timeout=timeout)
    except errors.HeadraceError:
        return None
    finally:
        await manager.close()


async def cluster_status(
    metastore_url: str, cluster: str = DEFAULT_CLUSTER, *, probe_timeout: float = 2.0
) -> dict[str, Any]:
    """Nodes and pchannels with owner, term, state and lag, ready for JSON."""
    report = await status(metastore_url, cluster)
    nodes: list[dict[str, Any]] = list(report["nodes"])  # type: ignore[call-overload]
    pchannels: list[dict[str, Any]] = list(report["pchannels"])  # type: ignore[call-overload]
    listed = await asyncio.gather(*(_node_wals(n["address"], probe_timeout) for n in nodes))
    now = tso.now_ms()
    by_pchannel: dict[str, tuple[str, WALStatus]] = {}
    for node, wals in zip(nodes, listed, strict=True):
        node["reachable"] = wals is not None
        node["pchannels"] = sorted(w.pchannel for w in wals.wals) if wals else []
        for wal in wals.wals if wals else []:
            by_pchannel[wal.pchannel] = (node["node_id"], wal)
    for row in pchannels:
        held = by_pchannel.get(row["pchannel"])
        row["node"] = row.get("owner", "")
        owned = held[1] if held is not None and held[0] == row["owner"] else None
        # What the owner itself reports: SERVING, or UNAVAILABLE with the
        # error (a WAL whose broker is down), ...; empty if it was not asked.
        row["wal_state"] = owned.state if owned is not None else ""
        row["wal_error"] = owned.stats.get("error", "") if owned is not None else ""
        if owned is not None and owned.last_timetick:
            row["lag_ms"] = max(0, now - tso.physical_ms(owned.last_timetick))
        else:
            row["lag_ms"] = None
        row["lag"] = "-" if row["lag_ms"] is None else f"{row['lag_ms']}ms"
    report["nodes"] = nodes
    report["pchannels"] = pchannels
    return report


async def request_move(
    metastore_url: str,
    pchannel: str,
    to_node: str,
    *,
    cluster: str = DEFAULT_CLUSTER,
    timeout: float = 30.0,
) -> dict[str, Any]:
    """Ask the coordinator for a graceful handoff and wait for its outcome."""
    store = await open_metastore(metastore_url)
    try:
        before = await read_snapshot(store, Keys(cluster))
        record = before.assignments.get(pchannel)
        if record is None:
            raise errors.NotFound(f"unknown pchannel {pchannel!r}")
        if to_node not in before.nodes:
            raise errors.NotFound(f"node {to_node!r} is not registered (alive) in the cluster")
        start = time.monotonic()
        await ClusterAdmin(store, cluster).request_move(pchannel, to_node)

        def moved(snap: ClusterSnapshot) -> bool:
            rec = snap.assignments.get(pchannel)
            return (
                rec is not None
                and rec.node == to_node
                and rec.term > record.term
                and rec.state is AssignmentState.ASSIGNED
            )

        final = await wait_for(store, cluster, moved, timeout)
        after = final.assignments[pchannel]
        return {
            "pchannel": pchannel,
            "from": record.node,
            "to": after.node,
            "old_term": record.term,
            "term": after.term,
            "state": after.state.value,
            "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
        }
    finally:
        await store.close()


async def request_drain(
    metastore_url: str,
    node: str,
    *,
    cluster: str = DEFAULT_CLUSTER,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Freeze ``node``, move every pchannel off it, and wait until none is left."""
    store = await open_metastore(metastore_url)
    try:
        admin = ClusterAdmin(store, cluster)
        before = await read_snapshot(store, Keys(cluster))
        if node not in before.nodes:
            raise errors.NotFound(f"node {node!r} is not registered (alive) in the cluster")
        held = sorted(p for p, r in before.assignments.items() if r.node == node)
        start = time.monotonic()
        await admin.drain_node(node)

        def drained(snap: ClusterSnapshot) -> bool:
            return all(
                r.node != node and r.state is AssignmentState.ASSIGNED
                for p, r in snap.assignments.items()
                if p in held
            ) and not any(r.node == node for r in snap.assignments.values())

        final = await wait_for(store, cluster, drained, timeout)
        return {
            "node": node,
            "moved": len(held),
            "pchannels": {p: final.assignments[p].node for p in held},
            "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
        }
    finally:
        await store.close()

"""Operations behind the CLI's ``status``, ``move`` and ``drain``.

``cluster_status`` merges what the metastore records (owner, term, state) with
what each node reports (its WALs' last timetick), so a pchannel's ``lag_ms``
is how far its last timetick trails the wall clock: a serving WAL with
anything pending ticks every sync interval, so a large lag means a stuck or
unreachable owner. A WAL with nothing pending is not ticked (a node's idle
pchannels cost nothing) and says so (stat ``idle``): its lag is 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pyarrow as pa

from headrace import errors, tso
from headrace.client.client import HeadraceClient
from headrace.client.discovery import ChannelPool
from headrace.client.manager import ManagerClient, NodeWALs, WALStatus
from headrace.client.reading import AsOf, ReadOptions
from headrace.client.status import status, writes_report
from headrace.cluster import DEFAULT_CLUSTER, Assignment, AssignmentState, Keys, TLSMode
from headrace.coordinator import writestop
from headrace.coordinator.control import (
    ClusterAdmin,
    ControlKeys,
    MoveProgress,
    MoveSubmitted,
    move_progress,
)
from headrace.coordinator.formats import (
    read_cluster_format,
    registered_formats,
    set_cluster_format,
)
from headrace.coordinator.snapshot import ClusterSnapshot, read_snapshot, wait_for
from headrace.message.formats import common_writable
from headrace.metastore.contract import Get, KeyValue, Metastore
from headrace.metastore.factory import open_metastore
from headrace.table.collections import CollectionSpec
from headrace.tls import ClientTLS

log = logging.getLogger(__name__)

__all__ = [
    "HeadraceClient",
    "check_cluster",
    "cluster_status",
    "create_collection",
    "describe_collection",
    "drop_collection",
    "flush_collection",
    "list_collections",
    "read_collection",
    "request_drain",
    "request_move",
    "request_undrain",
    "resume_writes",
    "set_balancer",
    "stop_writes",
    "writes_status",
]


async def _node_wals(node: dict[str, Any], pool: ChannelPool, timeout: float) -> NodeWALs | None:
    """What a running node reports of its WALs; None if it is not running or answers not."""
    if not node["alive"]:
        return None
    try:
        manager = ManagerClient(node["address"], pool.get(node["address"]), timeout=timeout)
        return await manager.list_wals(timeout=timeout)
    except errors.HeadraceError as exc:
        log.info("node %s did not list its WALs: %s", node["node_id"], exc)
        return None


async def cluster_status(
    metastore_url: str, cluster: str = DEFAULT_CLUSTER, *, probe_timeout: float = 2.0
) -> dict[str, Any]:
    """Nodes and pchannels with owner, term, state and lag, ready for JSON.

    NotFound at once if the metastore holds no such cluster."""
    await check_cluster(metastore_url, cluster)
    report = await status(metastore_url, cluster)
    nodes: list[dict[str, Any]] = list(report["nodes"])  # type: ignore[call-overload]
    pchannels: list[dict[str, Any]] = list(report["pchannels"])  # type: ignore[call-overload]
    modes = {n["address"]: TLSMode(n.get("tls") or TLSMode.OFF) for n in nodes if n["alive"]}
    pool = ChannelPool(tls=ClientTLS.from_env())
    pool.tls_mode = lambda address: modes.get(address, TLSMode.OFF)
    try:
        listed = await asyncio.gather(*(_node_wals(n, pool, probe_timeout) for n in nodes))
    finally:
        await pool.close()
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
        if owned is not None and owned.stats.get("idle") == "True":
            row["lag_ms"] = 0
        elif owned is not None and owned.last_timetick:
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
    poll_interval: float = 0.1,
) -> dict[str, Any]:
    """Ask the coordinator for a graceful handoff and wait for its outcome.

    A pchannel already on ``to_node`` answers at once (``moved`` false); a
    request the coordinator drops (the target became ineligible, or the
    pchannel went elsewhere meanwhile) raises Conflict as soon as it is seen.
    """
    async with _cluster_store(metastore_url, cluster) as store:
        keys = Keys(cluster)
        before = await read_snapshot(store, keys)
        if pchannel not in before.assignments:
            raise errors.NotFound(f"unknown pchannel {errors.quoted(pchannel)}")
        if to_node not in before.nodes:
            raise errors.NotFound(
                f"node {errors.quoted(to_node)} is not registered (alive) in the cluster"
            )
        start = time.monotonic()
        submitted = await ClusterAdmin(store, cluster).request_move(pchannel, to_node)
        record = submitted.record or before.assignments[pchannel]
        outcome = {"pchannel": pchannel, "from": record.node, "old_term": record.term}
        if not submitted.requested:
            return {
                **outcome,
                "to": to_node,
                "term": record.term,
                "state": record.state.value,
                "moved": False,
                "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
            }
        after = await _await_move(store, keys, submitted, timeout, poll_interval)
        return {
            **outcome,
            "to": after.node,
            "term": after.term,
            "state": after.state.value,
            "moved": True,
            "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
        }


async def _await_move(
    store: Metastore, keys: Keys, submitted: MoveSubmitted, timeout: float, poll_interval: float
) -> Assignment:
    """Poll one atomic read of the record and the request until the move is
    done (its record) or dropped (Conflict); Unavailable after ``timeout``."""
    name = submitted.pchannel
    term_before = submitted.record.term if submitted.record is not None else 0
    request_key = ControlKeys(keys).move(name)
    deadline = time.monotonic() + timeout
    while True:
        result = await store.txn([], [Get(keys.pchannel(name)), Get(request_key)])
        record_kvs, request_kvs = result.gets
        record = Assignment.from_json(record_kvs[0].value) if record_kvs else None
        progress = move_progress(record, bool(request_kvs), submitted.to, term_before)
        if progress is MoveProgress.DONE and record is not None:
            return record
        if progress is MoveProgress.DROPPED:
            now = "no record" if record is None else f"{record.state.value} on {record.node or '-'}"
            raise errors.Conflict(
                f"the coordinator dropped the move of {name} to {submitted.to} "
                f"(the target is no longer eligible, or the pchannel moved meanwhile); "
                f"{name} is now {now}"
            )
        if time.monotonic() >= deadline:
            raise errors.Unavailable(
                f"{name} did not reach {submitted.to} within {timeout:g}s (is a coordinator "
                "running? `headrace status` shows its leader)"
            )
        await asyncio.sleep(poll_interval)


async def request_drain(
    metastore_url: str,
    node: str,
    *,
    cluster: str = DEFAULT_CLUSTER,
    timeout: float = 60.0,
) -> dict[str, Any]:
    """Freeze ``node``, move every pchannel off it, and wait until none is left.

    The node stays frozen (it gets no pchannels) until :func:`request_undrain`.
    """
    async with _cluster_store(metastore_url, cluster) as store:
        admin = ClusterAdmin(store, cluster)
        before = await read_snapshot(store, Keys(cluster))
        if node not in before.nodes:
            raise errors.NotFound(
                f"node {errors.quoted(node)} is not registered (alive) in the cluster"
            )
        held = sorted(p for p, r in before.assignments.items() if r.node == node)
        refusal = drain_refusal(node, held, before)
        if refusal is not None:
            raise refusal
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
            "frozen": True,
            "elapsed_ms": round((time.monotonic() - start) * 1000, 1),
        }


def drain_refusal(
    node: str, held: list[str], snapshot: ClusterSnapshot
) -> errors.HeadraceError | None:
    """Why draining ``node`` cannot succeed now (pure), or None: it holds
    pchannels and no other live node may take them (all others frozen,
    draining or gone). Refused at once instead of waiting out the timeout
    (a single-node cluster's preStop drain, a whole cluster being deleted)."""
    if not held:
        return None
    peers = [n for n, live in snapshot.live_nodes().items() if n != node and not live.frozen]
    if peers:
        return None
    return errors.Unavailable(
        f"node {errors.quoted(node)} holds {len(held)} pchannel(s) ({', '.join(held)}) and no "
        "other live, unfrozen node can take them; nothing was moved"
    )


async def request_undrain(
    metastore_url: str, node: str, *, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    """Unfreeze ``node`` (ending a drain): the balancer gives it pchannels again.

    NotFound if the node is neither running nor frozen (a mistyped id).
    """
    async with _cluster_store(metastore_url, cluster) as store:
        admin = ClusterAdmin(store, cluster)
        control = await admin.node_control(node)
        registered = await store.get(Keys(cluster).node(node)) is not None
        if control is None and not registered:
            raise errors.NotFound(
                f"node {errors.quoted(node)} is neither registered nor frozen in the cluster"
            )
        was = "not frozen"
        if control is not None and (control.frozen or control.draining):
            was = "draining" if control.draining else "frozen"
        await admin.set_frozen(node, False)
        return {"node": node, "was": was, "frozen": False}


async def set_balancer(
    metastore_url: str, *, suspended: bool, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    """Suspend (no balancing moves; drains and requested moves go on) or resume."""
    async with _cluster_store(metastore_url, cluster) as store:
        await ClusterAdmin(store, cluster).suspend_balance(suspended)
    return {"balancer": "suspended" if suspended else "active"}


async def set_message_format(
    metastore_url: str, version: int, *, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    """Switch the cluster's message format (``headrace format set``); refused
    (InvalidArgument, saying why) unless every registered node reads and
    writes ``version`` and it is not below the current one."""
    async with _cluster_store(metastore_url, cluster) as store:
        switch = await set_cluster_format(
            store, Keys(cluster), version, reason="headrace format set"
        )
    return {
        "message_format": switch.version,
        "previous": switch.previous,
        "changed": switch.changed,
    }


async def message_formats(metastore_url: str, cluster: str = DEFAULT_CLUSTER) -> dict[str, Any]:
    """The cluster's message format and what each registered node reads and writes."""
    async with _cluster_store(metastore_url, cluster) as store:
        keys = Keys(cluster)
        current = await read_cluster_format(store, keys)
        nodes = await registered_formats(store, keys)
    return {
        "message_format": current.version,
        "previous": current.previous,
        "changed_at": current.changed_at,
        "reason": current.reason,
        "nodes": {
            node: {"reads": sorted(s.reads), "writes": sorted(s.writes)}
            for node, s in sorted(nodes.items())
        },
        "common_writable": common_writable(nodes),
    }


async def stop_writes(
    metastore_url: str, reason: str, *, by: str = "cli", cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    """Stop writes cluster-wide (idempotent: an earlier stop stays as it was)."""
    async with _cluster_store(metastore_url, cluster) as store:
        keys = Keys(cluster)
        state = await writestop.stop_writes(store, keys, reason, by)
        return writes_report(state, list((await read_snapshot(store, keys)).nodes))


async def resume_writes(metastore_url: str, *, cluster: str = DEFAULT_CLUSTER) -> dict[str, Any]:
    """Let writes flow again; ``was_stopped`` says whether they were stopped."""
    async with _cluster_store(metastore_url, cluster) as store:
        was = await writestop.resume_writes(store, Keys(cluster))
    return {"stopped": False, "was_stopped": was}


async def writes_status(metastore_url: str, *, cluster: str = DEFAULT_CLUSTER) -> dict[str, Any]:
    """Whether writes are stopped, why, and what each live node reports."""
    async with _cluster_store(metastore_url, cluster) as store:
        keys = Keys(cluster)
        state = await writestop.read_stop(store, keys)
        return writes_report(state, list((await read_snapshot(store, keys)).nodes))


async def list_collections(
    metastore_url: str, cluster: str = DEFAULT_CLUSTER, *, include_dropped: bool = False
) -> list[dict[str, Any]]:
    """The cluster's collections, described, ready for JSON."""
    async with _connected(metastore_url, cluster) as client:
        found = await client.list_collections(include_dropped=include_dropped)
    return [c.describe() for c in found]


async def describe_collection(
    metastore_url: str, name: str, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    async with _connected(metastore_url, cluster) as client:
        described = (await client.describe_collection(name)).describe()
        described["table"] = await client.table_location(name)
        return described


async def create_collection(
    metastore_url: str, spec: CollectionSpec, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    """See :meth:`HeadraceClient.create_collection` (idempotent)."""
    async with _connected(metastore_url, cluster) as client:
        created = await client.create_collection(
            spec.name, spec.schema, spec.primary_key, spec.shards
        )
    return created.describe()


async def drop_collection(
    metastore_url: str, name: str, cluster: str = DEFAULT_CLUSTER
) -> dict[str, Any]:
    async with _connected(metastore_url, cluster) as client:
        return (await client.drop_collection(name)).describe()


async def flush_collection(
    metastore_url: str,
    collection: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    wait: bool = False,
    timeout: float | None = 300.0,
) -> dict[str, Any]:
    """See :meth:`HeadraceClient.flush`."""
    async with _connected(metastore_url, cluster) as client:
        outcome = await client.flush(collection, wait=wait, timeout=timeout)
    return outcome.describe()


async def read_collection(
    metastore_url: str,
    collection: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    as_of: AsOf = "latest",
    columns: Sequence[str] | None = None,
    filter: str | None = None,
    options: ReadOptions | None = None,
) -> tuple[dict[str, object], pa.Table]:
    """See :meth:`HeadraceClient.read`; also what the read decided (``as_of``,
    the snapshot, each pchannel's tail start)."""
    async with (
        _connected(metastore_url, cluster) as client,
        client.snapshot_read(
            collection, as_of=as_of, columns=columns, filter=filter, options=options
        ) as reading,
    ):
        rows = await reading.table()
        return reading.planned.describe(), rows


async def compact_collection(
    metastore_url: str,
    collection: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    wait: bool = False,
    timeout: float | None = 300.0,
) -> dict[str, Any]:
    """See :meth:`HeadraceClient.compact`."""
    async with _connected(metastore_url, cluster) as client:
        outcome = await client.compact(collection, wait=wait, timeout=timeout)
    return outcome.describe()


@contextlib.asynccontextmanager
async def _connected(metastore_url: str, cluster: str) -> AsyncIterator[HeadraceClient]:
    """A connected client of ``cluster``, NotFound at once if there is none."""
    await check_cluster(metastore_url, cluster)
    async with HeadraceClient(metastore_url, cluster) as client:
        yield client


async def check_cluster(metastore_url: str, cluster: str = DEFAULT_CLUSTER) -> None:
    """NotFound at once unless the metastore exists and holds ``cluster``'s
    config (a mistyped URL or cluster name); nothing is created."""
    async with _cluster_store(metastore_url, cluster):
        return


@contextlib.asynccontextmanager
async def _cluster_store(metastore_url: str, cluster: str) -> AsyncIterator[Metastore]:
    """The metastore (opened, never created), checked to hold ``cluster``."""
    keys = Keys(cluster)
    store = await open_metastore(metastore_url, create=False)
    try:
        if await store.get(keys.config) is None:
            raise _no_cluster(metastore_url, cluster, await store.get_prefix("/headrace/"))
        yield store
    finally:
        await store.close()


def _no_cluster(metastore_url: str, cluster: str, kvs: list[KeyValue]) -> errors.NotFound:
    """The error for a metastore without ``cluster`` (pure), naming the clusters it holds."""
    names = sorted(
        {
            parts[2]
            for parts in (kv.key.split("/") for kv in kvs)
            if len(parts) == 4 and parts[3] == "config"
        }
    )
    held = f"it holds cluster(s) {', '.join(names)}" if names else "it holds no cluster at all"
    return errors.NotFound(
        f"metastore {errors.quoted(metastore_url)} has no cluster {errors.quoted(cluster)}: "
        f"{held} (check --metastore and --cluster; a standalone prints its URL when ready)"
    )

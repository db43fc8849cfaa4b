"""``headrace status``: nodes and pchannels of a cluster as the metastore records them."""

from __future__ import annotations

import asyncio
from typing import TypeVar

from headrace import errors
from headrace.client.discovery import parse_record
from headrace.cluster import (
    DEFAULT_CLUSTER,
    Assignment,
    ClusterConfig,
    ClusterFormat,
    Keys,
    LogFormats,
    NodeInfo,
)
from headrace.coordinator import control as control_mod
from headrace.coordinator import writestop
from headrace.coordinator.control import BalanceControl, ControlKeys, NodeControl
from headrace.coordinator.status import layout_summary
from headrace.metastore.contract import Get, KeyValue
from headrace.metastore.factory import open_metastore
from headrace.table.records import CheckpointRecord, checkpoints_prefix
from headrace.wal.retention import RetentionRecord, retention_prefix


async def status(
    metastore_url: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    timeout: float = 10.0,
) -> dict[str, object]:
    """A JSON-ready summary: config, nodes, pchannels with owner, term and state,
    flush checkpoint, unflushed bytes and truncation point.

    A node is ``frozen`` if it says so or an operator froze or drained it
    (``draining``); a frozen or draining node that is not running is listed
    too (``alive`` false), so a forgotten freeze stays visible. ``balancer``
    is ``active`` or ``suspended``.
    """
    keys = Keys(cluster)
    control = ControlKeys(keys)
    try:
        async with asyncio.timeout(timeout):
            metastore = await open_metastore(metastore_url, create=False)
            try:
                result = await metastore.txn(
                    [],
                    [
                        Get(keys.config),
                        Get(keys.nodes, prefix=True),
                        Get(keys.pchannels, prefix=True),
                        Get(keys.leader),
                        Get(control.requests, prefix=True),
                        Get(checkpoints_prefix(keys), prefix=True),
                        Get(retention_prefix(keys), prefix=True),
                        Get(keys.format),
                        Get(keys.log_formats, prefix=True),
                        Get(writestop.stop_key(keys)),
                        Get(writestop.acks_prefix(keys), prefix=True),
                    ],
                )
            finally:
                await metastore.close()
    except TimeoutError:
        raise errors.Unavailable(
            f"metastore {metastore_url} did not answer within {timeout:g}s"
        ) from None
    config_kvs, node_kvs, pchannel_kvs, leader_kvs, request_kvs, cp_kvs, kept_kvs = result.gets[:7]
    format_kvs, log_format_kvs, stop_kvs, ack_kvs = result.gets[7:]
    cluster_format = ClusterFormat.from_json(format_kvs[0].value) if format_kvs else ClusterFormat()
    log_formats = {
        kv.key[len(keys.log_formats) :]: LogFormats.from_json(kv.value) for kv in log_format_kvs
    }
    config = parse_record(ClusterConfig, config_kvs[0].value) if config_kvs else None
    nodes = [parse_record(NodeInfo, kv.value) for kv in node_kvs]
    records = {a.pchannel: a for a in (parse_record(Assignment, kv.value) for kv in pchannel_kvs)}
    controls = _under(request_kvs, control.node_controls, NodeControl)
    balance = _under(request_kvs, control.requests, BalanceControl).get("balance")
    layout = {n.node_id: n for n in layout_summary(records.values(), nodes, controls).nodes}
    checkpoints = {r.pchannel: r for r in (CheckpointRecord.from_json(k.value) for k in cp_kvs)}
    kept = {r.pchannel: r for r in (RetentionRecord.from_json(k.value) for k in kept_kvs)}
    names = list(config.pchannels) if config is not None else []
    names += sorted(set(records) - set(names))
    pchannels: list[dict[str, object]] = []
    for name in names:
        record = records.get(name)
        pchannels.append(
            {
                "pchannel": name,
                "state": record.state.value if record else "UNKNOWN",
                "owner": record.node if record else "",
                "address": record.address if record else "",
                "term": record.term if record else 0,
                "target": record.target if record else "",
                "reason": record.reason if record else "",
                "formats": list(log_formats.get(name, LogFormats()).written),
                **_retention(checkpoints.get(name), kept.get(name)),
            }
        )
    return {
        "cluster": cluster,
        "revision": result.revision,
        "configured": config is not None,
        "wal_backend": config.wal_backend if config is not None else "",
        "coordinator": leader_kvs[0].value.decode(errors="replace") if leader_kvs else "",
        "balancer": "suspended" if balance is not None and balance.suspended else "active",
        "message_format": cluster_format.version,
        "message_format_changed": {
            "previous": cluster_format.previous,
            "at": cluster_format.changed_at,
            "reason": cluster_format.reason,
        },
        "nodes": [
            {
                "node_id": n.node_id,
                "address": n.address,
                "alive": True,
                "frozen": layout[n.node_id].frozen,
                "draining": layout[n.node_id].draining,
                "version": n.version,
                "reads": list(n.reads),
                "writes": list(n.writes),
                "started_at": n.started_at,
                "tls": n.tls.value,
            }
            for n in nodes
        ]
        + [
            {
                "node_id": node_id,
                "address": "",
                "alive": False,
                "frozen": c.frozen or c.draining,
                "draining": c.draining,
                "version": "",
                "reads": [],
                "writes": [],
                "started_at": 0.0,
            }
            for node_id, c in sorted(controls.items())
            if node_id not in layout and (c.frozen or c.draining)
        ],
        "pchannels": pchannels,
        "writes": writes_report(
            writestop.StopState(
                stop=writestop.WriteStop.from_json(stop_kvs[0].value) if stop_kvs else None,
                revision=stop_kvs[0].mod_revision if stop_kvs else 0,
                acks=_under(ack_kvs, writestop.acks_prefix(keys), writestop.WriteStopAck),
            ),
            [n.node_id for n in nodes],
        ),
    }


def writes_report(state: writestop.StopState, live: list[str]) -> dict[str, object]:
    """The write stop, ready for JSON (pure): ``stopped``, and while stopped
    its reason, author and time, each live node's acknowledgement and appends
    in flight, and ``drained`` ("" once every live node obeys with nothing in
    flight, else why not)."""
    stop = state.stop
    if stop is None:
        return {"stopped": False}
    nodes = {}
    for node in sorted(live):
        ack = state.acks.get(node)
        obeys = ack is not None and ack.stop_revision == state.revision
        nodes[node] = {
            "acknowledged": obeys,
            "in_flight": ack.in_flight if ack is not None and obeys else None,
        }
    return {
        "stopped": True,
        "reason": stop.reason,
        "by": stop.by,
        "since": stop.since,
        "revision": state.revision,
        "nodes": nodes,
        "drained": writestop.drained(state, live),
    }


def _retention(
    checkpoint: CheckpointRecord | None, kept: RetentionRecord | None
) -> dict[str, object]:
    """A pchannel's flush checkpoint (from its record), and what its owner's
    last housekeeping pass recorded: unflushed bytes (None before any pass),
    the position the backend was truncated below, and why it keeps the rest."""
    return {
        "checkpoint": checkpoint.position if checkpoint is not None else "",
        "unflushed_bytes": kept.unflushed_bytes if kept is not None else None,
        "truncated_below": kept.truncated_below if kept is not None else "",
        "retention": kept.reason if kept is not None else "",
    }


_C = TypeVar("_C", NodeControl, BalanceControl, writestop.WriteStopAck)


def _under(kvs: list[KeyValue], prefix: str, model: type[_C]) -> dict[str, _C]:
    """Records directly under ``prefix`` by the rest of their key."""
    found: dict[str, _C] = {}
    for kv in kvs:
        name = kv.key[len(prefix) :]
        if kv.key.startswith(prefix) and name and "/" not in name:
            found[name] = control_mod.parse_record(model, kv.value)
    return found

"""``headrace status``: nodes and pchannels of a cluster as the metastore records them."""

from __future__ import annotations

import asyncio

from headrace import errors
from headrace.client.discovery import parse_record
from headrace.cluster import DEFAULT_CLUSTER, Assignment, ClusterConfig, Keys, NodeInfo
from headrace.metastore.contract import Get
from headrace.metastore.factory import open_metastore


async def status(
    metastore_url: str,
    cluster: str = DEFAULT_CLUSTER,
    *,
    timeout: float = 10.0,
) -> dict[str, object]:
    """A JSON-ready summary: config, nodes, pchannels with owner, term and state."""
    keys = Keys(cluster)
    try:
        async with asyncio.timeout(timeout):
            metastore = await open_metastore(metastore_url)
            try:
                result = await metastore.txn(
                    [],
                    [
                        Get(keys.config),
                        Get(keys.nodes, prefix=True),
                        Get(keys.pchannels, prefix=True),
                        Get(keys.leader),
                    ],
                )
            finally:
                await metastore.close()
    except TimeoutError:
        raise errors.Unavailable(
            f"metastore {metastore_url} did not answer within {timeout:g}s"
        ) from None
    config_kvs, node_kvs, pchannel_kvs, leader_kvs = result.gets
    config = parse_record(ClusterConfig, config_kvs[0].value) if config_kvs else None
    nodes = [parse_record(NodeInfo, kv.value) for kv in node_kvs]
    records = {a.pchannel: a for a in (parse_record(Assignment, kv.value) for kv in pchannel_kvs)}
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
            }
        )
    return {
        "cluster": cluster,
        "revision": result.revision,
        "configured": config is not None,
        "wal_backend": config.wal_backend if config is not None else "",
        "coordinator": leader_kvs[0].value.decode(errors="replace") if leader_kvs else "",
        "nodes": [
            {
                "node_id": n.node_id,
                "address": n.address,
                "frozen": n.frozen,
                "version": n.version,
                "started_at": n.started_at,
            }
            for n in nodes
        ],
        "pchannels": pchannels,
    }

"""`headrace status` of a node's idle pchannel: not ticked, and not lagging."""

from __future__ import annotations

import asyncio

from headrace.client.api import cluster_status
from headrace.message.types import Message, MessageType
from tests.node.harness import Cluster, until

P = "pchannel-000"


async def test_an_idle_pchannel_is_reported_idle_with_no_lag(cluster: Cluster) -> None:
    await cluster.configure([P])
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    assert node.manager is not None
    wal = node.manager.get(P)
    await until(lambda: wal.stats()["idle"] is True)
    tick = wal.last_timetick
    await asyncio.sleep(0.3)  # thirty tick intervals: none of them ticks an idle WAL
    assert wal.last_timetick == tick
    report = await cluster_status(cluster.url, cluster.keys.cluster)
    (row,) = [r for r in report["pchannels"] if r["pchannel"] == P]
    assert row["wal_state"] == "SERVING" and row["lag_ms"] == 0, row

    # Data makes it busy until the tick after it is written.
    await wal.append_many([Message(MessageType.INSERT, "v", b"x")])
    assert wal.stats()["idle"] is False
    await until(lambda: wal.stats()["idle"] is True)
    assert wal.last_timetick > tick

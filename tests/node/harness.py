"""An in-process cluster for node and client tests.

A SQLite metastore in a temporary directory, streaming nodes on 127.0.0.1
with port 0 sharing one in-memory WAL store (so a pchannel can move between
them), and the coordinator's part played by writing assignment records
directly.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
from prometheus_client.parser import text_string_to_metric_families

from headrace.cluster import NEW_CLUSTER_ROUTING, Assignment, AssignmentState, ClusterConfig, Keys
from headrace.message.formats import RELEASE_FORMATS, FormatSupport
from headrace.metastore.contract import Compare, Metastore, Put
from headrace.metastore.factory import open_metastore
from headrace.node.server import NodeConfig, StreamingNode
from headrace.node.services import Limits
from headrace.tls import ServerTLS
from headrace.wal.framework import WALOptions
from headrace.wal.memory import MemoryBackend, MemoryStore

HANG_GUARD = 20.0
"""Seconds after which a wait in a test is a hang, not slowness."""


def error_details(exc: grpc.aio.AioRpcError) -> dict[str, Any]:
    """The Headrace error a node put in a call's trailing metadata."""
    metadata: Any = exc.trailing_metadata()
    for key, value in metadata:
        if key == "headrace-error":
            details = json.loads(value)
            assert isinstance(details, dict)
            return details
    raise AssertionError(f"no headrace-error in the trailing metadata of {exc}")


async def until(condition: Callable[[], bool], timeout: float = HANG_GUARD) -> None:
    """Wait (polling) until ``condition()`` holds; TimeoutError after ``timeout``."""
    async with asyncio.timeout(timeout):
        while True:
            if condition():
                return
            await asyncio.sleep(0.01)


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample a node's metrics endpoint at ``address`` returns, by name and labels."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def record(
    state: AssignmentState, node: str, term: int, pchannel: str = "pchannel-000"
) -> Assignment:
    """An assignment record of ``pchannel`` (tests' shorthand)."""
    return Assignment(pchannel=pchannel, state=state, term=term, node=node)


@dataclasses.dataclass
class Cluster:
    url: str
    metastore: Metastore
    keys: Keys
    store: MemoryStore = dataclasses.field(default_factory=MemoryStore)
    nodes: dict[str, StreamingNode] = dataclasses.field(default_factory=dict)

    async def start_node(
        self,
        node_id: str,
        *,
        wal_options: WALOptions | None = None,
        limits: Limits | None = None,
        session_ttl: float = 3.0,
        metrics_listen: str = "",
        tls: ServerTLS | None = None,
        auth_file: Path | None = None,
        formats: FormatSupport = RELEASE_FORMATS,
    ) -> StreamingNode:
        config = NodeConfig(
            node_id=node_id,
            metastore_url=self.url,
            cluster=self.keys.cluster,
            wal_backend="memory",
            wal_options=wal_options or WALOptions(timetick_interval_ms=20),
            limits=limits or Limits(),
            session_ttl=session_ttl,
            shutdown_grace=0.5,
            metrics_listen=metrics_listen,
            tls=tls,
            auth_file=auth_file,
            formats=formats,
        )
        node = StreamingNode(config, backend=MemoryBackend(self.store))
        await node.start()
        self.nodes[node_id] = node
        return node

    async def configure(self, pchannels: list[str]) -> None:
        await self.metastore.put(
            self.keys.config,
            ClusterConfig(pchannels=pchannels, routing=NEW_CLUSTER_ROUTING).to_json(),
        )

    async def record(self, pchannel: str) -> Assignment | None:
        kv = await self.metastore.get(self.keys.pchannel(pchannel))
        if kv is None:
            return None
        record = Assignment.from_json(kv.value)
        assert isinstance(record, Assignment)
        return record

    async def write(self, record: Assignment) -> None:
        """Write ``record`` with compare-and-swap, as the coordinator would."""
        key = self.keys.pchannel(record.pchannel)
        current = await self.metastore.get(key)
        guard = Compare.mod_revision_is(key, current.mod_revision if current else 0)
        result = await self.metastore.txn([guard], [Put(key, record.to_json())])
        assert result.succeeded, f"{key} changed under the test"

    async def wait_state(self, pchannel: str, state: AssignmentState, term: int) -> Assignment:
        async with asyncio.timeout(HANG_GUARD):
            while True:
                record = await self.record(pchannel)
                if record is not None and record.state is state and record.term == term:
                    return record
                await asyncio.sleep(0.02)

    async def assign(self, pchannel: str, node_id: str, term: int) -> Assignment:
        """ASSIGNING to ``node_id`` under ``term``; returns once it is ASSIGNED."""
        await self.write(
            Assignment(
                pchannel=pchannel,
                state=AssignmentState.ASSIGNING,
                term=term,
                node=node_id,
                updated_at=time.time(),
            )
        )
        return await self.wait_state(pchannel, AssignmentState.ASSIGNED, term)

    async def start_pair(self, pchannel: str) -> None:
        """``pchannel`` alone, served by node-a under term 1, with node-b running idle."""
        await self.configure([pchannel])
        await self.start_node("node-a")
        await self.start_node("node-b")
        await self.assign(pchannel, "node-a", 1)

    async def unassign(self, pchannel: str, target: str = "") -> Assignment:
        """UNASSIGNING from the current owner; returns once it is UNASSIGNED."""
        current = await self.record(pchannel)
        assert current is not None
        await self.write(
            current.model_copy(update={"state": AssignmentState.UNASSIGNING, "target": target})
        )
        return await self.wait_state(pchannel, AssignmentState.UNASSIGNED, current.term)

    async def move(self, pchannel: str, target: str) -> Assignment:
        """A graceful handoff to ``target`` under the next term."""
        released = await self.unassign(pchannel, target)
        return await self.assign(pchannel, target, released.term + 1)

    async def close(self) -> None:
        for node in self.nodes.values():
            await node.stop()
        await self.metastore.close()


async def make_cluster(tmp_path: Path, name: str = "test") -> AsyncIterator[Cluster]:
    url = f"sqlite://{tmp_path}/meta.db"
    metastore = await open_metastore(url)
    cluster = Cluster(url, metastore, Keys(name))
    try:
        yield cluster
    finally:
        await cluster.close()

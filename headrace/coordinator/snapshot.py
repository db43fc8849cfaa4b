"""A parsed read of the cluster's coordination keys, and waiting on it.

:func:`read_snapshot` reads the config, node sessions, assignment records,
requests and node-reported status with one ``get_prefix`` per prefix (not one
atomic read: writers use compare-and-swap, so a stale part only delays a
decision by one pass). Malformed records are listed in ``corrupt`` and left out,
never overwritten by a guess.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping
from typing import TypeVar

import pydantic

from headrace import errors
from headrace.cluster import (
    DEFAULT_CLUSTER,
    Assignment,
    ClusterConfig,
    ClusterFormat,
    Keys,
    LogFormats,
    NodeInfo,
)
from headrace.coordinator.control import (
    BalanceControl,
    ControlKeys,
    MoveRequest,
    NodeControl,
    PChannelStatus,
)
from headrace.coordinator.reconcile import LiveNode
from headrace.metastore.contract import KeyValue, Metastore


@dataclasses.dataclass(frozen=True, slots=True)
class NodeSession:
    lease: int
    create_revision: int
    mod_revision: int


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    config: ClusterConfig | None = None
    nodes: dict[str, NodeInfo] = dataclasses.field(default_factory=dict)
    assignments: dict[str, Assignment] = dataclasses.field(default_factory=dict)
    revisions: dict[str, int] = dataclasses.field(default_factory=dict)
    """Key -> mod revision, for every record read (compare-and-swap input)."""
    sessions: dict[str, NodeSession] = dataclasses.field(default_factory=dict)
    """Node id -> its session key's lease and revisions."""
    moves: dict[str, MoveRequest] = dataclasses.field(default_factory=dict)
    node_controls: dict[str, NodeControl] = dataclasses.field(default_factory=dict)
    balance: BalanceControl = dataclasses.field(default_factory=BalanceControl)
    statuses: dict[str, PChannelStatus] = dataclasses.field(default_factory=dict)
    cluster_format: ClusterFormat = dataclasses.field(default_factory=ClusterFormat)
    log_formats: dict[str, LogFormats] = dataclasses.field(default_factory=dict)
    """pchannel -> the formats written in its log (absent: format 1 only)."""
    corrupt: tuple[str, ...] = ()

    @property
    def pchannels(self) -> tuple[str, ...]:
        return () if self.config is None else tuple(self.config.pchannels)

    def live_nodes(self, session_revisions: Mapping[str, int] | None = None) -> dict[str, LiveNode]:
        """Nodes with a session, with frozen/draining from NodeInfo and requests.

        ``session_revisions``: the revision each node's current session began
        at, when known better than the key's create revision (a node that
        re-registered under a new lease before its old key expired).
        """
        known = session_revisions or {}
        live: dict[str, LiveNode] = {}
        for node_id, info in self.nodes.items():
            control = self.node_controls.get(node_id, NodeControl())
            live[node_id] = LiveNode(
                info=info,
                frozen=info.frozen or control.frozen or control.draining,
                draining=control.draining,
                session_revision=known.get(node_id, self._created(node_id)),
                session_lease=self.sessions[node_id].lease if node_id in self.sessions else 0,
            )
        return live

    def _created(self, node_id: str) -> int:
        session = self.sessions.get(node_id)
        return 0 if session is None else session.create_revision


_M = TypeVar("_M", bound=pydantic.BaseModel)


class _Reader:
    """Parses records, collecting revisions and the keys of malformed ones."""

    def __init__(self) -> None:
        self.corrupt: list[str] = []
        self.revisions: dict[str, int] = {}

    def one(self, kv: KeyValue | None, model: type[_M]) -> _M | None:
        if kv is None:
            return None
        try:
            parsed = model.model_validate_json(kv.value)
        except pydantic.ValidationError:
            self.corrupt.append(kv.key)
            return None
        self.revisions[kv.key] = kv.mod_revision
        return parsed

    def under(self, items: list[KeyValue], prefix: str, model: type[_M]) -> dict[str, _M]:
        """Records directly under ``prefix``, by the rest of their key."""
        parsed: dict[str, _M] = {}
        for kv in items:
            name = kv.key[len(prefix) :]
            if not kv.key.startswith(prefix) or not name or "/" in name:
                continue
            record = self.one(kv, model)
            if record is not None:
                parsed[name] = record
        return parsed


async def read_snapshot(metastore: Metastore, keys: Keys) -> ClusterSnapshot:
    """Read and parse everything the coordinator decides on."""
    control = ControlKeys(keys)
    reader = _Reader()
    config = reader.one(await metastore.get(keys.config), ClusterConfig)
    node_kvs = await metastore.get_prefix(keys.nodes)
    nodes = reader.under(node_kvs, keys.nodes, NodeInfo)
    sessions = {
        kv.key[len(keys.nodes) :]: NodeSession(kv.lease, kv.create_revision, kv.mod_revision)
        for kv in node_kvs
    }
    records = await metastore.get_prefix(keys.pchannels)
    assignments = reader.under(records, keys.pchannels, Assignment)
    requests = await metastore.get_prefix(control.requests)
    balance_kv = next((kv for kv in requests if kv.key == control.balance), None)
    statuses = await metastore.get_prefix(control.statuses)
    cluster_format = reader.one(await metastore.get(keys.format), ClusterFormat)
    log_formats = await metastore.get_prefix(keys.log_formats)
    return ClusterSnapshot(
        config=config,
        nodes=nodes,
        assignments=assignments,
        moves=reader.under(requests, control.moves, MoveRequest),
        node_controls=reader.under(requests, control.node_controls, NodeControl),
        balance=reader.one(balance_kv, BalanceControl) or BalanceControl(),
        statuses=reader.under(statuses, control.statuses, PChannelStatus),
        cluster_format=cluster_format or ClusterFormat(),
        log_formats=reader.under(log_formats, keys.log_formats, LogFormats),
        revisions=reader.revisions,
        sessions={node: sessions[node] for node in nodes},
        corrupt=tuple(reader.corrupt),
    )


async def wait_for(
    metastore: Metastore,
    cluster: str,
    predicate: Callable[[ClusterSnapshot], bool],
    timeout: float,
    *,
    poll_interval: float = 0.1,
) -> ClusterSnapshot:
    """Re-read the cluster until ``predicate`` holds; return that snapshot.

    Raises :class:`headrace.errors.Unavailable` (retryable) after ``timeout``
    seconds without the predicate holding.
    """
    keys = Keys(cluster or DEFAULT_CLUSTER)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        snapshot = await read_snapshot(metastore, keys)
        if predicate(snapshot):
            return snapshot
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise errors.Unavailable(
                f"cluster {cluster!r} did not reach the awaited state within {timeout}s"
            )
        await asyncio.sleep(min(poll_interval, remaining))

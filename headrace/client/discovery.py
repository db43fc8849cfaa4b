"""Where the pchannels are: the cluster state as a client follows it.

:class:`ClusterView` lists the cluster config, the nodes and the assignment
records once, then follows every change with a watch (re-listing after a
metastore outage). Callers wait on it for an owner to appear or change.
:class:`ChannelPool` keeps one gRPC channel per node address.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from typing import TypeVar

import grpc

from headrace import errors
from headrace.cluster import (
    Assignment,
    AssignmentState,
    ClusterConfig,
    Keys,
    NodeInfo,
    TLSMode,
)
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.metastore.contract import EventType, Get, KeyValue, Metastore, Watch, WatchEvent
from headrace.tls import ENV_CA, ENV_CERT, ENV_KEY, ClientTLS

log = logging.getLogger(__name__)

R = TypeVar("R", Assignment, NodeInfo, ClusterConfig)
T = TypeVar("T")


def parse_record(cls: type[R], data: bytes) -> R:
    record = cls.from_json(data)
    if not isinstance(record, cls):
        raise errors.CorruptData(f"malformed {cls.__name__} record")
    return record


@dataclasses.dataclass(frozen=True, slots=True)
class Owner:
    """The node serving a pchannel, as recorded."""

    pchannel: str
    node: str
    address: str
    term: int


def owner_of(record: Assignment | None, nodes: dict[str, NodeInfo]) -> Owner | None:
    """The serving owner an assignment record names, if it is ASSIGNED."""
    if record is None or record.state is not AssignmentState.ASSIGNED or not record.node:
        return None
    address = record.address
    if not address and record.node in nodes:
        address = nodes[record.node].address
    if not address:
        return None
    return Owner(record.pchannel, record.node, address, record.term)


class ClusterView:
    """A live copy of one cluster's config, nodes and assignments."""

    def __init__(self, metastore: Metastore, keys: Keys, *, retry_seconds: float = 0.5) -> None:
        self.metastore = metastore
        self.keys = keys
        self.retry_seconds = retry_seconds
        self.config: ClusterConfig | None = None
        self.nodes: dict[str, NodeInfo] = {}
        self.assignments: dict[str, Assignment] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._watch: Watch | None = None
        self.failure: errors.HeadraceError | None = None
        """Why the view stopped following the cluster, if its follower failed."""

    async def start(self) -> None:
        """List once (raising Unavailable if the metastore does not answer), then follow."""
        revision = await self.refresh()
        self._task = guarded_task(
            self._follow(revision), "headrace-cluster-view", self._on_failure, logger=log
        )

    async def _on_failure(self, failure: TaskFailure) -> None:
        """The view no longer follows the cluster: every wait on it fails from
        now on with the cause, instead of waiting on a record that never changes."""
        self.failure = errors.HeadraceError(
            f"the client stopped following cluster {self.keys.root}: {failure.describe()}"
        )
        self._notify()

    async def close(self) -> None:
        # Closing the watch ends the loop even if a cancellation gets lost in it.
        self._closing.set()
        self._notify()
        if self._watch is not None:
            await self._watch.close()
        if self._task is not None:
            await cancel_and_settle(
                [self._task], what=f"closing the view of cluster {self.keys.root}", logger=log
            )
            self._task = None

    async def refresh(self) -> int:
        """Re-read everything now; the store revision read at."""
        keys = self.keys
        result = await self.metastore.txn(
            [], [Get(keys.config), Get(keys.nodes, prefix=True), Get(keys.pchannels, prefix=True)]
        )
        config_kvs, node_kvs, pchannel_kvs = result.gets
        self.config = None
        for kv in config_kvs:
            self._apply(kv.key, kv)
        self.nodes = {}
        for kv in node_kvs:
            self._apply(kv.key, kv)
        self.assignments = {}
        for kv in pchannel_kvs:
            self._apply(kv.key, kv)
        self._notify()
        return result.revision

    async def _follow(self, revision: int) -> None:
        while not self._closing.is_set():
            try:
                watch = await self.metastore.watch_prefix(
                    self.keys.root + "/", start_revision=revision + 1
                )
                self._watch = watch
                try:
                    if self._closing.is_set():
                        return
                    async for event in watch:
                        self._on_event(event)
                finally:
                    self._watch = None
                    await watch.close()
            except errors.HeadraceError as exc:
                log.warning("following cluster %s failed: %s", self.keys.root, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.retry_seconds):
                    await self._closing.wait()
            if self._closing.is_set():
                return
            try:
                revision = await self.refresh()
            except errors.HeadraceError as exc:
                log.warning("re-reading cluster %s failed: %s", self.keys.root, exc)

    def _on_event(self, event: WatchEvent) -> None:
        self._apply(event.kv.key, event.kv if event.type is EventType.PUT else None)
        self._notify()

    def _apply(self, key: str, kv: KeyValue | None) -> None:
        keys = self.keys
        try:
            if key == keys.config:
                self.config = None if kv is None else parse_record(ClusterConfig, kv.value)
            elif key.startswith(keys.nodes):
                node_id = key[len(keys.nodes) :]
                if kv is None:
                    self.nodes.pop(node_id, None)
                else:
                    self.nodes[node_id] = parse_record(NodeInfo, kv.value)
            elif key.startswith(keys.pchannels):
                pchannel = key[len(keys.pchannels) :]
                if kv is None:
                    self.assignments.pop(pchannel, None)
                else:
                    self.assignments[pchannel] = parse_record(Assignment, kv.value)
        except errors.CorruptData as exc:
            log.error("ignoring %s: %s", key, exc)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # -------------------------------------------------------------- queries

    def pchannels(self) -> list[str]:
        return list(self.config.pchannels) if self.config is not None else []

    def route(self, vchannel: str) -> str:
        """The pchannel of ``vchannel``; Unavailable while no config is known."""
        if self.config is None:
            raise errors.Unavailable("the cluster has no pchannels configured yet")
        return self.config.route(vchannel)

    def owner(self, pchannel: str) -> Owner | None:
        return owner_of(self.assignments.get(pchannel), self.nodes)

    def tls_mode(self, address: str) -> TLSMode:
        """How the node registered at ``address`` is reached (OFF if unknown)."""
        modes = {node.tls for node in self.nodes.values() if node.address == address}
        return max(modes, key=_STRICTNESS.index, default=TLSMode.OFF)

    def successor(self, owner: Owner) -> Owner | None:
        """The ASSIGNED owner of ``owner``'s pchannel under a higher term, if recorded."""
        current = self.owner(owner.pchannel)
        return current if current is not None and current.term > owner.term else None

    async def wait_for(self, probe: Callable[[], T | None], deadline: float, what: str) -> T:
        """Wait until ``probe()`` returns something; Unavailable at ``deadline``,
        Closed (not retryable) once the view is closed, :attr:`failure` once
        the view stopped following the cluster.

        ``deadline`` is a :func:`time.monotonic` time.
        """
        while True:
            if self._closing.is_set():
                raise errors.Closed("the client was closed", retryable=False)
            if self.failure is not None:
                raise self.failure
            value = probe()
            if value is not None:
                return value
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise errors.Unavailable(f"timed out waiting for {what}")
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await changed.wait()

    async def wait_route(self, vchannel: str, deadline: float) -> str:
        def probe() -> str | None:
            return self.route(vchannel) if self.config is not None else None

        return await self.wait_for(probe, deadline, f"the config of cluster {self.keys.root}")

    async def wait_owner(
        self, pchannel: str, deadline: float, *, avoid: Owner | None = None
    ) -> Owner:
        """An ASSIGNED owner of ``pchannel``, other than ``avoid`` if given."""

        def probe() -> Owner | None:
            owner = self.owner(pchannel)
            return None if owner is None or owner == avoid else owner

        return await self.wait_for(probe, deadline, f"an owner of {pchannel}")

    async def wait_successor(self, owner: Owner) -> Owner:
        """Wait, without end, until :meth:`successor` names one; that owner.

        A stalled owner (paused, partitioned) answers nothing and ends no
        stream, so a stream open to it must be given up once this returns:
        the successor fenced ``owner``'s term in the backend before serving.
        """
        return await self.wait_for(
            lambda: self.successor(owner),
            math.inf,
            f"an owner of {owner.pchannel} above term {owner.term}",
        )


_STRICTNESS = (TLSMode.OFF, TLSMode.TLS, TLSMode.MUTUAL)


class ChannelPool:
    """One gRPC channel per node address, created on first use: over TLS when
    the node advertises it (``NodeInfo.tls``), with the client's ``tls``."""

    def __init__(
        self, max_message_bytes: int = 64 * 1024 * 1024, tls: ClientTLS | None = None
    ) -> None:
        self._options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
        ]
        self.tls = tls
        self._credentials: grpc.ChannelCredentials | None = None
        self._channels: dict[str, grpc.aio.Channel] = {}
        self.tls_mode: Callable[[str], TLSMode] = lambda address: TLSMode.OFF
        """How the node at an address is reached (the client's view sets it)."""

    def get(self, address: str) -> grpc.aio.Channel:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._open(address)
            self._channels[address] = channel
        return channel

    def _open(self, address: str) -> grpc.aio.Channel:
        mode = self.tls_mode(address)
        if mode is TLSMode.OFF:
            return grpc.aio.insecure_channel(address, options=self._options)
        if self.tls is None:
            raise errors.InvalidArgument(
                f"the node at {address} requires TLS: give the client a CA to trust "
                f"(ClientOptions.tls, or {ENV_CA} for the CLI)"
            )
        if mode is TLSMode.MUTUAL and self.tls.cert is None:
            raise errors.InvalidArgument(
                f"the node at {address} requires a client certificate (mutual TLS): give the "
                f"client one (ClientTLS.cert and .key, or {ENV_CERT} and {ENV_KEY})"
            )
        if self._credentials is None:
            self._credentials = self.tls.credentials()
        options = [*self._options, *self.tls.channel_options()]
        return grpc.aio.secure_channel(address, self._credentials, options=options)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)

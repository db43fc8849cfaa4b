"""The core coordinator, run inside the operator: one per StreamingCluster.

Each :class:`ClusterRunner` owns one metastore connection for its cluster and
runs :class:`headrace.coordinator.Coordinator` on it. The coordinator campaigns
for the cluster's election lease in the metastore, so when two operator
replicas both run a runner for the same cluster exactly one of them leads and
the other waits as a hot standby; a replica that dies loses its lease after the
TTL and the other takes over. Nothing about leadership is decided here.

The runner also hands the reconcile steps a :class:`MetastoreControl`: reads of
the cluster's coordination state and requests (drain, undrain, move) through
:class:`headrace.coordinator.ClusterAdmin`, which whichever coordinator leads
carries out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Sequence

from headrace import errors
from headrace.client import HeadraceClient
from headrace.client.flushing import FlushRequested, merge_targets, read_checkpoints
from headrace.cluster import Keys
from headrace.coordinator import (
    ClusterAdmin,
    Coordinator,
    CoordinatorConfig,
    read_snapshot,
    writestop,
)
from headrace.coordinator.election import current_leader
from headrace.coordinator.formats import FormatSwitch, set_cluster_format
from headrace.coordinator.snapshot import ClusterSnapshot
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.table.records import CheckpointRecord
from headrace.wal.registry import load_id_classes
from headrace_operator.builders import ClusterRef
from headrace_operator.models import StreamingClusterSpec
from spark_apps.channels import read_channels
from spark_apps.schedule import Channel, Unreadable

log = logging.getLogger(__name__)

Opener = Callable[[str], Awaitable[Metastore]]


@dataclasses.dataclass(frozen=True, slots=True)
class RunnerConfig:
    metastore_url: str
    cluster: str
    """Cluster name in the metastore."""
    pchannels: tuple[str, ...]
    wal_backend: str
    lease_ttl_s: float
    retry_s: float = 2.0
    """Wait before reconnecting or restarting a failed coordinator."""
    relist_interval_s: float = 2.0
    balance_interval_s: float = 5.0


def runner_config(ref: ClusterRef, spec: StreamingClusterSpec) -> RunnerConfig:
    """The coordinator settings a StreamingCluster's spec implies."""
    return RunnerConfig(
        metastore_url=spec.metastore.url(),
        cluster=ref.metastore_cluster,
        pchannels=tuple(spec.pchannel_names),
        wal_backend=spec.wal.backend,
        lease_ttl_s=float(spec.lease_ttl_seconds),
    )


def cluster_key(namespace: str, name: str) -> str:
    """``namespace/name`` of a StreamingCluster: the key of its runner in
    :class:`CoordinatorRunners` and of its pass lock in the handlers."""
    return f"{namespace}/{name}"


def runner_key(ref: ClusterRef) -> str:
    return cluster_key(ref.namespace, ref.name)


class MetastoreControl:
    """:class:`~.interfaces.ClusterControl` over a metastore connection."""

    def __init__(self, metastore: Metastore, cluster: str, runner: ClusterRunner | None) -> None:
        self.metastore = metastore
        self.keys = Keys(cluster)
        self.admin = ClusterAdmin(metastore, cluster)
        self.runner = runner

    async def snapshot(self) -> ClusterSnapshot:
        return await read_snapshot(self.metastore, self.keys)

    async def leader(self) -> str:
        try:
            info = await current_leader(self.metastore, self.keys)
        except errors.CorruptData as exc:
            log.warning("%s", exc)
            return ""
        return "" if info is None else info.coordinator_id

    async def drain(self, node: str) -> None:
        await self.admin.drain_node(node)

    async def undrain(self, node: str) -> None:
        await self.admin.set_frozen(node, False)

    async def move(self, pchannel: str, node: str) -> None:
        await self.admin.request_move(pchannel, node)

    async def set_format(self, version: int, reason: str) -> FormatSwitch:
        return await set_cluster_format(self.metastore, self.keys, version, reason=reason)

    async def freeze(self, node: str) -> None:
        await self.admin.set_frozen(node, True)

    async def write_stop(self) -> writestop.StopState:
        return await writestop.read_stop(self.metastore, self.keys)

    async def stop_writes(self, reason: str, by: str) -> writestop.StopState:
        return await writestop.stop_writes(self.metastore, self.keys, reason, by)

    async def resume_writes(self) -> bool:
        return await writestop.resume_writes(self.metastore, self.keys)

    async def flush_channels(self) -> list[Channel | Unreadable]:
        load_id_classes()  # the seals' positions are ids of the cluster's WAL backend
        return await read_channels(self.metastore, self.keys)

    async def request_flush(self) -> FlushRequested:
        client = HeadraceClient(
            f"the metastore of {self.keys.cluster}", self.keys.cluster, metastore=self.metastore
        )
        async with client:
            collections = [c.name for c in await client.list_collections()]
            outcomes = [await client.flush(name, wait=False) for name in collections]
        return FlushRequested(tuple(collections), merge_targets(o.targets for o in outcomes))

    async def checkpoints(self, pchannels: Sequence[str]) -> dict[str, CheckpointRecord | None]:
        load_id_classes()  # the checkpoints' positions are ids of the cluster's WAL backend
        return await read_checkpoints(self.metastore, self.keys, list(pchannels))

    def coordinator_error(self) -> str:
        return "" if self.runner is None else self.runner.error

    def candidate_id(self) -> str:
        return "" if self.runner is None else self.runner.coordinator_id


class ClusterRunner:
    """Connects to a cluster's metastore and keeps its coordinator running."""

    def __init__(
        self, config: RunnerConfig, coordinator_id: str, opener: Opener = open_metastore
    ) -> None:
        self.config = config
        self.coordinator_id = coordinator_id
        self.opener = opener
        self.error = ""
        self.coordinator: Coordinator | None = None
        self._metastore: Metastore | None = None
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"coordinator {self.config.cluster}")

    @property
    def is_leader(self) -> bool:
        return self.coordinator is not None and self.coordinator.is_leader

    def control(self) -> MetastoreControl | None:
        """Metastore access for the steps; None until connected."""
        if self._metastore is None:
            return None
        return MetastoreControl(self._metastore, self.config.cluster, self)

    async def _wait(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)

    async def _connect(self) -> Metastore | None:
        while not self._stop.is_set():
            try:
                return await self.opener(self.config.metastore_url)
            except errors.HeadraceError as exc:
                self.error = f"cannot open the metastore {self.config.metastore_url}: {exc}"
                log.warning("%s", self.error)
            await self._wait(self.config.retry_s)
        return None

    async def _run(self) -> None:
        metastore = await self._connect()
        if metastore is None:
            return
        self._metastore = metastore
        cfg = self.config
        coordinator_config = CoordinatorConfig(
            pchannels=cfg.pchannels,
            wal_backend=cfg.wal_backend,
            coordinator_id=self.coordinator_id,
            lease_ttl_s=cfg.lease_ttl_s,
            relist_interval_s=cfg.relist_interval_s,
            balance_interval_s=cfg.balance_interval_s,
            transition_timeout_s=max(10.0, 2 * cfg.lease_ttl_s),
        )
        try:
            while not self._stop.is_set():
                self.coordinator = Coordinator(metastore, cfg.cluster, coordinator_config)
                try:
                    self.error = ""
                    await self.coordinator.run(self._stop)
                except errors.HeadraceError as exc:
                    self.error = f"coordinator of {cfg.cluster} stopped: {exc}"
                    log.error("%s", self.error)
                    await self._wait(cfg.retry_s * (1 if exc.retryable else 5))
        finally:
            self.coordinator = None
            self._metastore = None
            with contextlib.suppress(errors.HeadraceError):
                await metastore.close()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None


class CoordinatorRunners:
    """The runners of this operator process, keyed by ``namespace/name``."""

    def __init__(self, identity: str, opener: Opener = open_metastore) -> None:
        self.identity = identity
        self.opener = opener
        self._runners: dict[str, ClusterRunner] = {}
        self._lock = asyncio.Lock()

    def get(self, key: str) -> ClusterRunner | None:
        return self._runners.get(key)

    async def ensure(self, key: str, config: RunnerConfig) -> ClusterRunner:
        """The running runner of ``key``, (re)started when its config changed."""
        async with self._lock:
            runner = self._runners.get(key)
            if runner is not None and runner.config == config:
                return runner
            if runner is not None:
                log.info("restarting the coordinator of %s: its settings changed", key)
                await runner.stop()
            runner = ClusterRunner(config, f"{self.identity}/{key}", self.opener)
            runner.start()
            self._runners[key] = runner
            return runner

    async def stop(self, key: str) -> None:
        async with self._lock:
            runner = self._runners.pop(key, None)
        if runner is not None:
            await runner.stop()

    async def stop_all(self) -> None:
        async with self._lock:
            runners = list(self._runners.values())
            self._runners.clear()
        await asyncio.gather(*(runner.stop() for runner in runners))

"""The streaming node process: gRPC server, session, assignment reactor.

:class:`StreamingNode` ties the parts together. ``start()`` opens the
metastore and the WAL backend, serves gRPC, registers the node's session
(NodeInfo under ``Keys.node(node_id)``) and follows the assignment records.

A node id is held by one live process at a time: registration binds the key
only if no other live session holds it, waiting :func:`registration_wait` for
the lease of a crashed predecessor to expire, and otherwise fails with
:class:`headrace.errors.InUse` (the CLI exits with status 2). Two processes of
one node id would follow the same assignments and write the same WALs under
the same terms.
``stop()`` shuts down gracefully: stop taking work, finish in-flight appends,
drain and close every WAL, revoke the session, stop the server.

The node's long-running tasks (the assignment reactor, the session
supervisor) are guarded (:mod:`headrace.guarded`). If one fails, the node
cannot keep its promise to follow its assignment records: the failure is
logged with its traceback, health turns NOT_SERVING for good, :attr:`ended`
is set (:attr:`fatal` says why), and :func:`run_node` stops the node and
raises it, so the process exits non-zero and its supervisor (the standalone,
Kubernetes) starts a fresh one.
Restarting the task in place was rejected: the failure is a defect that left
the reactor's per-pchannel state and the held WALs in a state nobody planned
for, and a fresh process rebuilds everything from the records (its WALs are
fenced by the next term if the coordinator moves them meanwhile).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import _async as health_aio
from grpc_health.v1 import health_pb2, health_pb2_grpc

import headrace
from headrace import errors, runtime
from headrace.cluster import DEFAULT_CLUSTER, Keys, NodeInfo, TLSMode
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task, wait_any
from headrace.message.formats import RELEASE_FORMATS, FormatSupport
from headrace.metastore.contract import KeyValue, Metastore
from headrace.metastore.factory import open_metastore
from headrace.metastore.session import Session, start_exclusive
from headrace.metrics import MetricsServer
from headrace.metrics import serve as serve_metrics
from headrace.node.assignments import Reactor
from headrace.node.auth import AuthInterceptor, IdentitiesFile
from headrace.node.collections import NodeCollections
from headrace.node.formats import WriteFormats
from headrace.node.housekeeping import Housekeeper
from headrace.node.metrics import NodeMetrics
from headrace.node.services import ConsumerService, Limits, ManagerService, ProducerService
from headrace.node.walmanager import WALManager
from headrace.node.writegate import WriteGate
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.tls import ReloadingServerCredentials, ServerTLS
from headrace.tso import MetastoreTSO, TimestampAllocator
from headrace.wal import registry
from headrace.wal.contract import Backend
from headrace.wal.framework import WALOptions

log = logging.getLogger(__name__)

SERVICES = tuple(s.full_name for s in pb.DESCRIPTOR.services_by_name.values())
_ANY_HOST = {"", "0.0.0.0", "::", "[::]"}


@dataclasses.dataclass(frozen=True, slots=True)
class NodeConfig:
    node_id: str
    metastore_url: str
    listen: str = "127.0.0.1:0"
    """host:port to serve on; port 0 picks a free port (the real one is advertised)."""
    cluster: str = DEFAULT_CLUSTER
    wal_backend: str = "local"
    backend_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword settings of the backend, e.g. ``{"root": "/data/wal"}`` for local."""
    wal_options: WALOptions = dataclasses.field(default_factory=WALOptions)
    session_ttl: float = 10.0
    advertise_host: str = "127.0.0.1"
    """Host put in the NodeInfo when ``listen`` binds every interface."""
    limits: Limits = dataclasses.field(default_factory=Limits)
    max_grpc_message_bytes: int = 64 * 1024 * 1024
    shutdown_grace: float = 2.0
    """Seconds open streams get to finish when the server stops."""
    metrics_listen: str = ""
    """host:port of the Prometheus endpoint (port 0: a free one); empty: no
    metrics are recorded or served."""
    tls: ServerTLS | None = None
    """Serve gRPC over TLS (mutual TLS with a client CA); None: plaintext."""
    health_listen: str = ""
    """host:port of a plaintext server with only the gRPC health service, for
    probes that cannot speak TLS (kubelet's); empty: none."""
    auth_file: Path | None = None
    """Identities and roles (:mod:`headrace.node.auth`); None: no authorization.
    Needs ``tls``: tokens never go in plaintext."""
    formats: FormatSupport = RELEASE_FORMATS
    """The message formats this node reads and can write: its release's
    (advertised in its NodeInfo; tests inject others)."""

    def __post_init__(self) -> None:
        if not self.node_id or "/" in self.node_id:
            raise errors.InvalidArgument(f"invalid node id {errors.quoted(self.node_id)}")
        _host, sep, port = self.listen.rpartition(":")
        if not sep or not port.isdigit():
            raise errors.InvalidArgument(f"listen address {self.listen!r} is not host:port")
        if self.session_ttl <= 0:
            raise errors.InvalidArgument(f"session ttl must be positive, got {self.session_ttl}")
        if self.auth_file is not None and self.tls is None:
            raise errors.InvalidArgument(
                "an identities file needs TLS (--tls-cert/--tls-key): bearer tokens and "
                "roles mean nothing over plaintext"
            )


REGISTRATION_MARGIN_S = 2.0
"""Beyond one TTL, how long a held node id is waited for: stores round TTLs up
(etcd to whole seconds, with a minimum) and expire leases a little late."""


def registration_wait(session_ttl: float) -> float:
    """Seconds a starting node waits for another session's key of its id to go (pure)."""
    return session_ttl + REGISTRATION_MARGIN_S


def duplicate_node(node_id: str, holder: KeyValue, waited: float) -> errors.InUse:
    """The error of a node whose id a live session holds (pure)."""
    try:
        info = NodeInfo.from_json(holder.value)
    except errors.CorruptData:
        who = "another process"
    else:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.started_at))
        who = f"the node at {info.address} (version {info.version}, started {started})"
    return errors.InUse(
        f"node id {node_id!r} is held by {who}, whose session (lease {holder.lease:x}) stayed "
        f"alive for the {waited:g} s this process waited; stop that node or use another --node-id"
    )


def advertised_address(listen: str, port: int, advertise_host: str) -> str:
    """The address other processes use to reach a server bound to ``listen``."""
    host = listen.rpartition(":")[0]
    return f"{advertise_host if host in _ANY_HOST else host}:{port}"


class StreamingNode:
    """One streaming node; ``metastore``/``backend`` may be shared (tests)."""

    def __init__(
        self,
        config: NodeConfig,
        *,
        metastore: Metastore | None = None,
        backend: Backend | None = None,
        tso: TimestampAllocator | None = None,
    ) -> None:
        self.config = config
        self.keys = Keys(config.cluster)
        self._metastore = metastore
        self._owns_metastore = metastore is None
        self._backend = backend
        self._owns_backend = backend is None
        self._tso = tso
        self._owns_tso = tso is None
        self.address = ""
        self.health = health_aio.HealthServicer()
        self.registered = asyncio.Event()
        self.ended = asyncio.Event()
        """Set when the node stopped serving on its own (see :attr:`fatal`)."""
        self.fatal: errors.HeadraceError | None = None
        """Why the node stopped on its own: a long-running task of it failed, or
        another live process took its id."""
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None
        self._session: Session | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.manager: WALManager | None = None
        self.producer_service: ProducerService | None = None
        self.consumer_service: ConsumerService | None = None
        self.reactor: Reactor | None = None
        self.write_gate = WriteGate(config.node_id)
        """The cluster-wide write stop as this node obeys it."""
        self.housekeeper: Housekeeper | None = None
        self.metrics: NodeMetrics | None = None
        self.metrics_server: MetricsServer | None = None
        self.tls_credentials: ReloadingServerCredentials | None = None
        self.auth: AuthInterceptor | None = None

    @property
    def metastore(self) -> Metastore:
        if self._metastore is None:
            raise errors.Closed("the node is not started")
        return self._metastore

    async def start(self) -> None:
        cfg = self.config
        try:
            if self._metastore is None:
                self._metastore = await open_metastore(cfg.metastore_url)
            if self._backend is None:
                self._backend = registry.create(cfg.wal_backend, **dict(cfg.backend_settings))
            if self._tso is None:
                self._tso = MetastoreTSO(self._metastore, self.keys.tso)
            self.manager = WALManager(
                cfg.node_id,
                self._backend,
                self._tso,
                dataclasses.replace(cfg.wal_options, release_formats=cfg.formats),
                collections=NodeCollections(self._metastore, self.keys, cfg.node_id),
                formats=WriteFormats(self._metastore, self.keys, cfg.formats),
            )
            if cfg.metrics_listen:
                self.metrics = NodeMetrics()
                self.metrics.watch(self.manager)
                self.manager.events = self.metrics
                self.metrics_server = serve_metrics(self.metrics.registry, cfg.metrics_listen)
            await self._serve()
            self.reactor = Reactor(
                self.metastore,
                self.keys,
                self.manager,
                self.address,
                self._on_task_failure,
                session_lease=self._session_lease,
                write_gate=self.write_gate,
            )
            await self._register()
            self.housekeeper = Housekeeper(cfg.node_id, self.metastore, self.keys, self.manager)
            if self.metrics is not None:
                self.metrics.watch_housekeeping(self.housekeeper)
            self._tasks = [
                guarded_task(
                    self.reactor.run(),
                    f"{cfg.node_id}-reactor",
                    self._on_task_failure,
                    finishable=True,  # it returns only once stopped
                    logger=log,
                ),
                guarded_task(
                    self._supervise_session(),
                    f"{cfg.node_id}-session",
                    self._on_task_failure,
                    finishable=True,  # returns only once another process took the id
                    logger=log,
                ),
                guarded_task(
                    self.write_gate.report(self.metastore, self.keys, self._session_lease),
                    f"{cfg.node_id}-write-stop",
                    self._on_task_failure,
                    logger=log,
                ),
                guarded_task(
                    self.housekeeper.run(),
                    f"{cfg.node_id}-housekeeping",
                    self._on_task_failure,
                    logger=log,
                ),
            ]
        except BaseException:
            await self._release()
            raise
        log.info("node %s serving at %s", cfg.node_id, self.address)
        if self.metrics_server is not None:
            log.info(
                "node %s metrics at http://%s/metrics", cfg.node_id, self.metrics_server.address
            )

    async def _serve(self) -> None:
        assert self.manager is not None
        cfg = self.config
        limit = cfg.max_grpc_message_bytes
        self.tls_credentials = ReloadingServerCredentials(cfg.tls) if cfg.tls is not None else None
        self.auth = (
            AuthInterceptor(IdentitiesFile(cfg.auth_file)) if cfg.auth_file is not None else None
        )
        server = grpc.aio.server(
            interceptors=[self.auth] if self.auth is not None else None,
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                ("grpc.so_reuseport", 0),
            ],
        )
        self.producer_service = ProducerService(
            self.manager, cfg.limits, metrics=self.metrics, gate=self.write_gate
        )
        self.consumer_service = ConsumerService(self.manager, cfg.limits, self.metrics)
        rpc.add_services(
            server,
            self.producer_service,
            self.consumer_service,
            ManagerService(self.manager, self.metastore, self.keys),
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            if self.tls_credentials is not None:
                port = server.add_secure_port(cfg.listen, self.tls_credentials.credentials)
            else:
                port = server.add_insecure_port(cfg.listen)
        except RuntimeError as exc:
            raise errors.Unavailable(f"cannot listen on {cfg.listen}: {exc}") from None
        if not port:
            raise errors.Unavailable(f"cannot listen on {cfg.listen}")
        self._server = server
        await server.start()
        self.address = advertised_address(cfg.listen, port, cfg.advertise_host)
        if cfg.health_listen:
            await self._serve_health(cfg.health_listen)
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _serve_health(self, listen: str) -> None:
        """The health service alone, in plaintext (the status of the main server)."""
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        try:
            port = server.add_insecure_port(listen)
        except RuntimeError as exc:
            raise errors.Unavailable(f"cannot listen on {listen} for health: {exc}") from None
        if not port:
            raise errors.Unavailable(f"cannot listen on {listen} for health")
        self._health_server = server
        await server.start()

    async def _on_task_failure(self, failure: TaskFailure) -> None:
        """A long-running task failed: stop serving for good (see the module doc)."""
        if self.fatal is None:
            self.fatal = errors.HeadraceError(
                f"node {self.config.node_id} stopped: {failure.describe()}"
            )
            log.critical(
                "node %s can no longer follow its assignments (%s); it must be restarted",
                self.config.node_id,
                failure.describe(),
            )
        self.ended.set()
        await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)

    async def _set_health(self, status: int) -> None:
        for name in ("", *SERVICES):
            await self.health.set(name, status)

    def node_info(self) -> NodeInfo:
        return NodeInfo(
            node_id=self.config.node_id,
            address=self.address,
            started_at=time.time(),
            version=headrace.__version__,
            tls=self.config.tls.mode if self.config.tls is not None else TLSMode.OFF,
            reads=tuple(sorted(self.config.formats.reads)),
            writes=tuple(sorted(self.config.formats.writes)),
        )

    def _session_lease(self) -> int:
        return self._session.lease if self._session is not None else 0

    async def _register(self, replaces: int = 0) -> None:
        """Bind the node id to a new session; InUse if a live session holds it.

        ``replaces``: the lease of this process's own lost session.
        """
        cfg = self.config
        wait = registration_wait(cfg.session_ttl)
        outcome = await start_exclusive(
            self.metastore,
            ttl=cfg.session_ttl,
            key=self.keys.node(cfg.node_id),
            value=self.node_info().to_json(),
            wait_s=wait,
            replaces=replaces,
        )
        if isinstance(outcome, KeyValue):
            raise duplicate_node(cfg.node_id, outcome, wait)
        self._session = outcome
        self.registered.set()
        if self.fatal is None:
            await self._set_health(health_pb2.HealthCheckResponse.SERVING)

    async def _supervise_session(self) -> None:
        """On a lost session: close every WAL (fenced anyway), register anew."""
        while True:
            session = self._session
            assert session is not None
            await session.lost.wait()
            log.warning("node %s lost its session; closing its WALs", self.config.node_id)
            self.registered.clear()
            await self._set_health(health_pb2.HealthCheckResponse.NOT_SERVING)
            assert self.manager is not None
            await self.manager.close_all(drain=False)
            with contextlib.suppress(errors.HeadraceError):
                await session.close()
            while True:
                try:
                    await self._register(replaces=session.lease)
                    break
                except errors.InUse as exc:
                    log.error("node %s stops: %s", self.config.node_id, exc)
                    self.fatal = exc
                    self.ended.set()
                    return
                except errors.HeadraceError as exc:
                    log.warning("node %s: registering again failed: %s", self.config.node_id, exc)
                    await asyncio.sleep(min(1.0, self.config.session_ttl / 4))
            log.info("node %s registered a new session", self.config.node_id)

    async def stop(self) -> None:
        """Graceful shutdown; safe to call more than once."""
        log.info("node %s stopping", self.config.node_id)
        await self.health.enter_graceful_shutdown()
        if self.manager is not None:
            await self.manager.shutdown()
        await self._release()
        log.info("node %s stopped", self.config.node_id)

    async def _release(self) -> None:
        if self.reactor is not None:
            await self.reactor.stop()
        tasks, self._tasks = self._tasks, []
        await cancel_and_settle(tasks, what=f"stopping node {self.config.node_id}", logger=log)
        if self.manager is not None:
            await self.manager.close_all(drain=False)
        if self._session is not None:
            session, self._session = self._session, None
            self.registered.clear()
            with contextlib.suppress(errors.HeadraceError):
                await session.close()
        if self._server is not None:
            server, self._server = self._server, None
            await server.stop(self.config.shutdown_grace)
        if self._health_server is not None:
            health_server, self._health_server = self._health_server, None
            await health_server.stop(None)
        if self.metrics_server is not None:
            metrics_server, self.metrics_server = self.metrics_server, None
            metrics_server.close()
        if self._owns_backend and self._backend is not None:
            backend, self._backend = self._backend, None
            await backend.close()
        if self._owns_tso and self._tso is not None:
            tso, self._tso = self._tso, None
            await tso.close()
        if self._owns_metastore and self._metastore is not None:
            metastore, self._metastore = self._metastore, None
            await metastore.close()


async def run_node(config: NodeConfig, stop: asyncio.Event | None = None) -> None:
    """Run a node until ``stop`` is set (or SIGTERM/SIGINT if none is given).

    If a long-running task of the node fails, the node is stopped and a
    HeadraceError naming the failure is raised (the CLI exits non-zero).
    InUse if another live process holds the node id (at start, or after this
    one lost its session and another took the id meanwhile).
    """
    if stop is None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
    runtime.tune_process()
    node = StreamingNode(config)
    await node.start()
    try:
        await wait_any((stop, node.ended))
    finally:
        await node.stop()
    if node.fatal is not None:
        raise node.fatal

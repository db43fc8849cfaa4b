"""A cluster of real node processes for chaos tests and handoff benchmarks.

:class:`ProcCluster` runs the coordinator in this process and every streaming
node as a child process (``python -m headrace.cli node ...``) on a SQLite
metastore under ``root``; each node process is a :class:`NodeProc` that the
caller may kill (SIGKILL), pause (SIGSTOP), resume (SIGCONT) and start again,
the way a supervisor would; :class:`FaultInjector` does so at seeded random
times, and also moves pchannels gracefully. The WAL backend is pluggable:
``local`` (files under ``root/wal``, shared by the node processes), ``kafka``
or ``pulsar`` with their settings. :func:`read_log` reads a pchannel's whole
WAL straight from the backend, for audits after the nodes are stopped.

Layout of ``root``::

    meta.db          SQLite metastore
    wal/             local WAL backend (when ``backend="local"``)
    logs/<node>.log  output of each node process (appended across restarts)
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import itertools
import logging
import os
import random
import signal
import time
from collections.abc import Coroutine, Mapping
from pathlib import Path
from typing import Any

from headrace import cluster, errors, standalone
from headrace.bench import broker_faults
from headrace.bench.broker_faults import BrokerControl
from headrace.coordinator.control import ClusterAdmin
from headrace.coordinator.coordinator import Coordinator, CoordinatorConfig
from headrace.coordinator.snapshot import ClusterSnapshot, read_snapshot, wait_for
from headrace.guarded import cancel_and_settle, settle
from headrace.message import records
from headrace.message.formats import RELEASE_FORMATS
from headrace.message.types import LogEntry
from headrace.metastore.contract import Metastore
from headrace.metastore.factory import open_metastore
from headrace.wal import registry
from headrace.wal.contract import Backend, StartPosition

log = logging.getLogger(__name__)

_BACKEND_FLAGS: dict[str, dict[str, str]] = {
    "local": {"root": "--wal-dir", "fsync": "--fsync"},
    "kafka": {
        "bootstrap_servers": "--kafka-bootstrap",
        "replication_factor": "--kafka-replication-factor",
        "min_insync_replicas": "--kafka-min-insync-replicas",
        "operation_timeout_s": "--wal-operation-timeout",
        "kafka": "--kafka-config",
    },
    "pulsar": {
        "service_url": "--pulsar-url",
        "tenant": "--pulsar-tenant",
        "namespace": "--pulsar-namespace",
        "deduplication": "--pulsar-deduplication",
        "operation_timeout_s": "--wal-operation-timeout",
        "pulsar": "--pulsar-config",
    },
}
"""Per backend: the node command's flag for each backend setting it accepts.

A mapping setting (the ``kafka`` / ``pulsar`` client configuration) becomes one
``KEY=VALUE`` flag per entry. Secrets never go on a command line: node
processes take them from files or from the environment they inherit
(``HEADRACE_KAFKA_SASL_PASSWORD``, ``HEADRACE_PULSAR_TOKEN``, ...).
"""
_SECRET_WORDS = ("password", "secret", "token")


def _flag_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _refuse_secret(backend: str, key: str) -> None:
    if any(word in key.lower() for word in _SECRET_WORDS):
        raise errors.InvalidArgument(
            f"{backend} backend: {key} is a secret and is not put on a node's command line; "
            "give the node processes a file flag or the environment variable instead"
        )


def _pair_args(backend: str, flag: str, config: Any) -> list[str]:
    if not isinstance(config, Mapping):
        raise errors.InvalidArgument(f"{backend} backend: {flag} settings must be a mapping")
    args: list[str] = []
    for key in sorted(config):
        _refuse_secret(backend, str(key))
        args += [flag, f"{key}={_flag_value(config[key])}"]
    return args


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """What to run: node count, pchannels, timings and the WAL backend."""

    root: Path
    nodes: int = 3
    pchannels: int = 8
    lease_ttl_s: float = 2.0
    """Session TTL of every node (failover detection time)."""
    backend: str = "local"
    backend_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Backend settings; for ``local`` the root defaults to ``root/wal``."""
    cluster: str = cluster.DEFAULT_CLUSTER
    timetick_interval_ms: float = 10.0
    pchannel_prefix: str = "pchannel"
    coordinator_lease_ttl_s: float = 3.0
    ready_timeout_s: float = 60.0
    message_format: int = max(RELEASE_FORMATS.writes)
    """The cluster's message format (the newest: record batches)."""

    def validate(self) -> None:
        if self.nodes < 1:
            raise errors.InvalidArgument(f"need at least one node, got {self.nodes}")
        if self.pchannels < 1:
            raise errors.InvalidArgument(f"need at least one pchannel, got {self.pchannels}")
        if self.lease_ttl_s <= 0:
            raise errors.InvalidArgument(f"lease TTL must be positive, got {self.lease_ttl_s}")
        if self.backend not in _BACKEND_FLAGS:
            known = ", ".join(sorted(_BACKEND_FLAGS))
            raise errors.InvalidArgument(f"unknown WAL backend {self.backend!r} (known: {known})")
        unknown = sorted(set(self.backend_settings) - set(_BACKEND_FLAGS[self.backend]))
        if unknown:
            raise errors.InvalidArgument(
                f"{self.backend} backend: settings {unknown} cannot be passed to a node process "
                f"(known: {sorted(_BACKEND_FLAGS[self.backend])})"
            )

    @property
    def metastore_url(self) -> str:
        return f"sqlite:///{(self.root / 'meta.db').resolve()}"

    @property
    def log_dir(self) -> Path:
        return self.root / "logs"

    @property
    def pchannel_names(self) -> list[str]:
        return cluster.default_pchannels(self.pchannels, self.pchannel_prefix)

    def wal_settings(self) -> dict[str, Any]:
        """The backend settings, with the local default root filled in."""
        settings = dict(self.backend_settings)
        if self.backend == "local":
            settings.setdefault("root", str((self.root / "wal").resolve()))
        return settings

    def node_backend_settings(self) -> dict[str, Any]:
        """The settings a node process builds from its flags: for a broker, its
        ``--cluster`` names the topics."""
        settings = self.wal_settings()
        if self.backend != "local":
            settings["cluster"] = self.cluster
        return settings


def backend_args(backend: str, settings: Mapping[str, Any]) -> list[str]:
    """The node command's WAL flags for ``backend`` and ``settings`` (pure)."""
    flags = _BACKEND_FLAGS.get(backend)
    if flags is None:
        raise errors.InvalidArgument(f"unknown WAL backend {backend!r}")
    args = ["--wal", backend]
    for key in sorted(settings):
        _refuse_secret(backend, key)
        if key not in flags:
            raise errors.InvalidArgument(
                f"{backend} backend: setting {key!r} cannot be passed to a node process "
                f"(known: {sorted(flags)})"
            )
        if key == backend:
            args += _pair_args(backend, flags[key], settings[key])
        else:
            args += [flags[key], _flag_value(settings[key])]
    return args


def node_command(spec: ClusterSpec, node_id: str) -> list[str]:
    """The command line of one node process (pure)."""
    return standalone.node_argv(
        node_id,
        spec.metastore_url,
        spec.cluster,
        backend_args(spec.backend, spec.wal_settings()),
        lease_ttl_s=spec.lease_ttl_s,
        timetick_interval_ms=spec.timetick_interval_ms,
    )


class NodeProc:
    """One node process that can be killed, paused, resumed and started again."""

    def __init__(self, spec: ClusterSpec, node_id: str) -> None:
        self.spec = spec
        self.node_id = node_id
        self.proc: asyncio.subprocess.Process | None = None
        self.paused = False
        self.starts = 0

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    @property
    def healthy(self) -> bool:
        """Running and not paused."""
        return self.running and not self.paused

    async def start(self) -> None:
        if self.running:
            raise errors.InvalidArgument(f"node {self.node_id} is already running")
        self.spec.log_dir.mkdir(parents=True, exist_ok=True)
        with (self.spec.log_dir / f"{self.node_id}.log").open("ab") as log_file:
            self.proc = await asyncio.create_subprocess_exec(
                *node_command(self.spec, self.node_id),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
                start_new_session=True,
                env=standalone.node_environment(os.environ),
            )
        self.paused = False
        self.starts += 1

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is None or self.proc.returncode is not None:
            raise errors.InvalidArgument(f"node {self.node_id} is not running")
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(sig)

    async def kill(self) -> None:
        """SIGKILL and reap: a crash."""
        self._signal(signal.SIGKILL)
        assert self.proc is not None
        await self.proc.wait()
        self.paused = False

    def pause(self) -> None:
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self._signal(signal.SIGCONT)
        self.paused = False

    async def terminate(self, timeout: float = 20.0) -> None:
        """Graceful stop (SIGTERM), SIGKILL after ``timeout``; no-op if not running."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        if self.paused:
            self.resume()
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.warning("node %s ignored SIGTERM for %.0fs; killing it", self.node_id, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()


class ProcCluster:
    """Coordinator in this process, nodes as child processes."""

    def __init__(self, spec: ClusterSpec) -> None:
        spec.validate()
        self.spec = spec
        self.keys = cluster.Keys(spec.cluster)
        self.nodes = {f"node-{i}": NodeProc(spec, f"node-{i}") for i in range(spec.nodes)}
        self._stop = asyncio.Event()
        self._store: Metastore | None = None
        self._coordinator: asyncio.Task[None] | None = None

    @property
    def metastore(self) -> Metastore:
        if self._store is None:
            raise errors.Closed("the cluster is not started")
        return self._store

    @property
    def admin(self) -> ClusterAdmin:
        return ClusterAdmin(self.metastore, self.spec.cluster)

    async def __aenter__(self) -> ProcCluster:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Start the coordinator and every node; return once every pchannel is ASSIGNED."""
        spec = self.spec
        spec.root.mkdir(parents=True, exist_ok=True)
        self._store = await open_metastore(spec.metastore_url)
        coordinator = Coordinator(
            self._store,
            spec.cluster,
            CoordinatorConfig(
                pchannels=spec.pchannel_names,
                wal_backend=spec.backend,
                lease_ttl_s=spec.coordinator_lease_ttl_s,
                coordinator_id="bench-coordinator",
                message_format=spec.message_format,
            ),
        )
        self._coordinator = asyncio.create_task(coordinator.run(self._stop), name="coordinator")
        await asyncio.gather(*(node.start() for node in self.nodes.values()))
        await self.wait_registered(spec.ready_timeout_s)
        await self.wait_assigned(spec.ready_timeout_s)

    async def wait_registered(self, timeout: float) -> None:
        """Wait until every node process has a session; Unavailable after ``timeout``."""
        wanted = set(self.nodes)
        await wait_for(
            self.metastore, self.spec.cluster, lambda snap: wanted <= set(snap.nodes), timeout
        )

    async def wait_assigned(self, timeout: float) -> None:
        """Wait until every pchannel is ASSIGNED; Unavailable after ``timeout``."""
        ready = asyncio.ensure_future(
            standalone.wait_all_assigned(
                self.metastore, self.spec.cluster, self.spec.pchannels, timeout
            )
        )
        assert self._coordinator is not None
        done, _ = await asyncio.wait(
            {ready, self._coordinator}, return_when=asyncio.FIRST_COMPLETED
        )
        if ready not in done:
            await cancel_and_settle([ready], what="waiting for every pchannel", logger=log)
            self._coordinator.result()
            raise errors.HeadraceError("the coordinator stopped unexpectedly")
        ready.result()

    async def snapshot(self) -> ClusterSnapshot:
        return await read_snapshot(self.metastore, self.keys)

    async def stop_nodes(self) -> None:
        await asyncio.gather(*(node.terminate() for node in self.nodes.values()))

    async def close(self) -> None:
        self._stop.set()
        await self.stop_nodes()
        if self._coordinator is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._coordinator, 10)
            self._coordinator = None
        if self._store is not None:
            store, self._store = self._store, None
            await store.close()

    def open_backend(self) -> Backend:
        """A backend instance of this cluster's WAL, for reading it directly."""
        return registry.create(self.spec.backend, **self.spec.node_backend_settings())


async def read_log(
    backend: Backend, pchannel: str, *, idle_timeout: float = 10.0
) -> list[LogEntry]:
    """Every record of ``pchannel`` up to its current last one, decoded, in log order.

    Unavailable if the backend stops delivering for ``idle_timeout`` seconds
    before the last record was read.
    """
    last = await backend.last_record(pchannel)
    if last is None:
        return []
    registry.load_id_classes()
    entries: list[LogEntry] = []
    reader = await backend.open_reader(pchannel, StartPosition.earliest())
    try:
        idle_since = time.monotonic()
        while not entries or entries[-1].id.record_id() < last.id:
            batch = await reader.next_batch(1024, timeout=0.5)
            if not batch:
                if time.monotonic() - idle_since > idle_timeout:
                    raise errors.Unavailable(
                        f"{pchannel}: the backend delivered nothing for {idle_timeout:g}s "
                        f"before the last record {last.id}"
                    )
                continue
            idle_since = time.monotonic()
            for record in batch:  # either message format: a batch is its messages
                entries.extend(records.entries(record.id, record.data))
    finally:
        await reader.close()
    return entries


FAULT_KINDS = ("kill", "stop", "move")
BROKER_FAULT_KINDS = ("broker_stall", "broker_restart")
"""Faults of the broker itself, when the injector is given a :class:`BrokerControl`."""


@dataclasses.dataclass(frozen=True)
class FaultTimings:
    gap_s: tuple[float, float] = (1.0, 3.0)
    """Time between two faults."""
    restart_delay_s: tuple[float, float] = (0.3, 1.5)
    pause_extra_s: tuple[float, float] = (0.5, 2.0)
    """A pause lasts the lease TTL plus this."""
    move_timeout_s: float = 15.0
    broker_gap_s: tuple[float, float] = (3.0, 8.0)
    """Time from the end of one broker fault to the next (one at a time)."""
    broker_stall_s: tuple[float, float] = (3.0, 7.0)
    """How long a broker stall (SIGSTOP) lasts."""
    broker_kinds: tuple[str, ...] = BROKER_FAULT_KINDS
    """The broker faults to take turns with, in this order."""

    def __post_init__(self) -> None:
        unknown = sorted(set(self.broker_kinds) - set(BROKER_FAULT_KINDS))
        if unknown or not self.broker_kinds:
            raise errors.InvalidArgument(
                f"broker faults must be some of {BROKER_FAULT_KINDS}, got {self.broker_kinds}"
            )


class FaultInjector:
    """Kills, pauses and moves at seeded random times; counts and logs what it did.

    A kill (SIGKILL, then a new process after a moment) or a pause (SIGSTOP
    for longer than the lease TTL, then SIGCONT) only hits a node while
    another one is healthy; faults may overlap. A move counts once the
    pchannel has landed on the target under a higher term.
    """

    def __init__(
        self,
        procs: ProcCluster,
        rng: random.Random,
        timings: FaultTimings,
        broker: BrokerControl | None = None,
    ) -> None:
        self.procs = procs
        self.rng = rng
        self.timings = timings
        self.broker = broker
        self.fault_errors: list[str] = []
        """Faults that could not be carried out (a broker that did not come back)."""
        self.counts: collections.Counter[str] = collections.Counter()
        self.moves_requested = 0
        self.skipped = 0
        self.events: list[tuple[float, str]] = []
        """(time.monotonic(), what happened), in order."""
        self._tasks: set[asyncio.Task[None]] = set()

    def _healthy(self) -> list[NodeProc]:
        return [node for node in self.procs.nodes.values() if node.healthy]

    def _uniform(self, bounds: tuple[float, float]) -> float:
        return self.rng.uniform(*bounds)

    def _note(self, what: str) -> None:
        log.info("fault: %s", what)
        self.events.append((time.monotonic(), what))

    async def run(self, duration_s: float) -> None:
        """Inject faults for ``duration_s``; the first three are one of each kind.

        With a broker, broker faults run alongside once that first round was
        launched (a broker outage would keep it from happening), one at a
        time, alternating stall and restart (a stall first: the quicker one,
        so short runs see both).
        """
        deadline = time.monotonic() + duration_s
        kinds = list(FAULT_KINDS)
        self.rng.shuffle(kinds)
        for kind in kinds:
            if not await self._next_fault(deadline):
                return
            self._launch(kind)
        if self.broker is not None:
            self._start(self._broker_faults(self.broker, deadline), "fault-broker")
        while await self._next_fault(deadline):
            self._launch(self.rng.choice(FAULT_KINDS))

    async def _next_fault(self, deadline: float) -> bool:
        """Wait the gap before the next node fault; whether it is still due."""
        await asyncio.sleep(self._uniform(self.timings.gap_s))
        return time.monotonic() < deadline

    def _launch(self, kind: str) -> None:
        healthy = self._healthy()
        if kind != "move" and len(healthy) < 2:
            kind = "move"
        if kind == "kill":
            coro = self._kill(self.rng.choice(healthy), self._uniform(self.timings.restart_delay_s))
        elif kind == "stop":
            pause = self.procs.spec.lease_ttl_s + self._uniform(self.timings.pause_extra_s)
            coro = self._pause(self.rng.choice(healthy), pause)
        else:
            coro = self._move(self.rng.random(), self.rng.random())
        self._start(coro, f"fault-{kind}")

    def _start(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _broker_faults(self, broker: BrokerControl, deadline: float) -> None:
        for kind in itertools.cycle(self.timings.broker_kinds):
            gap = self._uniform(self.timings.broker_gap_s)
            await asyncio.sleep(min(gap, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                return
            try:
                if kind == "broker_stall":
                    seconds = self._uniform(self.timings.broker_stall_s)
                    self._note(f"SIGSTOP broker for {seconds:.1f}s")
                    await broker_faults.stall(broker, seconds)
                    self._note("SIGCONT broker")
                else:
                    self._note("restarting broker")
                    await broker.restart()
                    self._note("broker serves again")
            except errors.HeadraceError as exc:
                self.fault_errors.append(f"{kind}: {exc}")
                self._note(f"{kind} failed: {exc}")
                return
            self.counts[kind] += 1

    async def _kill(self, node: NodeProc, restart_after: float) -> None:
        await node.kill()
        self.counts["kill"] += 1
        self._note(f"SIGKILL {node.node_id}")
        await asyncio.sleep(restart_after)
        await node.start()
        self._note(f"restarted {node.node_id}")

    async def _pause(self, node: NodeProc, seconds: float) -> None:
        node.pause()
        self.counts["stop"] += 1
        self._note(f"SIGSTOP {node.node_id} for {seconds:.1f}s")
        await asyncio.sleep(seconds)
        if node.running:
            node.resume()
            self._note(f"SIGCONT {node.node_id}")

    async def _move(self, pick_pchannel: float, pick_target: float) -> None:
        snapshot = await self.procs.snapshot()
        assigned = sorted(
            (name, record)
            for name, record in snapshot.assignments.items()
            if record.state is cluster.AssignmentState.ASSIGNED
        )
        healthy = {node.node_id for node in self._healthy()}
        if not assigned:
            self.skipped += 1
            self._note("move skipped: no pchannel is assigned")
            return
        pchannel, record = assigned[int(pick_pchannel * len(assigned))]
        targets = sorted(n for n in snapshot.nodes if n in healthy and n != record.node)
        if not targets:
            self.skipped += 1
            self._note(f"move of {pchannel} skipped: no healthy node but its owner")
            return
        target = targets[int(pick_target * len(targets))]
        try:
            await self.procs.admin.request_move(pchannel, target)
        except errors.InvalidArgument as exc:
            log.info("fault: move refused: %s", exc)
            self.skipped += 1
            return
        self.moves_requested += 1
        self._note(f"move {pchannel} {record.node}->{target} (term {record.term})")

        def landed(snap: ClusterSnapshot) -> bool:
            now = snap.assignments.get(pchannel)
            return now is not None and now.term > record.term and now.node == target

        with contextlib.suppress(errors.Unavailable):
            await wait_for(
                self.procs.metastore, self.procs.spec.cluster, landed, self.timings.move_timeout_s
            )
            self.counts["move"] += 1
            self._note(f"moved {pchannel} to {target}")

    async def settle(self) -> None:
        """Let running faults finish: paused nodes resume, killed ones start again."""
        failures = await settle(list(self._tasks), what="running faults", logger=log)
        self.fault_errors.extend(f"{type(exc).__name__}: {exc}" for exc in failures)
        for node in self.procs.nodes.values():
            if node.paused:
                node.resume()
            if not node.running:
                await node.start()

    def around(self, start: float, end: float, *, origin: float, before: float = 5.0) -> list[str]:
        """The events from ``before`` seconds before ``start`` to ``end``, as
        ``"+<seconds since origin>s <what>"``."""
        return [
            f"+{at - origin:.1f}s {what}" for at, what in self.events if start - before <= at <= end
        ]

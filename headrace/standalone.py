"""Embedded standalone: the whole service on one machine.

One foreground process owns a data directory::

    DIR/LOCK         held (flock) by the standalone while it runs; holds its pid
    DIR/meta.db      SQLite metastore (shared with the node processes)
    DIR/wal/         local WAL backend root (one sub-directory per pchannel)
    DIR/logs/        one log file per node process (and flush-runner.log)
    DIR/warehouse/   the Iceberg tables the flush runner writes (default warehouse)

A second standalone on a directory in use fails at once with
:class:`headrace.errors.InUse` naming the holder's pid (the CLI exits with
status 2), before it opens or starts anything. The lock goes with the holding
process, however it ends. It also guards ``meta.db`` as the standalone's
metastore: the SQLite file itself takes no exclusive lock, because the node
processes, the CLI (``produce``, ``status``, ...) and clients legitimately
share it. What must be unique on it is protected where it lives: one
coordinator leads by election, a node id is held by one live session (see
:mod:`headrace.node.server`), and every WAL writer is fenced by term and
writer identity.

With ``wal="kafka"`` or ``"pulsar"`` the WALs live in that broker instead, and
the node processes get the broker flags ``wal_args`` (built and checked by the
CLI; secrets only as file paths or inherited environment variables).

It runs the coordinator in-process and supervises N streaming-node processes
(restarting a node that dies, with backoff). Node processes run the same
``headrace`` package as the standalone whatever the working directory holds
(``python -P``, the package's root first on ``PYTHONPATH``). A node that exits
before the standalone is ready stops the start-up at once with its exit code
and the tail of its log, instead of being restarted in a loop. It prints one line
``headrace standalone ready metastore=<url> ...`` once every pchannel is
ASSIGNED, and shuts down cleanly on SIGINT/SIGTERM.

With the ``pipeline`` extra installed (pyspark importable) it also supervises
the flush runner (``python -m spark_apps.runner``: one long-lived local Spark
session that flushes each pchannel's range up to its last seal into the
warehouse), restarted like a node if it dies; ``flush=False`` (``--no-flush``)
leaves it out. The standalone itself never imports pyspark. Starting again on the same
directory resumes with all acknowledged data: the pchannel list is kept in the
metastore and every WAL reopens under a new term.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib.util
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

import headrace
from headrace import cluster, dirlock, errors, metrics, runtime
from headrace.coordinator import coordinator as coord_mod
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task, settle
from headrace.logs import LogFormat
from headrace.message.formats import RELEASE_FORMATS
from headrace.metastore import factory
from headrace.metastore.contract import Metastore

log = logging.getLogger(__name__)

WAL_BACKENDS = ("local", "kafka", "pulsar")


@dataclasses.dataclass(frozen=True)
class StandaloneConfig:
    data_dir: Path
    nodes: int = 1
    pchannels: int = 4
    cluster: str = cluster.DEFAULT_CLUSTER
    lease_ttl_s: float = 3.0
    fsync: str = "batch"
    segment_bytes: int | None = None
    """Local WAL segment size (None: the backend's default)."""
    timetick_interval_ms: float = 10.0
    message_format: int = max(RELEASE_FORMATS.writes)
    """Message format of a new cluster (an existing one keeps its own)."""
    ready_timeout_s: float = 60.0
    restart_nodes: bool = True
    wal: str = "local"
    """WAL backend: ``local`` (files under ``wal_dir``), ``kafka`` or ``pulsar``."""
    wal_args: tuple[str, ...] = ()
    """Broker flags of the node command (``--kafka-bootstrap ...``) for kafka/pulsar."""
    node_args: tuple[str, ...] = ()
    """Further node flags (retention and back-pressure, ``--retention-s ...``)."""
    flush: bool = True
    """Run the flush runner (if the ``pipeline`` extra is installed)."""
    warehouse: str = ""
    """Where the runner writes tables: an absolute directory or ``s3://...``;
    empty: ``DIR/warehouse``."""
    spark_master: str = "local[2]"
    log_format: LogFormat = LogFormat.TEXT
    """How the node and runner processes write their logs."""
    metrics_listen: str = ""
    """host:port of the standalone's Prometheus endpoint; node ``i`` serves its
    own at port + 1 + i (all free ports with port 0). Empty: no metrics."""

    @property
    def warehouse_location(self) -> str:
        return self.warehouse or str((self.data_dir / "warehouse").resolve())

    @property
    def runs_flush(self) -> bool:
        """Whether the flush runner is started: asked for and pyspark installed."""
        return self.flush and pipeline_installed()

    @property
    def metastore_url(self) -> str:
        return f"sqlite:///{(self.data_dir / 'meta.db').resolve()}"

    @property
    def wal_dir(self) -> Path:
        return self.data_dir / "wal"

    @property
    def log_dir(self) -> Path:
        return self.data_dir / "logs"

    def validate(self) -> None:
        if self.nodes < 1:
            raise errors.InvalidArgument(f"--nodes must be at least 1, got {self.nodes}")
        if self.pchannels < 1:
            raise errors.InvalidArgument(f"--pchannels must be at least 1, got {self.pchannels}")
        if self.lease_ttl_s <= 0:
            raise errors.InvalidArgument("--lease-ttl must be positive")
        if not self.timetick_interval_ms > 0:
            raise errors.InvalidArgument(
                f"--timetick-interval-ms must be positive, got {self.timetick_interval_ms!r}"
            )
        if self.wal not in WAL_BACKENDS:
            raise errors.InvalidArgument(
                f"unknown WAL backend {self.wal!r} (known: {', '.join(WAL_BACKENDS)})"
            )
        if self.wal == "local" and self.wal_args:
            raise errors.InvalidArgument(
                f"broker flags {list(self.wal_args)} need --wal kafka or pulsar"
            )


def node_argv(
    node_id: str,
    metastore_url: str,
    cluster_name: str,
    wal_args: Sequence[str],
    *,
    lease_ttl_s: float,
    timetick_interval_ms: float,
) -> list[str]:
    """The command line of a node process on loopback with WAL flags ``wal_args`` (pure).

    ``-P``: the working directory is not put on ``sys.path``, so a ``headrace/``
    folder there (a clone's parent, a data directory) cannot shadow the package.
    """
    return [
        sys.executable,
        "-P",
        "-m",
        "headrace.cli",
        "node",
        "--node-id",
        node_id,
        "--metastore",
        metastore_url,
        "--cluster",
        cluster_name,
        "--listen",
        "127.0.0.1:0",
        *wal_args,
        "--lease-ttl",
        str(lease_ttl_s),
        "--timetick-interval-ms",
        str(timetick_interval_ms),
    ]


def node_metrics_listen(listen: str, index: int) -> str:
    """Where node ``index`` of a standalone serving metrics at ``listen`` serves
    its own (pure): the next ports in order, or a free one for port 0."""
    if not listen:
        return ""
    host, port = metrics.parse_listen(listen)
    return f"{host}:{port + 1 + index if port else 0}"


def node_command(
    cfg: StandaloneConfig,
    node_id: str,
    *,
    parent: int | None = None,
    metrics_listen: str = "",
) -> list[str]:
    """The command line of one of the standalone's node processes.

    The node stops once process ``parent`` (default: this one, the
    standalone) is gone, even if that happened before the node started.
    """
    if cfg.wal == "local":
        wal = ["--wal", "local", "--wal-dir", str(cfg.wal_dir.resolve()), "--fsync", cfg.fsync]
        if cfg.segment_bytes is not None:
            wal += ["--segment-bytes", str(cfg.segment_bytes)]
    else:
        wal = ["--wal", cfg.wal, *cfg.wal_args]
    argv = node_argv(
        node_id,
        cfg.metastore_url,
        cfg.cluster,
        wal,
        lease_ttl_s=cfg.lease_ttl_s,
        timetick_interval_ms=cfg.timetick_interval_ms,
    )
    return [
        *argv,
        *cfg.node_args,
        *(["--metrics-listen", metrics_listen] if metrics_listen else []),
        "--log-format",
        cfg.log_format.value,
        "--exit-with-parent",
        str(os.getpid() if parent is None else parent),
    ]


def pipeline_installed() -> bool:
    """Whether pyspark can be imported (without importing it)."""
    return importlib.util.find_spec("pyspark") is not None


def runner_command(cfg: StandaloneConfig, *, parent: int | None = None) -> list[str]:
    """The command line of the flush runner process (pure but for the default
    ``parent``, this process); it stops once ``parent`` is gone."""
    return [
        sys.executable,
        "-P",
        "-m",
        "spark_apps.runner",
        "--metastore",
        cfg.metastore_url,
        "--cluster",
        cfg.cluster,
        "--warehouse",
        cfg.warehouse_location,
        "--master",
        cfg.spark_master,
        "--log-format",
        cfg.log_format.value,
        "--exit-with-parent",
        str(os.getpid() if parent is None else parent),
    ]


def node_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a child process (pure): ``environ`` with the root of
    the running ``headrace`` package first on ``PYTHONPATH``, so the child runs
    the same code as the standalone (also from a source tree, not installed),
    and ``PYTHONSAFEPATH=1``: like the children's own ``-P``, it keeps the
    working directory off ``sys.path`` for every Python process they start in
    turn (the Spark workers of the flush runner), so a ``headrace`` folder there
    cannot shadow the package."""
    root = str(Path(headrace.__file__).resolve().parent.parent)
    rest = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return {**environ, "PYTHONPATH": os.pathsep.join([root, *rest]), "PYTHONSAFEPATH": "1"}


@dataclasses.dataclass(frozen=True, slots=True)
class NodeExit:
    """A node process that ended on its own."""

    node_id: str
    code: int | None
    log_path: Path
    log_tail: tuple[str, ...]
    """The last lines this process wrote to its log."""

    def describe(self) -> str:
        tail = "\n".join(f"  | {line}" for line in self.log_tail) or "  (its log is empty)"
        return (
            f"node {self.node_id} exited with code {self.code} while the standalone was "
            f"starting; the end of {self.log_path}:\n{tail}"
        )


LOG_TAIL_LINES = 15
LOG_TAIL_BYTES = 64 * 1024


class NodeLog:
    """Where a node process's output goes: its log file, and the standalone's
    own stderr while the file cannot be written (a full disk), with a notice
    saying so, so that a node's errors are never lost silently."""

    def __init__(self, path: Path, label: str, fallback: BinaryIO) -> None:
        self.path = path
        self._label = label
        self._fallback = fallback
        self._fd: int | None = None
        self.failure: str = ""
        """Why the file cannot be written now (empty while it can)."""
        self._recent = bytearray()
        """The current process's last LOG_TAIL_BYTES of output (for its exit report)."""

    def begin(self) -> None:
        """A new process starts writing: its exit report shows only its own lines.

        The file exists from the process's start (a process that is slow to
        say anything, the flush runner, still has its log where expected);
        if it cannot be created, the first write reports why.
        """
        self._recent.clear()
        with contextlib.suppress(OSError):
            self._open()

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def tail(self, lines: int = LOG_TAIL_LINES) -> tuple[str, ...]:
        """The last ``lines`` lines the current process wrote."""
        text = self._recent.decode("utf-8", errors="replace").splitlines()
        return tuple(text[-lines:])

    def write(self, data: bytes) -> None:
        self._recent += data
        del self._recent[:-LOG_TAIL_BYTES]
        try:
            fd = self._open()
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        except OSError as exc:
            self._divert(f"{exc.strerror or exc}", data)
            return
        if self.failure:
            self.failure = ""
            self._notice(f"writing {self.path} works again")

    def _divert(self, reason: str, data: bytes) -> None:
        if self.failure != reason:
            self.failure = reason
            self._notice(f"cannot write {self.path} ({reason}); its output follows here")
        self._fallback.write(f"[{self._label}] ".encode() + data)
        self._fallback.flush()

    def _notice(self, what: str) -> None:
        self._fallback.write(f"headrace standalone: {self._label} log: {what}\n".encode())
        self._fallback.flush()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


async def pump(stream: asyncio.StreamReader, sink: NodeLog) -> None:
    """Copy a node's output to its log until the process closes it (the node
    would block on a full pipe if this stopped reading)."""
    while chunk := await stream.read(1 << 16):
        sink.write(chunk)


class NodeProcess:
    """One supervised node process."""

    def __init__(self, cfg: StandaloneConfig, node_id: str, metrics_listen: str = "") -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.metrics_listen = metrics_listen
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.log = NodeLog(self.log_path, node_id, sys.stderr.buffer)
        self._pump: asyncio.Task[None] | None = None

    @property
    def log_path(self) -> Path:
        return self.cfg.log_dir / f"{self.node_id}.log"

    def command(self) -> list[str]:
        return node_command(self.cfg, self.node_id, metrics_listen=self.metrics_listen)

    async def start(self) -> None:
        self.log.begin()
        self.proc = await asyncio.create_subprocess_exec(
            *self.command(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=node_environment(os.environ),
        )
        assert self.proc.stdout is not None
        self._pump = asyncio.create_task(
            pump(self.proc.stdout, self.log), name=f"{self.node_id}-log"
        )

    async def _pumped(self) -> None:
        """Wait (briefly) until the exited process's last output is in its log."""
        task, self._pump = self._pump, None
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, 5.0)

    def exit_report(self) -> NodeExit:
        """How the current process ended (call after it exited)."""
        code = self.proc.returncode if self.proc is not None else None
        return NodeExit(self.node_id, code, self.log_path, self.log.tail())

    async def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
            await self._pumped()
            self.log.close()
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            log.warning("node %s did not stop within %.0fs; killing it", self.node_id, timeout)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        finally:
            await self._pumped()
            self.log.close()

    async def supervise(
        self, stop: asyncio.Event, ready: asyncio.Event, failed: asyncio.Future[NodeExit]
    ) -> None:
        """Keep the process running until ``stop`` is set.

        Before ``ready`` (the standalone announced itself), an exit is not restarted:
        it resolves ``failed`` (the first one wins) and supervision ends.
        """
        backoff = 0.5
        while not stop.is_set():
            await self.start()
            assert self.proc is not None
            began = time.monotonic()
            wait_exit = asyncio.ensure_future(self.proc.wait())
            wait_stop = asyncio.ensure_future(stop.wait())
            await asyncio.wait({wait_exit, wait_stop}, return_when=asyncio.FIRST_COMPLETED)
            wait_stop.cancel()
            if stop.is_set():
                wait_exit.cancel()
                return
            await self._pumped()
            report = self.exit_report()
            if not ready.is_set():
                if not failed.done():
                    failed.set_result(report)
                return
            log.warning(
                "node %s exited with code %s; the end of %s:\n%s",
                self.node_id,
                report.code,
                report.log_path,
                "\n".join(report.log_tail),
            )
            if not self.cfg.restart_nodes:
                return
            if time.monotonic() - began > 30:
                backoff = 0.5
            self.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 10.0)


class RunnerProcess(NodeProcess):
    """The supervised flush runner: started, logged, stopped and restarted
    like a node process."""

    def __init__(self, cfg: StandaloneConfig) -> None:
        super().__init__(cfg, "flush-runner")

    def command(self) -> list[str]:
        return runner_command(self.cfg)


class ProcessCollector(Collector):
    """The standalone's supervised processes, read at scrape time."""

    def __init__(self, procs: Sequence[NodeProcess]) -> None:
        self.procs = procs

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "headrace_standalone_process_up", "1 while the process runs", labels=["process"]
        )
        restarts = CounterMetricFamily(
            "headrace_standalone_process_restarts",
            "Times the standalone restarted the process after it exited",
            labels=["process"],
        )
        for p in self.procs:
            running = p.proc is not None and p.proc.returncode is None
            up.add_metric([p.node_id], 1.0 if running else 0.0)
            restarts.add_metric([p.node_id], p.restarts)
        yield from (up, restarts)


def serve_process_metrics(
    listen: str, procs: Sequence[NodeProcess]
) -> metrics.MetricsServer | None:
    """The standalone's own endpoint (None without ``listen``)."""
    if not listen:
        return None
    registry = CollectorRegistry()
    registry.register(ProcessCollector(procs))
    server = metrics.serve(registry, listen)
    log.info("standalone metrics at http://%s/metrics", server.address)
    return server


def supervised_processes(cfg: StandaloneConfig) -> list[NodeProcess]:
    """The node processes, and the flush runner if it runs."""
    procs = [
        NodeProcess(cfg, f"node-{i}", node_metrics_listen(cfg.metrics_listen, i))
        for i in range(cfg.nodes)
    ]
    if cfg.runs_flush:
        procs.append(RunnerProcess(cfg))
    elif cfg.flush:
        log.info("no flush runner: pyspark is not installed (the pipeline extra)")
    return procs


async def wait_nodes_registered(
    store: Metastore, keys: cluster.Keys, expected: int, stop: asyncio.Event, timeout: float
) -> None:
    """Wait (bounded) until ``expected`` node sessions exist; go on anyway after."""
    deadline = time.monotonic() + timeout
    while not stop.is_set() and time.monotonic() < deadline:
        if len(await store.get_prefix(keys.nodes)) >= expected:
            return
        await asyncio.sleep(0.05)
    log.warning("not every node registered within %.0fs; assigning to those that did", timeout)


def serving(records: list[cluster.Assignment], node_leases: dict[str, int]) -> list[str]:
    """Pchannels ASSIGNED to a node process that is alive now (pure).

    A record acknowledged by an earlier process of the same node id (its
    ``session`` differs from the node key's lease) does not count: after a
    restart it is stale until the coordinator reassigns it.
    """
    return [
        r.pchannel
        for r in records
        if r.state is cluster.AssignmentState.ASSIGNED
        and r.session != 0
        and node_leases.get(r.node) == r.session
    ]


async def wait_all_assigned(
    store: Metastore, cluster_name: str, expected: int, timeout: float
) -> list[cluster.Assignment]:
    """Wait until ``expected`` pchannels are served; raise Unavailable on timeout."""
    keys = cluster.Keys(cluster_name)
    deadline = time.monotonic() + timeout
    while True:
        kvs = await store.get_prefix(keys.pchannels)
        records = [cluster.Assignment.from_json(kv.value) for kv in kvs]
        leases = {
            cluster.NodeInfo.from_json(kv.value).node_id: kv.lease
            for kv in await store.get_prefix(keys.nodes)
        }
        served = serving(records, leases)
        if len(served) >= expected:
            return records
        if time.monotonic() > deadline:
            states = ", ".join(f"{r.pchannel}={r.state.value}" for r in records) or "none"
            raise errors.Unavailable(
                f"only {len(served)} of {expected} pchannels served after {timeout:.0f}s "
                f"({states}); see the node logs in the data directory's logs/"
            )
        await asyncio.sleep(0.05)


async def run_standalone(
    cfg: StandaloneConfig, stop: asyncio.Event, *, announce: bool = True
) -> int:
    """Run until ``stop`` is set; return the process exit code.

    InUse if another standalone runs on the data directory.
    """
    cfg.validate()
    prepare_data_dir(cfg)
    with dirlock.hold(cfg.data_dir, "headrace standalone"):
        return await _run_locked(cfg, stop, announce=announce)


async def _until_stopped(work: Coroutine[Any, Any, None], stop: asyncio.Event, what: str) -> None:
    """Run ``work``, which must last until ``stop`` is set: ending before is a failure."""
    await work
    if not stop.is_set():
        raise errors.HeadraceError(f"{what} stopped on its own")


def crash_error(failure: TaskFailure) -> errors.HeadraceError:
    """The error a standalone stops with when one of its tasks failed (pure)."""
    return errors.HeadraceError(
        f"standalone stopping: {failure.describe()} "
        "(a standalone without its coordinator or node supervision has no failover)"
    )


async def _run_locked(cfg: StandaloneConfig, stop: asyncio.Event, *, announce: bool) -> int:
    runtime.tune_process()
    store = await factory.open_metastore(cfg.metastore_url)
    coordinator = coord_mod.Coordinator(
        store,
        cfg.cluster,
        coord_mod.CoordinatorConfig(
            pchannels=cluster.default_pchannels(cfg.pchannels),
            wal_backend=cfg.wal,
            lease_ttl_s=cfg.lease_ttl_s,
            coordinator_id=f"standalone-{os.getpid()}",
            message_format=cfg.message_format,
        ),
    )
    procs = supervised_processes(cfg)
    metrics_server = serve_process_metrics(cfg.metrics_listen, procs)
    loop = asyncio.get_running_loop()
    announced = asyncio.Event()
    failed: asyncio.Future[NodeExit] = loop.create_future()
    crashed: asyncio.Future[TaskFailure] = loop.create_future()

    async def on_crash(failure: TaskFailure) -> None:
        if not crashed.done():
            crashed.set_result(failure)

    supervisors = [
        guarded_task(
            p.supervise(stop, announced, failed),
            f"supervisor of {p.node_id}",
            on_crash,
            finishable=True,
            logger=log,
        )
        for p in procs
    ]
    coord_task: asyncio.Task[None] | None = None
    waiters: list[asyncio.Task[Any]] = []
    try:
        # The nodes register first, so the first layout is already balanced
        # instead of the first node getting everything and the balancer moving it.
        registered = asyncio.create_task(
            wait_nodes_registered(store, cluster.Keys(cfg.cluster), cfg.nodes, stop, 30.0)
        )
        waiters.append(registered)
        first: set[asyncio.Future[Any]] = {registered, failed, crashed}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if crashed.done():
            raise crash_error(crashed.result())
        if failed.done():
            raise errors.HeadraceError(failed.result().describe())
        coord_task = guarded_task(
            _until_stopped(coordinator.run(stop), stop, "the coordinator"),
            "coordinator",
            on_crash,
            finishable=True,
            logger=log,
        )
        ready = asyncio.create_task(
            wait_all_assigned(store, cfg.cluster, cfg.pchannels, cfg.ready_timeout_s)
        )
        stop_wait = asyncio.create_task(stop.wait())
        waiters += [ready, stop_wait]
        waits: set[asyncio.Future[Any]] = {ready, stop_wait, crashed, failed}
        done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        if crashed.done():
            raise crash_error(crashed.result())
        if failed.done():
            raise errors.HeadraceError(failed.result().describe())
        if ready in done:
            ready.result()
            announced.set()
            if announce:
                print(
                    f"headrace standalone ready metastore={cfg.metastore_url} "
                    f"cluster={cfg.cluster} nodes={cfg.nodes} pchannels={cfg.pchannels} "
                    f"data_dir={cfg.data_dir}",
                    flush=True,
                )
            running: set[asyncio.Future[Any]] = {stop_wait, crashed}
            await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            if crashed.done():
                raise crash_error(crashed.result())
        return 0
    finally:
        stop.set()
        await cancel_and_settle(waiters, what="stopping the standalone's waits", logger=log)
        await _shut_down(procs, supervisors, coord_task, metrics_server)
        await store.close()


async def _shut_down(
    procs: Sequence[NodeProcess],
    supervisors: Sequence[asyncio.Task[None]],
    coordinator: asyncio.Task[None] | None,
    metrics_server: metrics.MetricsServer | None,
) -> None:
    """Stop the node processes, their supervision, the coordinator (``stop``
    is set) and the metrics endpoint; every error is logged, none stops the rest."""
    if metrics_server is not None:
        metrics_server.close()
    await settle([p.stop() for p in procs], what="stopping the node processes", logger=log)
    await settle(supervisors, what="ending the node supervision", logger=log)
    if coordinator is not None:
        await asyncio.wait((coordinator,), timeout=10)
        await cancel_and_settle([coordinator], what="stopping the coordinator", logger=log)


def prepare_data_dir(cfg: StandaloneConfig) -> None:
    """Create the data directory (and ``wal/``, ``logs/``) and check it is
    writable; InvalidArgument naming the directory and the reason if not."""
    dirs = [cfg.data_dir, cfg.log_dir] + ([cfg.wal_dir] if cfg.wal == "local" else [])
    probe = cfg.data_dir / f".headrace-write-check-{os.getpid()}"
    try:
        for path in dirs:
            path.mkdir(parents=True, exist_ok=True)
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise errors.InvalidArgument(
            f"--data-dir {cfg.data_dir}: cannot write there "
            f"({exc.strerror or exc}{': ' + exc.filename if exc.filename else ''})"
        ) from None

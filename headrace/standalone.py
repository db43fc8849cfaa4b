"""Embedded standalone: the whole service on one machine.

One foreground process owns a data directory::

    DIR/meta.db      SQLite metastore (shared with the node processes)
    DIR/wal/         local WAL backend root (one sub-directory per pchannel)
    DIR/logs/        one log file per node process

With ``wal="kafka"`` or ``"pulsar"`` the WALs live in that broker instead, and
the node processes get the broker flags ``wal_args`` (built and checked by the
CLI; secrets only as file paths or inherited environment variables).

It runs the coordinator in-process and supervises N streaming-node processes
(restarting a node that dies, with backoff). It prints one line
``headrace standalone ready metastore=<url> ...`` once every pchannel is
ASSIGNED, and shuts down cleanly on SIGINT/SIGTERM. Starting again on the same
directory resumes with all acknowledged data: the pchannel list is kept in the
metastore and every WAL reopens under a new term.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from headrace import cluster, errors, runtime
from headrace.coordinator import coordinator as coord_mod
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
    timetick_interval_ms: float = 10.0
    ready_timeout_s: float = 60.0
    restart_nodes: bool = True
    wal: str = "local"
    """WAL backend: ``local`` (files under ``wal_dir``), ``kafka`` or ``pulsar``."""
    wal_args: tuple[str, ...] = ()
    """Broker flags of the node command (``--kafka-bootstrap ...``) for kafka/pulsar."""

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
    """The command line of a node process on loopback with WAL flags ``wal_args`` (pure)."""
    return [
        sys.executable,
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


def node_command(cfg: StandaloneConfig, node_id: str) -> list[str]:
    """The command line of one of the standalone's node processes (pure)."""
    if cfg.wal == "local":
        wal = ["--wal", "local", "--wal-dir", str(cfg.wal_dir.resolve()), "--fsync", cfg.fsync]
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
    return [*argv, "--exit-with-parent"]


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

    def write(self, data: bytes) -> None:
        try:
            if self._fd is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
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

    def __init__(self, cfg: StandaloneConfig, node_id: str) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.log = NodeLog(cfg.log_dir / f"{node_id}.log", node_id, sys.stderr.buffer)
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            *node_command(self.cfg, self.node_id),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
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

    async def supervise(self, stop: asyncio.Event) -> None:
        """Keep the process running until ``stop`` is set."""
        backoff = 0.5
        while not stop.is_set():
            await self.start()
            assert self.proc is not None
            started = time.monotonic()
            wait_exit = asyncio.ensure_future(self.proc.wait())
            wait_stop = asyncio.ensure_future(stop.wait())
            await asyncio.wait({wait_exit, wait_stop}, return_when=asyncio.FIRST_COMPLETED)
            wait_stop.cancel()
            if stop.is_set():
                wait_exit.cancel()
                return
            await self._pumped()
            code = self.proc.returncode
            log.warning(
                "node %s exited with code %s; see %s",
                self.node_id,
                code,
                self.cfg.log_dir / f"{self.node_id}.log",
            )
            if not self.cfg.restart_nodes:
                return
            if time.monotonic() - started > 30:
                backoff = 0.5
            self.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), backoff)
            backoff = min(backoff * 2, 10.0)


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
    """Run until ``stop`` is set; return the process exit code."""
    cfg.validate()
    runtime.tune_process()
    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    if cfg.wal == "local":
        cfg.wal_dir.mkdir(parents=True, exist_ok=True)
    store = await factory.open_metastore(cfg.metastore_url)
    coordinator = coord_mod.Coordinator(
        store,
        cfg.cluster,
        coord_mod.CoordinatorConfig(
            pchannels=cluster.default_pchannels(cfg.pchannels),
            wal_backend=cfg.wal,
            lease_ttl_s=cfg.lease_ttl_s,
            coordinator_id=f"standalone-{os.getpid()}",
        ),
    )
    procs = [NodeProcess(cfg, f"node-{i}") for i in range(cfg.nodes)]
    supervisors = [asyncio.create_task(p.supervise(stop), name=p.node_id) for p in procs]
    # The nodes register first, so the first layout is already balanced
    # instead of the first node getting everything and the balancer moving it.
    await wait_nodes_registered(store, cluster.Keys(cfg.cluster), cfg.nodes, stop, 30.0)
    coord_task = asyncio.create_task(coordinator.run(stop), name="coordinator")
    try:
        ready = asyncio.create_task(
            wait_all_assigned(store, cfg.cluster, cfg.pchannels, cfg.ready_timeout_s)
        )
        stop_wait = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait(
            {ready, stop_wait, coord_task}, return_when=asyncio.FIRST_COMPLETED
        )
        stop_wait.cancel()
        if coord_task in done:
            coord_task.result()
            raise errors.HeadraceError("the coordinator stopped unexpectedly")
        if ready in done:
            ready.result()
            if announce:
                print(
                    f"headrace standalone ready metastore={cfg.metastore_url} "
                    f"cluster={cfg.cluster} nodes={cfg.nodes} pchannels={cfg.pchannels} "
                    f"data_dir={cfg.data_dir}",
                    flush=True,
                )
            await stop.wait()
        else:
            ready.cancel()
        return 0
    finally:
        stop.set()
        await asyncio.gather(*(p.stop() for p in procs), return_exceptions=True)
        await asyncio.gather(*supervisors, return_exceptions=True)
        with contextlib.suppress(asyncio.CancelledError, errors.HeadraceError):
            await asyncio.wait_for(coord_task, 10)
        await store.close()

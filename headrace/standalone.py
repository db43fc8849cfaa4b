"""Embedded standalone: the whole service on one machine.

One foreground process owns a data directory::

    DIR/LOCK         held (flock) by the standalone while it runs; holds its pid
    DIR/meta.db      SQLite metastore (shared with the node processes)
    DIR/wal/         local WAL backend root (one sub-directory per pchannel)
    DIR/logs/        one log file per node process

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

from headrace import cluster, dirlock, errors, runtime
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


class NodeProcess:
    """One supervised node process."""

    def __init__(self, cfg: StandaloneConfig, node_id: str) -> None:
        self.cfg = cfg
        self.node_id = node_id
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0

    async def start(self) -> None:
        self.cfg.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.cfg.log_dir / f"{self.node_id}.log"
        with log_path.open("ab") as log_file:
            self.proc = await asyncio.create_subprocess_exec(
                *node_command(self.cfg, self.node_id),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )

    async def stop(self, timeout: float = 15.0) -> None:
        proc = self.proc
        if proc is None or proc.returncode is not None:
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
    """Run until ``stop`` is set; return the process exit code.

    InUse if another standalone runs on the data directory.
    """
    cfg.validate()
    try:
        cfg.data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise errors.InvalidArgument(
            f"cannot create the data directory {cfg.data_dir}: {exc.strerror}"
        ) from None
    with dirlock.hold(cfg.data_dir, "headrace standalone"):
        return await _run_locked(cfg, stop, announce=announce)


async def _run_locked(cfg: StandaloneConfig, stop: asyncio.Event, *, announce: bool) -> int:
    runtime.tune_process()
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

"""Long-running commands: ``standalone``, ``node`` and the ``demo``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import headrace
from headrace import errors, logs
from headrace import standalone as standalone_mod
from headrace.cli import walflags
from headrace.cli.argtypes import positive_float, positive_int
from headrace.cli.retentionflags import (
    add_retention_args,
    forward_retention_flags,
    retention_options,
)
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.message.formats import RELEASE_FORMATS
from headrace.node import server as node_server
from headrace.tls import ServerTLS
from headrace.wal.framework import WALOptions
from headrace.wal.interceptors.segments import SegmentPolicy

WAL_BACKENDS = ("local", "kafka", "pulsar")
PARENT_AT_START = 0
"""``--exit-with-parent`` without a pid: the parent the node has when it starts."""
log = logging.getLogger(__name__)


def add_standalone_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", required=True, help="directory for metastore, WAL and logs")
    p.add_argument(
        "--nodes", type=positive_int, default=1, help="streaming node processes (default 1)"
    )
    p.add_argument("--pchannels", type=positive_int, default=4, help="pchannels (default 4)")
    p.add_argument("--cluster", default="default")
    p.add_argument(
        "--lease-ttl", type=positive_float, default=3.0, help="node session TTL in seconds"
    )
    p.add_argument("--fsync", choices=["batch", "interval"], default="batch")
    p.add_argument(
        "--segment-bytes",
        type=positive_int,
        default=None,
        help="local WAL: bytes after which a segment file is closed and a new one started "
        "(default 64 MiB); truncation deletes whole segment files",
    )
    p.add_argument("--timetick-interval-ms", type=positive_float, default=10.0)
    p.add_argument(
        "--message-format",
        type=int,
        choices=sorted(RELEASE_FORMATS.writes),
        default=max(RELEASE_FORMATS.writes),
        help="message format a new cluster writes (default: the newest, record batches); "
        "an existing cluster keeps its own (headrace format set)",
    )
    p.add_argument(
        "--wal",
        choices=WAL_BACKENDS,
        default="local",
        help="WAL backend (default local: files under --data-dir)",
    )
    walflags.add_broker_args(p)
    add_retention_args(p)
    add_segment_policy_args(p)
    p.add_argument(
        "--no-flush",
        dest="flush",
        action="store_false",
        help="do not run the flush runner (it runs when pyspark is installed)",
    )
    p.add_argument(
        "--warehouse",
        default="",
        help="where flushed tables go: an absolute directory (default DATA_DIR/warehouse)",
    )
    p.add_argument("--spark-master", default="local[2]", help="the flush runner's Spark master")
    p.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="serve the standalone's Prometheus metrics at HOST:PORT, node i's at "
        "PORT+1+i (port 0: free ports, logged); default: none",
    )
    add_tls_args(p)


def add_tls_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tls-cert", default=None, metavar="FILE", help="serve gRPC over TLS: PEM")
    p.add_argument("--tls-key", default=None, metavar="FILE", help="its private key (PEM)")
    p.add_argument(
        "--tls-client-ca",
        default=None,
        metavar="FILE",
        help="require client certificates signed by this CA (mutual TLS)",
    )
    p.add_argument(
        "--auth-file",
        default=None,
        metavar="FILE",
        help="identities and roles (JSON, see docs/security.md); needs TLS",
    )


def server_tls(args: argparse.Namespace) -> ServerTLS | None:
    """The node's TLS settings from its flags (InvalidArgument if half given)."""
    if args.tls_cert is None and args.tls_key is None:
        if args.tls_client_ca is not None:
            raise errors.InvalidArgument("--tls-client-ca needs --tls-cert and --tls-key")
        return None
    if args.tls_cert is None or args.tls_key is None:
        raise errors.InvalidArgument("--tls-cert and --tls-key go together")
    ca = Path(args.tls_client_ca) if args.tls_client_ca is not None else None
    return ServerTLS(Path(args.tls_cert), Path(args.tls_key), ca)


def forward_tls_flags(args: argparse.Namespace) -> list[str]:
    """The TLS flags of a standalone, for its nodes (absolute paths)."""
    flags: list[str] = []
    for name in ("tls_cert", "tls_key", "tls_client_ca", "auth_file"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(Path(value).resolve())]
    return flags


def add_node_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node-id", required=True)
    p.add_argument(
        "--metastore",
        required=True,
        help="sqlite:///path, etcd://host:port or etcds://host:port (TLS; certificates "
        "and user from HEADRACE_ETCD_* variables, never flags)",
    )
    p.add_argument("--cluster", default="default")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port (port 0: any free port)")
    p.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: none)",
    )
    p.add_argument(
        "--health-listen",
        default="",
        metavar="HOST:PORT",
        help="also serve the gRPC health service alone, in plaintext (for probes that "
        "cannot speak TLS)",
    )
    add_tls_args(p)
    p.add_argument("--wal", choices=WAL_BACKENDS, default="local", help="WAL backend")
    p.add_argument("--wal-dir", default=None, help="local backend: root directory")
    p.add_argument("--fsync", choices=["batch", "interval"], default="batch")
    p.add_argument(
        "--segment-bytes",
        type=positive_int,
        default=None,
        help="local WAL: bytes after which a segment file is closed and a new one started "
        "(default 64 MiB); truncation deletes whole segment files",
    )
    p.add_argument("--lease-ttl", type=positive_float, default=3.0)
    p.add_argument("--timetick-interval-ms", type=positive_float, default=10.0)
    p.add_argument(
        "--exit-with-parent",
        nargs="?",
        type=positive_int,
        const=PARENT_AT_START,
        default=None,
        metavar="PID",
        help="stop (gracefully) once process PID, the parent (e.g. a standalone), is gone; "
        "without PID: the parent this node has when it starts (which misses a parent "
        "that died before)",
    )
    walflags.add_broker_args(p)
    add_retention_args(p)
    add_segment_policy_args(p)


def add_segment_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--segment-lifetime-s",
        type=positive_float,
        default=None,
        help="collections: seal growing segments this long after they opened (default 15); "
        "bounds how long an insert waits for its flush",
    )


def segment_policy(args: argparse.Namespace) -> SegmentPolicy:
    """The segment policy the flags set (the defaults for a flag not given)."""
    if args.segment_lifetime_s is None:
        return SegmentPolicy()
    return SegmentPolicy(lifetime_s=args.segment_lifetime_s)


def forward_segment_policy_flags(args: argparse.Namespace) -> list[str]:
    """The given segment policy flags, for a node command line."""
    if args.segment_lifetime_s is None:
        return []
    return ["--segment-lifetime-s", str(args.segment_lifetime_s)]


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def wal_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Backend settings from node arguments (and, for secrets, files or ``env``).

    InvalidArgument names what is missing or wrong; see :mod:`headrace.cli.walflags`.
    """
    if args.wal == "local":
        walflags.check_backend(args, "local")
        if not args.wal_dir:
            raise errors.InvalidArgument("--wal local needs --wal-dir DIR")
        settings: dict[str, Any] = {"root": str(Path(args.wal_dir).resolve()), "fsync": args.fsync}
        if args.segment_bytes is not None:
            settings["segment_bytes"] = args.segment_bytes
        return settings
    if args.wal in walflags.BROKERS:
        for flag, value in (("--wal-dir", args.wal_dir), ("--segment-bytes", args.segment_bytes)):
            if value:
                raise errors.InvalidArgument(f"{flag} is for --wal local, not --wal {args.wal}")
        return walflags.broker_settings(args, env)
    raise errors.InvalidArgument(f"unknown WAL backend {args.wal!r} (known: local, kafka, pulsar)")


def orphaned(parent: int, current_parent: int) -> bool:
    """Whether a node watching for ``parent`` to go is orphaned, its parent
    now being ``current_parent`` (pure): a process whose parent dies is
    re-parented (to init or a subreaper), so its parent is then another."""
    return current_parent != parent


async def _stop_when_orphaned(stop: asyncio.Event, parent: int) -> None:
    while not stop.is_set():
        if orphaned(parent, os.getppid()):
            log.warning("parent process %d is gone; stopping", parent)
            stop.set()
            return
        await asyncio.sleep(0.5)


def _watch_parent(stop: asyncio.Event, parent: int) -> asyncio.Task[None]:
    """Stop once ``parent`` is gone; a failure of the watch stops the node too
    (it would otherwise outlive its parent unnoticed)."""

    async def on_failure(failure: TaskFailure) -> None:
        stop.set()

    return guarded_task(
        _stop_when_orphaned(stop, parent),
        f"watch of parent process {parent}",
        on_failure,
        finishable=True,
        logger=log,
    )


async def node(args: argparse.Namespace) -> int:
    log.info(
        "node %s starting: pid %d, headrace %s, metastore %s, cluster %s, WAL %s",
        args.node_id,
        os.getpid(),
        headrace.__version__,
        args.metastore,
        args.cluster,
        args.wal,
    )
    stop = asyncio.Event()
    _stop_on_signals(stop)
    watchers = []
    if args.exit_with_parent is not None:
        parent = args.exit_with_parent
        watchers.append(_watch_parent(stop, os.getppid() if parent == PARENT_AT_START else parent))
    config = node_server.NodeConfig(
        node_id=args.node_id,
        listen=args.listen,
        metastore_url=args.metastore,
        cluster=args.cluster,
        wal_backend=args.wal,
        backend_settings=wal_settings(args),
        wal_options=WALOptions(
            timetick_interval_ms=args.timetick_interval_ms,
            retention=retention_options(args),
            segments=segment_policy(args),
        ),
        session_ttl=args.lease_ttl,
        metrics_listen=args.metrics_listen,
        tls=server_tls(args),
        auth_file=Path(args.auth_file) if args.auth_file is not None else None,
        health_listen=args.health_listen,
    )
    try:
        with logs.bound(node=args.node_id):
            await node_server.run_node(config, stop)
    finally:
        await cancel_and_settle(watchers, what="stopping the watch of the parent", logger=log)
    return 0


async def standalone(args: argparse.Namespace) -> int:
    stop = asyncio.Event()
    _stop_on_signals(stop)
    cfg = standalone_config(args)
    return await standalone_mod_run(cfg, stop)


def standalone_config(
    args: argparse.Namespace, env: Mapping[str, str] | None = None
) -> standalone_mod.StandaloneConfig:
    """The standalone's configuration; broker flags are checked here, before any
    node starts, and handed on to the node processes as flags (files, never secrets)."""
    if args.wal == "local":
        walflags.check_backend(args, "local")
    else:
        walflags.broker_settings(args, env)
        if args.segment_bytes is not None:
            raise errors.InvalidArgument(
                f"--segment-bytes is for --wal local, not --wal {args.wal}"
            )
    retention_options(args)  # refused here, before any node starts
    return standalone_mod.StandaloneConfig(
        data_dir=Path(args.data_dir),
        nodes=args.nodes,
        pchannels=args.pchannels,
        cluster=args.cluster,
        lease_ttl_s=args.lease_ttl,
        fsync=args.fsync,
        segment_bytes=args.segment_bytes,
        timetick_interval_ms=args.timetick_interval_ms,
        message_format=args.message_format,
        wal=args.wal,
        wal_args=tuple(walflags.forward_flags(args)),
        node_args=(
            *forward_retention_flags(args),
            *forward_segment_policy_flags(args),
            *forward_tls_flags(args),
        ),
        flush=args.flush,
        warehouse=warehouse_location(args.warehouse),
        spark_master=args.spark_master,
        # Set on every command by the CLI's parser (absent when a test builds only these flags).
        log_format=getattr(args, "log_format", logs.LogFormat.TEXT),
        metrics_listen=args.metrics_listen,
    )


def warehouse_location(flag: str) -> str:
    """``--warehouse`` as the runner takes it (pure but for the working
    directory): an object store URL as is, a directory made absolute."""
    if not flag or "://" in flag:
        return flag
    return str(Path(flag).resolve())


async def standalone_mod_run(cfg: standalone_mod.StandaloneConfig, stop: asyncio.Event) -> int:
    return await standalone_mod.run_standalone(cfg, stop)


def standalone_command(data_dir: Path, *, nodes: int, pchannels: int) -> list[str]:
    """The command line of a ``headrace standalone`` child process (pure).

    ``-P`` (with the package root on PYTHONPATH, as for the standalone's nodes):
    a headrace/ folder in the working directory cannot shadow the package.
    """
    return [
        sys.executable,
        "-P",
        "-m",
        "headrace.cli",
        "standalone",
        "--data-dir",
        str(data_dir),
        "--nodes",
        str(nodes),
        "--pchannels",
        str(pchannels),
    ]


async def _start_standalone_process(data_dir: Path) -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(
        *standalone_command(data_dir, nodes=2, pchannels=4),
        stdout=asyncio.subprocess.PIPE,
        env=standalone_mod.node_environment(os.environ),
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    text = line.decode().strip()
    if not text.startswith("headrace standalone ready"):
        proc.kill()
        await proc.wait()
        raise errors.Unavailable(
            f"standalone did not become ready (said {text!r}); see the logs in {data_dir / 'logs'}"
        )
    url = next(part.split("=", 1)[1] for part in text.split() if part.startswith("metastore="))
    return proc, url


async def demo(args: argparse.Namespace) -> int:
    """Start standalone, move messages through it, check them, stop it."""
    # The demo's collection step and the client load pyarrow: imported here,
    # not with this module, which a streaming node's process imports too.
    from headrace.cli.demo_collection import demo_collection, pipeline_missing  # noqa: PLC0415

    with contextlib.ExitStack() as stack:
        if args.data_dir:
            data_dir = Path(args.data_dir)
        else:
            data_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="headrace-")))
        print(f"demo: starting standalone in {data_dir}", flush=True)
        proc, url = await _start_standalone_process(data_dir)
        try:
            print(f"demo: ready, metastore {url}", flush=True)
            ok = await _demo_traffic(url, args.count)
            missing = pipeline_missing()
            if ok and missing is None:
                ok = await demo_collection(url, data_dir, args.rows)
            elif ok:
                print(f"demo: the data pipeline step is skipped: {missing}", flush=True)
            print("demo: PASSED" if ok else "demo: FAILED", flush=True)
        finally:
            proc.send_signal(signal.SIGINT)
            code = await asyncio.wait_for(proc.wait(), 60)
        print(f"demo: standalone stopped (exit code {code})", flush=True)
        return 0 if ok and code == 0 else 1


async def _demo_traffic(url: str, count: int) -> bool:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    vchannels = [f"demo-collection-{i}" for i in range(4)]
    async with client_api.HeadraceClient(url) as client:
        producer = client.producer()
        start = time.monotonic()
        sent: dict[str, list[bytes]] = {v: [] for v in vchannels}
        pending = []
        for i in range(count):
            vch = vchannels[i % len(vchannels)]
            payload = f"{vch}:{i}".encode()
            sent[vch].append(payload)
            pending.append(producer.send(vch, payload))
        await asyncio.gather(*pending)
        await producer.close()
        elapsed = time.monotonic() - start
        print(
            f"demo: produced {count} messages on {len(vchannels)} vchannels in {elapsed:.2f}s",
            flush=True,
        )
        ok = True
        for vch in vchannels:
            got: list[bytes] = []
            async with client.consume(vch, start="earliest") as consumer:
                while len(got) < len(sent[vch]):
                    entry = await consumer.next(timeout=30)
                    if entry is None:
                        break
                    msg = entry.message
                    if msg.vchannel == vch and not msg.type.is_system:
                        got.append(msg.payload)
            same = got == sent[vch]
            ok = ok and same
            print(
                f"demo: {vch}: consumed {len(got)}/{len(sent[vch])} in order: "
                f"{'yes' if same else 'NO'}",
                flush=True,
            )
    return ok

"""``headrace bench ...``: benchmarks that print one JSON object."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from headrace import errors
from headrace.cli.argtypes import positive_float, positive_int


def _add_node(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    b = sub.add_parser("node", help="messages through a node over loopback vs in-process WAL")
    b.add_argument("--messages", type=int, default=50_000)
    b.add_argument("--size", type=int, default=1024)
    b.add_argument(
        "--format",
        type=int,
        default=2,
        choices=[1, 2],
        help="the cluster's message format: 2, record batches (default); 1, a record per message",
    )
    b.add_argument("--dir", default=None)
    b.add_argument(
        "--metrics",
        action="store_true",
        help="instead: the node with Prometheus metrics on over off (metrics_ratio)",
    )
    b.add_argument(
        "--tls",
        action="store_true",
        help="instead: the node with mutual TLS over plaintext (tls_ratio, tls_tail_p99_ms)",
    )
    b.add_argument("--rounds", type=int, default=3, help="with --metrics or --tls: pairs")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=node)


def add_bench_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", required=True)

    b = sub.add_parser(
        "wal",
        help="framework WAL append/scan vs a plain fsync loop (local) or the broker's raw "
        "client producer (kafka, pulsar)",
    )
    b.add_argument("--backend", default="local", choices=["local", "kafka", "pulsar"])
    b.add_argument("--messages", type=int, default=64 * 1000)
    b.add_argument("--size", type=int, default=1024)
    b.add_argument("--batch", type=int, default=64)
    b.add_argument(
        "--producers",
        type=int,
        default=1,
        help="producers appending at once; with a broker, also the batches the raw "
        "producer keeps in flight (default 1)",
    )
    b.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    b.add_argument(
        "--format",
        type=int,
        default=1,
        choices=[1, 2],
        help="message format the WAL writes: 1, a record per message; 2, a record batch per "
        "producer batch (default 1)",
    )
    b.add_argument("--dir", default=None, help="directory for the local WAL (default: temp)")
    b.add_argument("--kafka-bootstrap", default=None, help="host:port of a Kafka broker")
    b.add_argument("--pulsar-url", default=None, help="pulsar://host:port of a Pulsar broker")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=wal)

    _add_node(sub)

    b = sub.add_parser(
        "chaos",
        help="node processes under kills, pauses and moves; exactly-once checks "
        "(exit 1 on any loss, duplicate, reorder, stale append or timetick regression)",
    )
    b.add_argument("--duration", type=float, required=True, help="seconds of fault injection")
    b.add_argument("--nodes", type=int, default=3)
    b.add_argument("--pchannels", type=int, default=8)
    b.add_argument("--vchannels", type=int, default=8)
    b.add_argument("--lease-ttl", type=float, default=2.0, help="node session TTL in seconds")
    b.add_argument("--seed", type=int, default=None, help="fault schedule seed (default: random)")
    b.add_argument("--wal", default="local", choices=["local", "kafka", "pulsar"])
    b.add_argument("--kafka-bootstrap", default=None)
    b.add_argument("--pulsar-url", default=None)
    b.add_argument(
        "--broker-faults",
        metavar="DIR",
        default=None,
        help="also stall (SIGSTOP) and restart the broker: a test-bed broker served by "
        "'PYTHONPATH=scripts python -m headrace_testbed.kafka run DIR' (or .pulsar)",
    )
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument(
        "--keep", action="store_true", help="keep the run's directory (node logs, WAL, metastore)"
    )
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=chaos)

    _add_handoff(sub)

    b = sub.add_parser(
        "flush",
        help="the Spark flush job vs pyarrow writing the same rows to Parquet "
        "(needs the pipeline extra)",
    )
    b.add_argument("--rows", type=positive_int, default=1_000_000)
    b.add_argument("--shards", type=positive_int, default=4)
    b.add_argument("--batch-rows", type=positive_int, default=2000, help="rows per INSERT")
    b.add_argument("--master", default="local[2]")
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=flush)

    _add_pipeline(sub)
    _add_upgrade(sub)
    _add_scale(sub)


def _add_pipeline(sub: Any) -> None:
    """The data pipeline's benchmarks past the flush: flush lag, compaction, reads."""
    _add_flush_lag(sub)
    _add_compact(sub)
    _add_read(sub)


def _add_read(sub: Any) -> None:
    b = sub.add_parser(
        "read",
        help="snapshot reads of a flushed collection vs DuckDB scanning the same Iceberg table, "
        "and reads of growing rows from the WAL (needs the pipeline extra and duckdb)",
    )
    b.add_argument("--rows", type=positive_int, default=1_000_000)
    b.add_argument("--tail-rows", type=positive_int, default=100_000)
    b.add_argument("--shards", type=positive_int, default=4)
    b.add_argument("--batch-rows", type=positive_int, default=5000, help="rows per INSERT")
    b.add_argument("--repeats", type=positive_int, default=3, help="reads of each kind (best)")
    b.add_argument("--master", default="local[2]", help="Spark master of the flush job")
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=read)


def _add_scale(sub: Any) -> None:
    b = sub.add_parser(
        "scale",
        help="idle CPU of a node serving many idle pchannels; append throughput over many "
        "vchannels vs one",
    )
    b.add_argument("--pchannels", type=positive_int, default=256)
    b.add_argument("--idle-window", type=positive_float, default=10.0, help="measured seconds")
    b.add_argument("--vchannels", type=positive_int, default=1000)
    b.add_argument("--messages", type=positive_int, default=20_000, help="per side and round")
    b.add_argument("--rounds", type=positive_int, default=3)
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=scale)


def _add_handoff(sub: Any) -> None:
    b = sub.add_parser("handoff", help="unavailability of graceful moves and crash failovers")
    b.add_argument("--moves", type=int, default=20)
    b.add_argument("--failovers", type=int, default=5)
    b.add_argument("--lease-ttl", type=float, default=3.0, help="node session TTL in seconds")
    b.add_argument("--dir", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=handoff)


def _add_upgrade(sub: Any) -> None:
    b = sub.add_parser(
        "upgrade",
        help="a Rolling UpgradePlan under load on the real API server: starts the project's "
        "test bed (etcd, kube-apiserver, controller-manager, the process-runner kubelet, the "
        "operator); needs the source tree and the operator extra",
    )
    b.add_argument("--nodes", type=positive_int, default=3)
    b.add_argument("--pchannels", type=positive_int, default=16)
    b.add_argument("--rate", type=positive_float, default=400.0, help="load messages/s")
    b.add_argument("--batch", type=positive_int, default=16, help="load messages per send")
    b.add_argument(
        "--probe-interval",
        type=positive_float,
        default=0.02,
        help="seconds each pchannel's probe waits after an acknowledgement",
    )
    b.add_argument("--soak", type=positive_int, default=5, help="the plan's soakSeconds")
    b.add_argument("--dir", default=None, help="parent of the test bed's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=upgrade)


def _add_compact(sub: Any) -> None:
    b = sub.add_parser(
        "compact",
        help="the Spark compaction job vs pyarrow reading, sorting and rewriting the same "
        "files (needs the pipeline extra)",
    )
    b.add_argument("--rows", type=positive_int, default=200_000)
    b.add_argument("--files", type=positive_int, default=200, help="small input files")
    b.add_argument("--target-file-mb", type=positive_int, default=32)
    b.add_argument("--master", default="local[2]")
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=compact)


def _add_flush_lag(sub: Any) -> None:
    b = sub.add_parser(
        "flush-lag",
        help="flush_lag_p99_s: acknowledged insert to visible in a committed snapshot, under a "
        "steady ingest into a standalone with its flush runner (needs the pipeline extra)",
    )
    b.add_argument("--duration", type=positive_float, default=120.0, help="measured seconds")
    b.add_argument("--rate-mb", type=positive_float, default=10.0, help="MB/s of rows (1e6 B)")
    b.add_argument("--batch-rows", type=positive_int, default=2000, help="rows per INSERT")
    b.add_argument("--shards", type=positive_int, default=1)
    b.add_argument(
        "--drain-timeout",
        type=positive_float,
        default=180.0,
        help="seconds after the window for its rows to become visible (default 180)",
    )
    b.add_argument(
        "--flush-every",
        type=positive_float,
        default=None,
        help="also ask for a flush every this many seconds (default: seals from the node's "
        "segment policy alone)",
    )
    b.add_argument(
        "--segment-lifetime",
        type=positive_float,
        default=None,
        help="the node's --segment-lifetime-s (default: the policy's 600 s)",
    )
    b.add_argument("--master", default="local[2]")
    b.add_argument("--dir", default=None, help="parent of the run's directory (default: temp)")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=flush_lag)


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    sys.stdout.flush()


async def wal(args: argparse.Namespace) -> int:
    bench_wal = importlib.import_module("headrace.bench.wal")
    bench_broker = importlib.import_module("headrace.bench.broker")
    settings = bench_broker.backend_settings(args.backend, args.kafka_bootstrap, args.pulsar_url)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        result = await bench_wal.bench_wal(
            backend=args.backend,
            messages=args.messages,
            size=args.size,
            batch=args.batch,
            root=Path(tmp),
            producers=args.producers,
            rounds=args.rounds,
            settings=settings,
            message_format=args.format,
        )
    _emit(result, args.json)
    return 0


async def node(args: argparse.Namespace) -> int:
    bench_node = importlib.import_module("headrace.bench.node")
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        if args.tls:
            result = await bench_node.bench_tls(
                messages=args.messages, size=args.size, root=Path(tmp), rounds=args.rounds
            )
        elif args.metrics:
            result = await bench_node.bench_metrics(
                messages=args.messages, size=args.size, root=Path(tmp), rounds=args.rounds
            )
        else:
            result = await bench_node.bench_node(
                messages=args.messages, size=args.size, root=Path(tmp), message_format=args.format
            )
    _emit(result, args.json)
    return 0


def _chaos_backend_settings(args: argparse.Namespace) -> dict[str, Any]:
    if args.wal == "kafka":
        if not args.kafka_bootstrap:
            raise errors.InvalidArgument("bench chaos --wal kafka needs --kafka-bootstrap")
        return {"bootstrap_servers": args.kafka_bootstrap}
    if args.wal == "pulsar":
        if not args.pulsar_url:
            raise errors.InvalidArgument("bench chaos --wal pulsar needs --pulsar-url")
        return {"service_url": args.pulsar_url}
    return {}


async def chaos(args: argparse.Namespace) -> int:
    bench_chaos = importlib.import_module("headrace.bench.chaos")
    settings = _chaos_backend_settings(args)
    broker = None
    if args.broker_faults is not None:
        broker_faults = importlib.import_module("headrace.bench.broker_faults")
        broker = broker_faults.TestbedBroker(Path(args.broker_faults))
    with contextlib.ExitStack() as stack:
        if args.keep:
            tmp = tempfile.mkdtemp(prefix="headrace-chaos-", dir=args.dir)
            print(f"chaos: run directory {tmp}", file=sys.stderr, flush=True)
        else:
            tmp = stack.enter_context(
                tempfile.TemporaryDirectory(prefix="headrace-chaos-", dir=args.dir)
            )
        result = await bench_chaos.run_chaos(
            Path(tmp),
            args.duration,
            nodes=args.nodes,
            pchannels=args.pchannels,
            vchannels=args.vchannels,
            lease_ttl_s=args.lease_ttl,
            seed=args.seed,
            backend=args.wal,
            backend_settings=settings,
            broker=broker,
        )
    _emit(result, args.json)
    found = bench_chaos.violations(result)
    if found:
        print(f"chaos: invariants violated: {found}", file=sys.stderr, flush=True)
    return 1 if found else 0


async def handoff(args: argparse.Namespace) -> int:
    bench_handoff = importlib.import_module("headrace.bench.handoff")
    with tempfile.TemporaryDirectory(prefix="headrace-handoff-", dir=args.dir) as tmp:
        result = await bench_handoff.bench_handoff(
            Path(tmp), moves=args.moves, failovers=args.failovers, lease_ttl_s=args.lease_ttl
        )
    _emit(result, args.json)
    return 0


async def flush(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        raise errors.InvalidArgument("bench flush needs pyspark (the pipeline extra)")
    bench_flush = importlib.import_module("headrace.bench.flush")
    with tempfile.TemporaryDirectory(prefix="headrace-flush-", dir=args.dir) as tmp:
        result = await bench_flush.bench_flush(
            args.rows, Path(tmp), shards=args.shards, batch_rows=args.batch_rows, master=args.master
        )
    _emit(result, args.json)
    return 0


async def compact(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        raise errors.InvalidArgument("bench compact needs pyspark (the pipeline extra)")
    bench_compact = importlib.import_module("headrace.bench.compact")
    options = bench_compact.CompactBench(
        rows=args.rows, files=args.files, target_file_mb=args.target_file_mb, master=args.master
    )
    with tempfile.TemporaryDirectory(prefix="headrace-compact-", dir=args.dir) as tmp:
        result = await bench_compact.bench_compact(Path(tmp), options)
    _emit(result, args.json)
    return 0


async def read(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        raise errors.InvalidArgument("bench read needs pyspark (the pipeline extra)")
    bench_read = importlib.import_module("headrace.bench.read")
    with tempfile.TemporaryDirectory(prefix="headrace-read-", dir=args.dir) as tmp:
        result = await bench_read.bench_read(
            args.rows,
            Path(tmp),
            shards=args.shards,
            tail_rows=args.tail_rows,
            batch_rows=args.batch_rows,
            repeats=args.repeats,
            master=args.master,
        )
    _emit(result, args.json)
    return 0


async def flush_lag(args: argparse.Namespace) -> int:
    if importlib.util.find_spec("pyspark") is None:
        raise errors.InvalidArgument("bench flush-lag needs pyspark (the pipeline extra)")
    bench_lag = importlib.import_module("headrace.bench.flush_lag")
    options = bench_lag.LagOptions(
        duration_s=args.duration,
        rate_bytes_s=args.rate_mb * 1e6,
        batch_rows=args.batch_rows,
        shards=args.shards,
        drain_timeout_s=args.drain_timeout,
        master=args.master,
        flush_every_s=args.flush_every,
        segment_lifetime_s=args.segment_lifetime,
    )
    with tempfile.TemporaryDirectory(prefix="headrace-flush-lag-", dir=args.dir) as tmp:
        result = await bench_lag.bench_flush_lag(Path(tmp), options)
    _emit(result, args.json)
    return 0


UPGRADE_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_upgrade.py"
"""The upgrade benchmark: it drives the Kubernetes test bed and the operator,
which the core package never imports, so it runs as its own process."""


def upgrade_argv(args: argparse.Namespace, script: Path = UPGRADE_SCRIPT) -> list[str]:
    """The benchmark process's command line for ``headrace bench upgrade``."""
    argv = [
        sys.executable,
        str(script),
        f"--nodes={args.nodes}",
        f"--pchannels={args.pchannels}",
        f"--rate={args.rate:g}",
        f"--batch={args.batch}",
        f"--probe-interval={args.probe_interval:g}",
        f"--soak={args.soak}",
    ]
    return argv + ([f"--workdir={args.dir}"] if args.dir else [])


async def upgrade(args: argparse.Namespace) -> int:
    if not UPGRADE_SCRIPT.is_file():
        raise errors.InvalidArgument(
            f"bench upgrade needs the source tree (benchmarks/, e2e/, scripts/, operator/): "
            f"{UPGRADE_SCRIPT} not found"
        )
    if importlib.util.find_spec("kubernetes") is None:
        raise errors.InvalidArgument("bench upgrade needs the kubernetes package (operator extra)")
    process = await asyncio.create_subprocess_exec(
        *upgrade_argv(args), stdout=asyncio.subprocess.PIPE, stdin=asyncio.subprocess.DEVNULL
    )
    out, _ = await process.communicate()
    lines = out.decode(errors="replace").strip().splitlines()
    if not lines:
        print(
            f"bench upgrade: the benchmark exited {process.returncode} without a result "
            "(its messages are above)",
            file=sys.stderr,
        )
        return 1
    _emit(json.loads(lines[-1]), args.json)
    return 0 if process.returncode == 0 else 1


async def scale(args: argparse.Namespace) -> int:
    bench_scale = importlib.import_module("headrace.bench.scale")
    options = bench_scale.ScaleOptions(
        pchannels=args.pchannels,
        idle_window_s=args.idle_window,
        vchannels=args.vchannels,
        messages=args.messages,
        rounds=args.rounds,
    )
    with tempfile.TemporaryDirectory(prefix="headrace-scale-", dir=args.dir) as tmp:
        result = await bench_scale.bench_scale(Path(tmp), options)
    _emit(result, args.json)
    return 0

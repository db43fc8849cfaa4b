"""``headrace bench ...``: benchmarks that print one JSON object."""

from __future__ import annotations

import argparse
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
    b.add_argument("--dir", default=None, help="directory for the local WAL (default: temp)")
    b.add_argument("--kafka-bootstrap", default=None, help="host:port of a Kafka broker")
    b.add_argument("--pulsar-url", default=None, help="pulsar://host:port of a Pulsar broker")
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=wal)

    b = sub.add_parser("node", help="messages through a node over loopback vs in-process WAL")
    b.add_argument("--messages", type=int, default=50_000)
    b.add_argument("--size", type=int, default=1024)
    b.add_argument("--dir", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=node)

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

    b = sub.add_parser("handoff", help="unavailability of graceful moves and crash failovers")
    b.add_argument("--moves", type=int, default=20)
    b.add_argument("--failovers", type=int, default=5)
    b.add_argument("--lease-ttl", type=float, default=3.0, help="node session TTL in seconds")
    b.add_argument("--dir", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=handoff)

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


def _add_pipeline(sub: Any) -> None:
    """The data pipeline's benches (flush-lag, compact)."""
    _add_flush_lag(sub)
    _add_compact(sub)


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
        )
    _emit(result, args.json)
    return 0


async def node(args: argparse.Namespace) -> int:
    bench_node = importlib.import_module("headrace.bench.node")
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        result = await bench_node.bench_node(messages=args.messages, size=args.size, root=Path(tmp))
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

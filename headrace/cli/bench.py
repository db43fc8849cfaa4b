"""``headrace bench ...``: benchmarks that print one JSON object."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from headrace import errors


def add_bench_args(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="bench", required=True)

    b = sub.add_parser("wal", help="framework WAL append/scan vs a plain fsync loop")
    b.add_argument("--backend", default="local", choices=["local", "kafka", "pulsar"])
    b.add_argument("--messages", type=int, default=64 * 1000)
    b.add_argument("--size", type=int, default=1024)
    b.add_argument("--batch", type=int, default=64)
    b.add_argument("--dir", default=None, help="directory for the local WAL (default: temp)")
    b.add_argument("--kafka-bootstrap", default=None)
    b.add_argument("--pulsar-url", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=wal)

    b = sub.add_parser("node", help="messages through a node over loopback vs in-process WAL")
    b.add_argument("--messages", type=int, default=50_000)
    b.add_argument("--size", type=int, default=1024)
    b.add_argument("--dir", default=None)
    b.add_argument("--json", action="store_true")
    b.set_defaults(handler=node)


def _emit(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")
    sys.stdout.flush()


async def wal(args: argparse.Namespace) -> int:
    bench_wal = importlib.import_module("headrace.bench.wal")
    settings: dict[str, Any] = {}
    if args.backend == "kafka":
        if not args.kafka_bootstrap:
            raise errors.InvalidArgument("bench wal --backend kafka needs --kafka-bootstrap")
        settings["bootstrap_servers"] = args.kafka_bootstrap
    elif args.backend == "pulsar":
        if not args.pulsar_url:
            raise errors.InvalidArgument("bench wal --backend pulsar needs --pulsar-url")
        settings["service_url"] = args.pulsar_url
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        result = await bench_wal.bench_wal(
            backend=args.backend,
            messages=args.messages,
            size=args.size,
            batch=args.batch,
            root=Path(tmp),
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

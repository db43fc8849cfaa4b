"""WAL benchmark: framework WAL append and scan against a baseline in the same run.

The baseline is a plain write+fsync loop for the local WAL, and the broker's
raw client producer for Kafka and Pulsar (see :mod:`headrace.bench.broker`).
Prints one JSON object (see :func:`headrace.bench.wal.bench_wal` for the
fields). Headline figures: ``ratio`` (median of the rounds' WAL/baseline
ratios; local target >= 0.5, brokers >= 0.9), ``scan_msgs_per_s`` (cold scan
through the framework's scanner; local target >= 300,000) and, on brokers,
``p99_overhead_ms`` (target <= 2).

    python benchmarks/bench_wal.py [--messages N] [--rounds R] [--dir PATH]
    python benchmarks/bench_wal.py --backend kafka --kafka-bootstrap 127.0.0.1:9092
    python benchmarks/bench_wal.py --backend pulsar --pulsar-url pulsar://127.0.0.1:6650
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile

from headrace.bench.broker import backend_settings
from headrace.bench.wal import bench_wal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    parser.add_argument("--backend", default="local", choices=["local", "kafka", "pulsar"])
    parser.add_argument("--kafka-bootstrap", default=None)
    parser.add_argument("--pulsar-url", default=None)
    args = parser.parse_args(argv)
    settings = backend_settings(args.backend, args.kafka_bootstrap, args.pulsar_url)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        result = asyncio.run(
            bench_wal(
                args.backend,
                messages=args.messages,
                size=args.size,
                batch=args.batch,
                root=tmp,
                producers=args.producers,
                rounds=args.rounds,
                settings=settings,
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""WAL benchmark: framework WAL append and scan against a plain write+fsync loop.

Prints one JSON object (see :func:`headrace.bench.wal.bench_wal` for the
fields). Headline figures: ``ratio`` (one producer, median of the rounds'
WAL/baseline ratios; target >= 0.5) and ``scan_msgs_per_s`` (cold scan through
the framework's scanner; target >= 300,000).

    python benchmarks/bench_wal.py [--messages N] [--rounds R] [--dir PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile

from headrace.bench.wal import bench_wal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--producers", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-bench-", dir=args.dir) as tmp:
        result = asyncio.run(
            bench_wal(
                "local",
                messages=args.messages,
                size=args.size,
                batch=args.batch,
                root=tmp,
                producers=args.producers,
                rounds=args.rounds,
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

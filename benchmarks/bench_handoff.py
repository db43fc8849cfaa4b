"""Handoff benchmark: unavailability of graceful moves and crash failovers.

Prints one JSON object (see :func:`headrace.bench.handoff.bench_handoff` for
the fields). Targets: ``graceful_p99_ms`` <= 500; ``failover_p99_ms`` <= the
lease TTL + 1000 ms (``failover_target_p99_ms``).

    python benchmarks/bench_handoff.py [--moves N] [--failovers N] [--lease-ttl S]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from headrace.bench.handoff import bench_handoff


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--moves", type=int, default=20)
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--lease-ttl", type=float, default=3.0)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-handoff-", dir=args.dir) as tmp:
        result = asyncio.run(
            bench_handoff(
                Path(tmp), moves=args.moves, failovers=args.failovers, lease_ttl_s=args.lease_ttl
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

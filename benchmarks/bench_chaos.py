"""Chaos benchmark: real node processes under kills, pauses and moves.

Prints one JSON object (see :func:`headrace.bench.chaos.run_chaos` for the
fields). Headline figures: ``lost``, ``duplicates``, ``reordered``,
``stale_term_appends`` and ``timetick_regressions`` must all be 0 (the exit
status is 1 otherwise); ``max_unavailable_ms`` is the longest time a producer
waited for any acknowledgement.

    python benchmarks/bench_chaos.py [--duration S] [--nodes N] [--pchannels P] [--seed X]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

from headrace.bench.chaos import run_chaos, violations


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=300.0, help="seconds of faults")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pchannels", type=int, default=8)
    parser.add_argument("--vchannels", type=int, default=8)
    parser.add_argument("--lease-ttl", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--dir", default=None, help="where the files go (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="headrace-chaos-", dir=args.dir) as tmp:
        result = asyncio.run(
            run_chaos(
                Path(tmp),
                args.duration,
                nodes=args.nodes,
                pchannels=args.pchannels,
                vchannels=args.vchannels,
                lease_ttl_s=args.lease_ttl,
                seed=args.seed,
            )
        )
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 1 if violations(result) else 0


if __name__ == "__main__":
    sys.exit(main())

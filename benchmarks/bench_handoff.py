"""Handoff benchmark: unavailability of graceful moves and crash failovers.

Prints one JSON object (see :func:`headrace.bench.handoff.bench_handoff` for
the fields). Targets: ``graceful_p99_ms`` <= 500; ``failover_p99_ms`` <= the
lease TTL + 1000 ms (``failover_target_p99_ms``).

    python benchmarks/bench_handoff.py [--moves N] [--failovers N] [--lease-ttl S]
"""

from __future__ import annotations

import sys

from headrace.cli.main import main as headrace_main

DEFAULTS: list[str] = []
"""This script's defaults; flags given on its command line override them."""


def main(argv: list[str] | None = None) -> int:
    """``headrace bench handoff --json`` with this script's defaults."""
    args = sys.argv[1:] if argv is None else argv
    return headrace_main(["bench", "handoff", "--json", *DEFAULTS, *args])


if __name__ == "__main__":
    sys.exit(main())

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

import sys

from headrace.cli.main import main as headrace_main

DEFAULTS: list[str] = ["--messages", "20000"]
"""This script's defaults; flags given on its command line override them."""


def main(argv: list[str] | None = None) -> int:
    """``headrace bench wal --json`` with this script's defaults."""
    args = sys.argv[1:] if argv is None else argv
    return headrace_main(["bench", "wal", "--json", *DEFAULTS, *args])


if __name__ == "__main__":
    sys.exit(main())

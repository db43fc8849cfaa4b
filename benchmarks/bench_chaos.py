"""Chaos benchmark: real node processes under kills, pauses and moves.

Prints one JSON object (see :func:`headrace.bench.chaos.run_chaos` for the
fields). Headline figures: ``lost``, ``duplicates``, ``reordered``,
``stale_term_appends`` and ``timetick_regressions`` must all be 0 (the exit
status is 1 otherwise); ``max_unavailable_ms`` is the longest time a producer
waited for any acknowledgement.

    python benchmarks/bench_chaos.py [--duration S] [--nodes N] [--pchannels P] [--seed X]
"""

from __future__ import annotations

import sys

from headrace.cli.main import main as headrace_main

DEFAULTS: list[str] = ["--duration", "300"]
"""This script's defaults; flags given on its command line override them."""


def main(argv: list[str] | None = None) -> int:
    """``headrace bench chaos --json`` with this script's defaults."""
    args = sys.argv[1:] if argv is None else argv
    return headrace_main(["bench", "chaos", "--json", *DEFAULTS, *args])


if __name__ == "__main__":
    sys.exit(main())

"""Entry point: ``python -m headrace_operator`` (what ``kopf run`` would do).

Watches StreamingClusters and PChannelAssignments in every namespace, or only
in those given with ``--namespace``; serves kopf's liveness probe at
``--liveness`` (``http://0.0.0.0:8080/healthz`` in the chart).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Sequence

from headrace.logs import LogFormat, configure


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m headrace_operator", description="Headrace Kubernetes operator"
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        help="watch this namespace (repeatable; default: all namespaces)",
    )
    parser.add_argument("--kubeconfig", default=None, help="default: in-cluster, then KUBECONFIG")
    parser.add_argument(
        "--resync-seconds",
        type=float,
        default=float(os.environ.get("HEADRACE_RESYNC_SECONDS", "10")),
        help="level-based re-sync interval of every cluster (default 10)",
    )
    parser.add_argument(
        "--liveness", default=None, help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0)
    parser.add_argument(
        "--metrics-listen",
        default="",
        metavar="HOST:PORT",
        help="serve Prometheus metrics at http://HOST:PORT/metrics (default: none)",
    )
    parser.add_argument(
        "--log-format",
        type=LogFormat,
        choices=list(LogFormat),
        default=os.environ.get("HEADRACE_LOG_FORMAT", LogFormat.TEXT.value),
        help="text, or json: one event per line (default: $HEADRACE_LOG_FORMAT or text)",
    )
    return parser


async def run(args: argparse.Namespace, stop: asyncio.Event | None = None) -> None:
    """Run the operator until ``stop`` is set (or forever)."""
    os.environ["HEADRACE_RESYNC_SECONDS"] = str(args.resync_seconds)
    import kopf  # noqa: PLC0415 - after the interval is set for the handlers

    from headrace_operator import handlers  # noqa: PLC0415, F401 - registers the handlers

    await kopf.operator(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        liveness_endpoint=args.liveness,
        standalone=True,
        stop_flag=stop,
        memo=kopf.Memo(kubeconfig=args.kubeconfig, metrics_listen=args.metrics_listen),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure(logging.WARNING - 10 * min(args.verbose + 1, 2), args.log_format)
    try:
        asyncio.run(run(args))
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

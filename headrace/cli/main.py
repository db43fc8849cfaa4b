"""The ``headrace`` command: one entry point, one sub-command per task."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from headrace import errors

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

EXIT_ERROR = 1
EXIT_USAGE = 2


def _add_metastore(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metastore",
        required=True,
        help="metastore URL: sqlite:///path/to/meta.db or etcd://host:port[,host:port]",
    )
    p.add_argument("--cluster", default="default", help="cluster name (default: default)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def build_parser() -> argparse.ArgumentParser:
    from headrace.cli import admin, bench, data, run  # noqa: PLC0415 - keep start-up light

    parser = argparse.ArgumentParser(
        prog="headrace", description="Headrace write-ahead-log streaming service"
    )
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("standalone", help="run the whole service on this machine")
    run.add_standalone_args(p)
    p.set_defaults(handler=run.standalone)

    p = sub.add_parser("node", help="run one streaming node")
    run.add_node_args(p)
    p.set_defaults(handler=run.node)

    p = sub.add_parser("demo", help="start standalone, produce and consume a little, stop")
    p.add_argument("--data-dir", default=None, help="data directory (default: a temporary one)")
    p.add_argument("--count", type=int, default=2000)
    p.set_defaults(handler=run.demo)

    p = sub.add_parser("produce", help="append messages to a vchannel")
    _add_metastore(p)
    data.add_produce_args(p)
    p.set_defaults(handler=data.produce)

    p = sub.add_parser("consume", help="read messages of a vchannel")
    _add_metastore(p)
    data.add_consume_args(p)
    p.set_defaults(handler=data.consume)

    p = sub.add_parser("status", help="nodes and pchannels with owner, term and state")
    _add_metastore(p)
    p.set_defaults(handler=admin.status)

    p = sub.add_parser("move", help="move a pchannel to a node by graceful handoff")
    _add_metastore(p)
    p.add_argument("--pchannel", required=True)
    p.add_argument("--to", required=True, dest="to_node", help="target node id")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(handler=admin.move)

    p = sub.add_parser("drain", help="move every pchannel off a node and freeze it")
    _add_metastore(p)
    p.add_argument("--node", required=True)
    p.add_argument("--timeout", type=float, default=60.0)
    p.set_defaults(handler=admin.drain)

    p = sub.add_parser("wal", help="inspect WAL storage")
    wal_sub = p.add_subparsers(dest="wal_command", required=True)
    d = wal_sub.add_parser("dump", help="list records of a local WAL")
    d.add_argument("--dir", required=True, help="the local WAL root directory")
    d.add_argument("--pchannel", required=True)
    d.add_argument("--limit", type=int, default=0, help="stop after N records (0: all)")
    d.add_argument("--json", action="store_true")
    d.set_defaults(handler=admin.wal_dump)

    p = sub.add_parser("bench", help="benchmarks (print JSON)")
    bench.add_bench_args(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.WARNING - 10 * min(args.verbose, 2),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    handler: Handler = args.handler
    try:
        return asyncio.run(handler(args))
    except KeyboardInterrupt:
        return 130
    except (errors.InvalidArgument, errors.InUse) as exc:
        print(f"headrace: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except errors.HeadraceError as exc:
        hint = " (retryable)" if exc.retryable else ""
        print(f"headrace: error: {exc}{hint}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

"""The ``headrace`` command: one entry point, one sub-command per task."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from headrace import errors, logs
from headrace.cli.argtypes import non_negative_int, positive_float, positive_int
from headrace.cli.exits import (
    EXIT_BROKEN_PIPE,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    exit_code,
)

LOG_FORMAT_ENV = "HEADRACE_LOG_FORMAT"

Handler = Callable[[argparse.Namespace], Coroutine[Any, Any, int]]

__all__ = ["EXIT_ERROR", "EXIT_USAGE", "build_parser", "main"]


def _add_metastore(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--metastore",
        required=True,
        help="metastore URL: sqlite:///path/to/meta.db or etcd://host:port[,host:port] "
        "(etcds:// for TLS; certificates and user from HEADRACE_ETCD_* variables)",
    )
    p.add_argument("--cluster", default="default", help="cluster name (default: default)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")


def _add_admin_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from headrace.cli import admin  # noqa: PLC0415 - keep start-up light

    p = sub.add_parser("status", help="nodes and pchannels with owner, term and state")
    _add_metastore(p)
    p.set_defaults(handler=admin.status)

    p = sub.add_parser("move", help="move a pchannel to a node by graceful handoff")
    _add_metastore(p)
    p.add_argument("--pchannel", required=True)
    p.add_argument("--to", required=True, dest="to_node", help="target node id")
    p.add_argument("--timeout", type=positive_float, default=30.0, help="seconds (default 30)")
    p.set_defaults(handler=admin.move)

    p = sub.add_parser("drain", help="move every pchannel off a node and freeze it")
    _add_metastore(p)
    p.add_argument("--node", required=True)
    p.add_argument("--timeout", type=positive_float, default=60.0, help="seconds (default 60)")
    p.set_defaults(handler=admin.drain)

    p = sub.add_parser("undrain", help="unfreeze a node (ends a drain); it takes pchannels again")
    _add_metastore(p)
    p.add_argument("--node", required=True)
    p.set_defaults(handler=admin.undrain)

    p = sub.add_parser("balancer", help="suspend or resume the balancer's moves")
    _add_metastore(p)
    p.add_argument(
        "action",
        choices=["suspend", "resume"],
        help="suspend: no balancing moves (drains and requested moves go on); resume",
    )
    p.set_defaults(handler=admin.balancer)

    p = sub.add_parser("format", help="the cluster's message format version")
    format_sub = p.add_subparsers(dest="format_command", required=True)
    f = format_sub.add_parser("show", help="the cluster's format and what each node reads/writes")
    _add_metastore(f)
    f.set_defaults(handler=admin.format_show)
    f = format_sub.add_parser(
        "set", help="switch the format nodes write (every node must read and write it)"
    )
    _add_metastore(f)
    f.add_argument("version", type=int)
    f.set_defaults(handler=admin.format_set)
    p = sub.add_parser(
        "writes", help="stop writes cluster-wide (producers get WRITES_STOPPED), resume, status"
    )
    _add_metastore(p)
    p.add_argument(
        "action",
        choices=["stop", "resume", "status"],
        help="stop: every node refuses producers' appends (retryable) until resume; "
        "status: the stop and each node's appends in flight",
    )
    p.add_argument("--reason", default="", help="why (shown to producers; required for stop)")
    p.set_defaults(handler=admin.writes)


def build_parser() -> argparse.ArgumentParser:
    from headrace.cli import admin, bench, collection, data, run  # noqa: PLC0415 - light start

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
    # A server process: its log (start-up, WAL opens and closes with their
    # terms, handoffs, errors) is worth keeping in normal operation.
    p.set_defaults(handler=run.node, log_level=logging.INFO)

    p = sub.add_parser("demo", help="start standalone, produce and consume a little, stop")
    p.add_argument("--data-dir", default=None, help="data directory (default: a temporary one)")
    p.add_argument("--count", type=positive_int, default=2000, help="messages to produce")
    p.add_argument(
        "--rows",
        type=positive_int,
        default=10_000,
        help="rows of the collection step (with the pipeline extra installed)",
    )
    p.set_defaults(handler=run.demo)

    p = sub.add_parser("produce", help="append messages to a vchannel")
    _add_metastore(p)
    data.add_produce_args(p)
    p.set_defaults(handler=data.produce)

    p = sub.add_parser("consume", help="read messages of a vchannel")
    _add_metastore(p)
    data.add_consume_args(p)
    p.set_defaults(handler=data.consume)

    _add_admin_commands(sub)
    collection.add_commands(sub)

    p = sub.add_parser("wal", help="inspect WAL storage")
    wal_sub = p.add_subparsers(dest="wal_command", required=True)
    d = wal_sub.add_parser("dump", help="list records of a local WAL")
    d.add_argument("--dir", required=True, help="the local WAL root directory")
    d.add_argument("--pchannel", required=True)
    d.add_argument(
        "--limit", type=non_negative_int, default=0, help="stop after N records (0: all)"
    )
    d.add_argument("--json", action="store_true")
    d.set_defaults(handler=admin.wal_dump)
    admin.add_wal_repair(wal_sub)

    p = sub.add_parser("bench", help="benchmarks (print JSON)")
    bench.add_bench_args(p)
    for command in sub.choices.values():
        _add_log_format(command)
    return parser


def _add_log_format(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        type=logs.LogFormat,
        choices=list(logs.LogFormat),
        # A string default goes through ``type``: a bad value in the variable is a
        # usage error naming the option, not a traceback.
        default=os.environ.get(LOG_FORMAT_ENV, logs.LogFormat.TEXT.value),
        help=f"text, or json: one event per line with node, pchannel and term where they "
        f"apply (default: ${LOG_FORMAT_ENV} or text)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    base_level: int = getattr(args, "log_level", logging.WARNING)
    logs.configure(max(logging.DEBUG, base_level - 10 * args.verbose), args.log_format)
    handler: Handler = args.handler
    try:
        code = asyncio.run(handler(args))
        sys.stdout.flush()
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _stdout_closed()
    except errors.HeadraceError as exc:
        hint = " (retryable)" if exc.retryable else ""
        print(f"headrace: error: {exc}{hint}", file=sys.stderr)
        return exit_code(exc.code)
    return code


def _stdout_closed() -> int:
    """The reader of stdout went away (``headrace status | head``): stop quietly,
    like other command-line tools, without a traceback at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    sys.exit(main())

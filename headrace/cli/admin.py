"""``headrace status``, ``move``, ``drain``, ``undrain``, ``balancer``, ``format``, ``writes``,
``wal dump`` and ``wal repair``.

The commands import the client (which loads pyarrow) when they run, not with
this module: every ``headrace`` process builds the whole parser, a streaming
node's too, and a node has no use for the client.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from headrace import errors
from headrace.wal.local import dump as local_dump
from headrace.wal.local import repair as local_repair


def _print_table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    widths = {c: max([len(c)] + [len(str(r.get(c, ""))) for r in rows]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))


async def status(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    report = await client_api.cluster_status(args.metastore, cluster=args.cluster)
    if args.json:
        print(json.dumps(report))
        return 0
    print(
        f"cluster {args.cluster}: {len(report['nodes'])} node(s), "
        f"{len(report['pchannels'])} pchannel(s), balancer {report['balancer']}, "
        f"message format {report['message_format']}"
    )
    for node in report["nodes"]:
        node["state"] = _node_state(node)
    _print_table(report["nodes"], ["node_id", "address", "state", "pchannels"])
    print()
    for row in report["pchannels"]:
        unflushed = row.get("unflushed_bytes")
        row["unflushed"] = "-" if unflushed is None else unflushed
    _print_table(
        report["pchannels"],
        [
            *("pchannel", "state", "node", "term", "wal_state", "lag"),
            *("checkpoint", "unflushed", "truncated_below"),
        ],
    )
    for row in report["pchannels"]:
        if row.get("wal_error"):
            print(f"{row['pchannel']}: {row['wal_error']}")
        if row.get("reason"):
            print(f"{row['pchannel']} waits: {row['reason']}")
    print(writes_line(report["writes"]))
    return 0


def writes_line(writes: dict[str, Any]) -> str:
    """The write stop in one line of text (pure)."""
    if not writes["stopped"]:
        return "writes: flowing"
    by = f" by {writes['by']}" if writes["by"] else ""
    drained = writes["drained"] or "every node obeys it, nothing in flight"
    return f"writes: STOPPED{by}: {writes['reason']} ({drained})"


async def writes(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    if args.action == "stop":
        if not args.reason.strip():
            raise errors.InvalidArgument("writes stop needs --reason (producers are shown it)")
        outcome = await client_api.stop_writes(args.metastore, args.reason, cluster=args.cluster)
    elif args.action == "resume":
        outcome = await client_api.resume_writes(args.metastore, cluster=args.cluster)
    else:
        outcome = await client_api.writes_status(args.metastore, cluster=args.cluster)
    if args.json:
        print(json.dumps(outcome))
    elif "was_stopped" in outcome:
        print("writes: flowing" + ("" if outcome["was_stopped"] else " (were not stopped)"))
    else:
        print(writes_line(outcome))
        for node, report in outcome.get("nodes", {}).items():
            seen = "in flight: " + str(report["in_flight"]) if report["acknowledged"] else "not yet"
            print(f"  {node}: {seen}")
    return 0


def _node_state(node: dict[str, Any]) -> str:
    """running, frozen, draining (frozen, still holding pchannels), each with
    ``(not running)`` for a frozen node without a session (pure)."""
    if node["draining"] and node["pchannels"]:
        flag = "draining"
    else:
        flag = "frozen" if node["frozen"] else "running"
    if node["alive"]:
        return flag
    return f"{flag} (not running)"


async def move(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.request_move(
        args.metastore, args.pchannel, args.to_node, cluster=args.cluster, timeout=args.timeout
    )
    _report(args, outcome)
    return 0


async def drain(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.request_drain(
        args.metastore, args.node, cluster=args.cluster, timeout=args.timeout
    )
    _report(args, outcome)
    return 0


async def undrain(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.request_undrain(args.metastore, args.node, cluster=args.cluster)
    _report(args, outcome)
    return 0


async def balancer(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.set_balancer(
        args.metastore, suspended=args.action == "suspend", cluster=args.cluster
    )
    _report(args, outcome)
    return 0


async def format_show(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    _report(args, await client_api.message_formats(args.metastore, cluster=args.cluster))
    return 0


async def format_set(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.set_message_format(
        args.metastore, args.version, cluster=args.cluster
    )
    _report(args, outcome)
    return 0


def _report(args: argparse.Namespace, outcome: dict[str, Any]) -> None:
    if args.json:
        print(json.dumps(outcome))
    else:
        print(" ".join(f"{k}={v}" for k, v in outcome.items()))


async def wal_dump(args: argparse.Namespace) -> int:
    root = Path(args.dir)
    if not (root / args.pchannel).is_dir():
        raise errors.NotFound(
            f"no local WAL for pchannel {errors.quoted(args.pchannel)} under {root}"
        )
    if not args.json:
        print("ID\tTYPE\tVCHANNEL\tTIMETICK\tTERM\tSIZE\tERROR")
    for count, row in enumerate(local_dump.iter_dump(str(root), args.pchannel), start=1):
        data = row._asdict()
        if not data["error"]:
            del data["error"]
        if args.json:
            print(json.dumps(data, default=str))
        else:
            print(
                "\t".join(
                    str(data.get(k, ""))
                    for k in ("id", "type", "vchannel", "timetick", "term", "size")
                )
            )
        if args.limit and count >= args.limit:
            break
    return 0


def add_wal_repair(wal_sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = wal_sub.add_parser(
        "repair",
        help="keep the valid prefix of a damaged local WAL, move the rest aside (never deletes)",
    )
    r.add_argument("--dir", required=True, help="the local WAL root directory")
    r.add_argument("--pchannel", required=True)
    r.add_argument("--json", action="store_true")
    r.set_defaults(handler=wal_repair)


async def wal_repair(args: argparse.Namespace) -> int:
    report = local_repair.repair(args.dir, args.pchannel)
    if args.json:
        print(json.dumps(dataclasses.asdict(report)))
    else:
        print(report.summary())
    return 0

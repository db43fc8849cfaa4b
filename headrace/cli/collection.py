"""``headrace collections`` (list, describe, create, drop), ``headrace flush``,
``headrace compact`` and ``headrace read`` (:mod:`headrace.cli.read`).

The commands import the client and pyarrow when they run, not with this
module: every ``headrace`` process (a streaming node too) builds the parser.
"""

from __future__ import annotations

import argparse
import json
from typing import Any, TypeAlias

from headrace import errors
from headrace.cli import read as read_command
from headrace.cli.argtypes import positive_float, positive_int
from headrace.table.collections import CollectionSpec

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


def _add_cluster(p: argparse.ArgumentParser, *, inherited: bool) -> None:
    """--metastore, --cluster, --json; on a sub-command they default to the
    parent's values (``collections --metastore X describe NAME`` and
    ``collections describe NAME --metastore X`` both work)."""
    keep = argparse.SUPPRESS
    p.add_argument(
        "--metastore",
        default=keep if inherited else None,
        help="metastore URL: sqlite:///path/to/meta.db or etcd://host:port[,host:port]",
    )
    p.add_argument(
        "--cluster", default=keep if inherited else "default", help="cluster (default: default)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        default=keep if inherited else False,
        help="print JSON instead of text",
    )


def add_commands(sub: Sub) -> None:
    p = sub.add_parser("collections", help="list, describe, create or drop collections")
    _add_cluster(p, inherited=False)
    p.set_defaults(handler=list_collections, include_dropped=False)
    actions = p.add_subparsers(dest="collections_command", metavar="ACTION")

    a = actions.add_parser("list", help="the collections (the default action)")
    _add_cluster(a, inherited=True)
    a.add_argument("--all", dest="include_dropped", action="store_true", help="dropped ones too")
    a.set_defaults(handler=list_collections)

    a = actions.add_parser("describe", help="one collection: schema, shards, state")
    _add_cluster(a, inherited=True)
    a.add_argument("name")
    a.set_defaults(handler=describe)

    a = actions.add_parser("create", help="create a collection (idempotent)")
    _add_cluster(a, inherited=True)
    a.add_argument("name")
    a.add_argument(
        "--schema",
        required=True,
        help='JSON ({"pk": "int64", "vector": "list<float32>"} or a list of '
        '{"name", "type", "nullable"}) or a file holding it',
    )
    a.add_argument("--primary-key", default="pk", help="the primary-key field (default pk)")
    a.add_argument("--shards", type=positive_int, default=1, help="shard vchannels (default 1)")
    a.set_defaults(handler=create)

    a = actions.add_parser("drop", help="drop a collection: flushing stops, its data is garbage")
    _add_cluster(a, inherited=True)
    a.add_argument("name")
    a.set_defaults(handler=drop)

    p = sub.add_parser("flush", help="seal a collection's growing segments and flush them")
    _add_cluster(p, inherited=False)
    p.add_argument("--collection", required=True)
    p.add_argument(
        "--wait", action="store_true", help="wait until every shard's checkpoint covers it"
    )
    p.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds to wait (default 300)"
    )
    p.set_defaults(handler=flush)

    p = sub.add_parser(
        "compact",
        help="compact a collection's small files now (the standalone's flush runner does it)",
    )
    _add_cluster(p, inherited=False)
    p.add_argument("--collection", required=True)
    p.add_argument("--wait", action="store_true", help="wait until nothing is left to compact")
    p.add_argument(
        "--timeout", type=positive_float, default=300.0, help="seconds to wait (default 300)"
    )
    p.set_defaults(handler=compact)
    read_command.add_command(sub)


def _metastore(args: argparse.Namespace) -> str:
    if not args.metastore:
        raise errors.InvalidArgument("--metastore is required (a standalone prints its URL)")
    url: str = args.metastore
    return url


async def list_collections(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    found = await client_api.list_collections(
        _metastore(args), args.cluster, include_dropped=args.include_dropped
    )
    if args.json:
        print(json.dumps(found))
        return 0
    if not found:
        print(f"no collections in cluster {args.cluster}")
        return 0
    rows = [{**c, "state": _state(c), "fields": len(c["fields"])} for c in found]
    columns = ["name", "collection_id", "shards", "primary_key", "fields", "state"]
    widths = {c: max([len(c)] + [len(str(r[c])) for r in rows]) for c in columns}
    print("  ".join(c.upper().ljust(widths[c]) for c in columns))
    for r in rows:
        print("  ".join(str(r[c]).ljust(widths[c]) for c in columns))
    return 0


async def describe(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    _print_collection(
        await client_api.describe_collection(_metastore(args), args.name, args.cluster), args.json
    )
    return 0


async def create(args: argparse.Namespace) -> int:
    from headrace.cli.schemas import parse_schema  # noqa: PLC0415 - when the command runs
    from headrace.client import api as client_api  # noqa: PLC0415

    spec = CollectionSpec(
        args.name, parse_schema(args.schema, args.primary_key), args.primary_key, args.shards
    )
    _print_collection(
        await client_api.create_collection(_metastore(args), spec, args.cluster), args.json
    )
    return 0


async def drop(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    _print_collection(
        await client_api.drop_collection(_metastore(args), args.name, args.cluster), args.json
    )
    return 0


async def flush(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.flush_collection(
        _metastore(args), args.collection, args.cluster, wait=args.wait, timeout=args.timeout
    )
    if args.json:
        print(json.dumps(outcome))
        return 0
    done = "flushed" if outcome["waited"] else "flush requested"
    print(f"{done}: {outcome['collection']}")
    for pchannel, state in outcome["pchannels"].items():
        at = f" checkpoint={state['checkpoint']}" if state["checkpoint"] else ""
        print(f"  {pchannel} requested={state['requested']}{at}")
    return 0


async def compact(args: argparse.Namespace) -> int:
    from headrace.client import api as client_api  # noqa: PLC0415 - when the command runs

    outcome = await client_api.compact_collection(
        _metastore(args), args.collection, args.cluster, wait=args.wait, timeout=args.timeout
    )
    if args.json:
        print(json.dumps(outcome))
        return 0
    done = "compacted" if outcome["waited"] else "compaction requested"
    message = f" ({outcome['message']})" if outcome["message"] else ""
    print(f"{done}: {outcome['collection']} request={outcome['request_id']}{message}")
    return 0


def _state(described: dict[str, Any]) -> str:
    return "dropped" if described["dropped"] else "active"


def _print_collection(described: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(described))
        return
    print(
        f"{described['name']}  id={described['collection_id']}  shards={described['shards']}  "
        f"primary_key={described['primary_key']}  state={_state(described)}"
    )
    print(f"  vchannels: {', '.join(described['vchannels'])}")
    if "table" in described:
        print(f"  table: {described['table'] or '(not flushed yet)'}")
    for field in described["fields"]:
        null = "" if field["nullable"] else " not null"
        print(f"  {field['name']}: {field['type']}{null}")

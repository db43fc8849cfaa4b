"""``headrace read``: a collection as of a timetick, as a text table, JSON or Parquet.

The rows are :meth:`HeadraceClient.read`'s: the committed Iceberg table at
the snapshot for ``--as-of`` plus the WAL's growing rows after it, deletes
applied, each primary key once. Needs the ``pipeline`` extra (pyiceberg) once
the collection has been flushed. The client and pyarrow are imported when
the command runs: every ``headrace`` process (a node's too) builds the parser.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from headrace import errors
from headrace.cli.argtypes import non_negative_int
from headrace.table.storage import ObjectStoreOptions

if TYPE_CHECKING:
    import pyarrow as pa

Sub: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

FORMATS = ("table", "json", "parquet")


def add_command(sub: Sub) -> None:
    p = sub.add_parser(
        "read", help="read a collection as of a timetick: its table plus the WAL's growing rows"
    )
    p.add_argument(
        "--metastore",
        default=None,
        help="metastore URL: sqlite:///path/to/meta.db or etcd://host:port[,host:port]",
    )
    p.add_argument("--cluster", default="default", help="cluster (default: default)")
    p.add_argument("--collection", required=True)
    p.add_argument(
        "--as-of",
        type=non_negative_int,
        default=None,
        help="a timetick (default: latest, everything acknowledged before the read)",
    )
    p.add_argument("--columns", default=None, help="comma-separated field names (default: all)")
    p.add_argument(
        "--filter",
        default=None,
        help="an Iceberg row filter, e.g. \"pk > 10 and name = 'x'\" (default: every row)",
    )
    p.add_argument("--format", choices=FORMATS, default="table", help="output (default: table)")
    p.add_argument("--output", default=None, help="write to this file (required for parquet)")
    p.add_argument(
        "--s3-endpoint",
        default="",
        help="object store endpoint of an s3:// warehouse (keys from AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY)",
    )
    p.set_defaults(handler=read)


def _columns(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [c.strip() for c in text.split(",")]
    if not all(names):
        raise errors.InvalidArgument(f"--columns {text!r}: an empty field name")
    return names


async def read(args: argparse.Namespace) -> int:
    import pyarrow.parquet as pq  # noqa: PLC0415 - when the command runs

    from headrace.client import ReadOptions  # noqa: PLC0415
    from headrace.client import api as client_api  # noqa: PLC0415

    if not args.metastore:
        raise errors.InvalidArgument("--metastore is required (a standalone prints its URL)")
    if args.format == "parquet" and not args.output:
        raise errors.InvalidArgument("--format parquet needs --output FILE")
    options = ReadOptions(object_store=ObjectStoreOptions.from_env(args.s3_endpoint))
    described, rows = await client_api.read_collection(
        args.metastore,
        args.collection,
        args.cluster,
        as_of="latest" if args.as_of is None else args.as_of,
        columns=_columns(args.columns),
        filter=args.filter,
        options=options,
    )
    if args.format == "parquet":
        await _write(args.output, lambda: pq.write_table(rows, args.output))
        print(f"{rows.num_rows} rows as of {described['as_of']} written to {args.output}")
        return 0
    text = _json(described, rows) if args.format == "json" else _text(described, rows)
    if args.output:
        await _write(args.output, lambda: Path(args.output).write_text(text))
        print(f"{rows.num_rows} rows as of {described['as_of']} written to {args.output}")
    else:
        sys.stdout.write(text)
    return 0


async def _write(path: str, write: Callable[[], object]) -> None:
    try:
        await asyncio.to_thread(write)
    except OSError as exc:
        raise errors.InvalidArgument(f"--output {path}: {exc.strerror or exc}") from None


def _json(described: dict[str, Any], rows: pa.Table) -> str:
    return json.dumps({**described, "rows": rows.to_pylist()}, default=str) + "\n"


def _text(described: dict[str, Any], rows: pa.Table) -> str:
    names = rows.schema.names
    cells = [[_cell(v) for v in row.values()] for row in rows.to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in cells)]) for i, n in enumerate(names)]
    lines = ["  ".join(n.upper().ljust(w) for n, w in zip(names, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    snapshot = described["snapshot_id"] if described["snapshot_id"] is not None else "none"
    lines.append(f"({rows.num_rows} rows as of {described['as_of']}, snapshot {snapshot})")
    return "\n".join(lines) + "\n"


def _cell(value: object) -> str:
    return "null" if value is None else str(value)

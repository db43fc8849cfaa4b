"""``headrace collections`` and ``headrace flush`` against in-process nodes, and
the schema JSON they take."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from headrace import errors
from headrace.cli.exits import EXIT_ERROR, EXIT_USAGE
from headrace.cli.main import main
from headrace.cli.schemas import parse_schema, parse_type
from headrace.client import HeadraceClient
from headrace.cluster import NEW_CLUSTER_ROUTING, route
from headrace.message.types import MessageType
from headrace.table import messages
from tests.node.harness import Cluster, make_cluster

PCHANNELS = ["pchannel-000", "pchannel-001"]
SCHEMA_JSON = '{"pk": "int64", "vector": "fixed_size_list<float32, 4>", "name": "string"}'


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for cluster in make_cluster(tmp_path):
        await cluster.configure(PCHANNELS)
        await cluster.start_node("node-a")
        for pchannel in PCHANNELS:
            await cluster.assign(pchannel, "node-a", 1)
        yield cluster


async def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = await asyncio.to_thread(main, list(argv))
    out, err = capsys.readouterr()
    return code, out, err


async def test_create_list_describe_flush_drop(
    served: Cluster, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    url = served.url
    where = ["--metastore", url, "--cluster", "test"]
    code, out, err = await run(capsys, "collections", *where)
    assert (code, out.strip()) == (0, "no collections in cluster test"), err

    create = ["collections", "create", "orders", "--schema", SCHEMA_JSON, "--shards", "4"]
    code, out, err = await run(capsys, *create, *where, "--json")
    assert code == 0, err
    created: dict[str, Any] = json.loads(out)
    assert created["shards"] == 4 and created["primary_key"] == "pk"
    assert created["fields"][0] == {"name": "pk", "type": "int64", "nullable": False}
    # Idempotent; the schema may come from a file; the flags may come first.
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(SCHEMA_JSON)
    code, out, err = await run(
        capsys,
        "collections",
        *where,
        "create",
        "orders",
        "--schema",
        str(schema_file),
        "--shards",
        "4",
    )
    assert code == 0, err
    assert out.startswith(f"orders  id={created['collection_id']}  shards=4  primary_key=pk")
    assert "vector: fixed_size_list<item: float>[4]" in out

    code, out, err = await run(capsys, "collections", "list", *where)
    assert code == 0, err
    header, row = out.strip().splitlines()
    assert header.split() == ["NAME", "COLLECTION_ID", "SHARDS", "PRIMARY_KEY", "FIELDS", "STATE"]
    assert row.split() == ["orders", str(created["collection_id"]), "4", "pk", "3", "active"]

    code, out, err = await run(capsys, "collections", "describe", "orders", *where, "--json")
    # describe adds the table's metadata file: none before the first flush.
    assert (code, json.loads(out)) == (0, {**created, "table": None})
    code, out, err = await run(capsys, "collections", "describe", "orders", *where)
    assert "  table: (not flushed yet)" in out

    code, out, err = await run(capsys, "flush", "--collection", "orders", *where, "--json")
    assert code == 0, err
    flushed = json.loads(out)
    routes = {route(v, PCHANNELS, NEW_CLUSTER_ROUTING) for v in created["vchannels"]}
    assert flushed["waited"] is False and set(flushed["pchannels"]) == routes
    async with HeadraceClient(url, "test") as client:
        for vchannel in created["vchannels"]:
            async with client.consume(vchannel, types=[MessageType.FLUSH]) as consumer:
                entry = await consumer.next(5.0)
            # The node replaced each flush request by a seal.
            assert entry is not None and messages.SEGMENT in entry.message.properties

    # No flush runner here: --wait runs out of time, exit 1, naming the pchannels.
    code, out, err = await run(
        capsys, "flush", "--collection", "orders", "--wait", "--timeout", "0.3", *where
    )
    assert code == EXIT_ERROR
    assert "flush of orders not committed within 0.3s" in err
    assert all(f"{p} checkpoint no checkpoint yet" in err for p in routes)

    code, out, err = await run(capsys, "collections", "drop", "orders", *where)
    assert code == 0 and "state=dropped" in out, err
    code, out, err = await run(capsys, "collections", *where)
    assert out.strip() == "no collections in cluster test"
    code, out, err = await run(capsys, "collections", "list", "--all", *where)
    assert out.strip().splitlines()[1].split()[-1] == "dropped"


async def test_bad_requests_exit_2_naming_what_is_wrong(
    served: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--metastore", served.url, "--cluster", "test"]
    cases = [
        (["collections", "describe", "nope", *where], "no collection 'nope'"),
        (["collections", "create", "x", "--schema", '{"pk": "int65"}', *where], "int65"),
        (["collections", "create", "x", "--schema", "/no/such/file", *where], "neither JSON"),
        (["collections", "create", "x", "--schema", '{"id": "int64"}', *where], "primary key"),
        (["collections", "describe", "x"], "--metastore is required"),
        (["flush", "--collection", "nope", *where], "no collection 'nope'"),
        (["collections", "--metastore", served.url, "--cluster", "other"], "no cluster"),
    ]
    for argv, expected in cases:
        code, _, err = await run(capsys, *argv)
        assert code == EXIT_USAGE, (argv, err)
        assert expected in err, (argv, err)


def test_schema_json_forms_and_types() -> None:
    listed = parse_schema(
        '[{"name": "id", "type": "string"}, {"name": "v", "type": "list<item: double>",'
        ' "nullable": false}, {"name": "t", "type": "timestamp[us]"}]',
        primary_key="id",
    )
    assert listed == pa.schema(
        [
            pa.field("id", pa.string(), nullable=False),
            pa.field("v", pa.list_(pa.float64()), nullable=False),
            pa.field("t", pa.timestamp("us")),
        ]
    )
    for arrow in (pa.list_(pa.float32(), 128), pa.list_(pa.list_(pa.int32())), pa.date32()):
        assert parse_type(str(arrow)) == arrow
    with pytest.raises(errors.InvalidArgument, match="not valid JSON"):
        parse_schema("{pk: int64}", "pk")
    with pytest.raises(errors.InvalidArgument, match="JSON object of field name to type"):
        parse_schema("[1, 2]", "pk")
    with pytest.raises(errors.InvalidArgument, match="nullable must be true or false"):
        parse_schema('[{"name": "pk", "type": "int64", "nullable": "no"}]', "pk")

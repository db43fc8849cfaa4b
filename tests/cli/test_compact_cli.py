"""``headrace compact`` against in-process nodes: the request it records, its
wait running out of time with no runner, and a collection that does not exist."""

from __future__ import annotations

import json

import pytest

from headrace.cluster import Keys
from headrace.table.records import CompactionRequest, CompactionState, compaction_request_key
from tests.cli.test_collections_cli import SCHEMA_JSON, run, served
from tests.node.harness import Cluster

__all__ = ["served"]


async def test_compact_records_a_request_and_waits_for_it(
    served: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--metastore", served.url, "--cluster", "test"]
    create = ["collections", "create", "orders", "--schema", SCHEMA_JSON, "--shards", "2"]
    code, _, err = await run(capsys, *create, *where)
    assert code == 0, err
    code, out, err = await run(capsys, "compact", "--collection", "orders", *where, "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["state"] == "PENDING" and answer["waited"] is False
    kv = await served.metastore.get(compaction_request_key(Keys("test"), "orders"))
    assert kv is not None
    recorded = CompactionRequest.from_json(kv.value)
    assert (recorded.request_id, recorded.state) == (answer["request_id"], CompactionState.PENDING)
    # No flush runner serves this cluster: --wait runs out of time, exit 1.
    code, _, err = await run(
        capsys, "compact", "--collection", "orders", "--wait", "--timeout", "0.3", *where
    )
    assert code == 1
    assert "the compaction of orders was not done within 0.3s" in err
    code, _, err = await run(capsys, "compact", "--collection", "nope", *where)
    assert code == 2
    assert "no collection 'nope'" in err

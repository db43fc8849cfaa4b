"""The format records on every metastore (SQLite, etcd, etcd with TLS and
authentication): node records with and without advertised formats, the
cluster's format and its switch, and a node's formats-written record."""

from __future__ import annotations

import uuid

import pytest

from headrace import errors
from headrace.cluster import ClusterFormat, Keys, LogFormats, NodeInfo
from headrace.coordinator.formats import (
    read_cluster_format,
    read_log_formats,
    registered_formats,
    set_cluster_format,
)
from headrace.message.formats import FormatSupport
from headrace.metastore.contract import Metastore
from headrace.node.formats import WriteFormats

OLD = FormatSupport.of({1}, {1})
NEW = FormatSupport.of({1, 2}, {1, 2})


@pytest.fixture
def keys() -> Keys:
    return Keys(f"fmt-{uuid.uuid4().hex[:10]}")


async def register(store: Metastore, keys: Keys, node: str, support: FormatSupport) -> None:
    info = NodeInfo(
        node_id=node,
        address=f"{node}:1",
        reads=tuple(sorted(support.reads)),
        writes=tuple(sorted(support.writes)),
    )
    await store.put(keys.node(node), info.to_json())


async def test_node_records_old_and_new(store: Metastore, keys: Keys) -> None:
    # A record written by a release before formats were advertised.
    await store.put(keys.node("old"), b'{"node_id":"old","address":"old:1","version":"0.1.0"}')
    await register(store, keys, "new", NEW)
    assert await registered_formats(store, keys) == {"old": OLD, "new": NEW}


async def test_cluster_format_switch(store: Metastore, keys: Keys) -> None:
    assert await read_cluster_format(store, keys) == ClusterFormat(version=1)
    with pytest.raises(errors.InvalidArgument, match="no node is registered"):
        await set_cluster_format(store, keys, 2, reason="test")
    await register(store, keys, "a", NEW)
    await register(store, keys, "b", OLD)
    with pytest.raises(
        errors.InvalidArgument,
        match=r"cannot switch cluster .* to message format 2: not every registered node can "
        r"read and write format 2: b \(reads \{1\}, writes \{1\}\)",
    ):
        await set_cluster_format(store, keys, 2, reason="test")
    assert (await read_cluster_format(store, keys)).version == 1
    await register(store, keys, "b", NEW)
    switch = await set_cluster_format(store, keys, 2, reason="test")
    assert (switch.previous, switch.version, switch.changed) == (1, 2, True)
    stored = await read_cluster_format(store, keys)
    assert (stored.version, stored.previous, stored.reason) == (2, 1, "test")
    again = await set_cluster_format(store, keys, 2, reason="again")
    assert not again.changed
    assert (await read_cluster_format(store, keys)).reason == "test"
    with pytest.raises(errors.InvalidArgument, match="formats only move forward"):
        await set_cluster_format(store, keys, 1, reason="back")


async def test_write_formats_records_a_new_format_before_writing(
    store: Metastore, keys: Keys
) -> None:
    gate = WriteFormats(store, keys, NEW)
    assert await gate.prepare("a", "p0") == 1
    assert await read_log_formats(store, keys) == {}, "format 1 needs no record"
    await register(store, keys, "a", NEW)
    await set_cluster_format(store, keys, 2, reason="test")
    assert await gate.prepare("a", "p0") == 2
    assert await read_log_formats(store, keys) == {"p0": LogFormats(written=(1, 2))}
    kv = await store.get(keys.log_format("p0"))
    assert kv is not None
    assert await gate.prepare("a", "p0") == 2
    unchanged = await store.get(keys.log_format("p0"))
    assert unchanged is not None and unchanged.mod_revision == kv.mod_revision
    old = WriteFormats(store, keys, OLD)
    with pytest.raises(errors.InvalidArgument, match="cannot write"):
        await old.prepare("b", "p1")
    assert "p1" not in await read_log_formats(store, keys)

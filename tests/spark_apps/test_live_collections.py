"""The flush job leaves dropped collections alone (fast: no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from headrace.cluster import Keys
from headrace.metastore.factory import open_metastore
from headrace.table.collections import CollectionSpec, CollectionStore
from headrace.table.records import collection_key
from spark_apps.flush import live_collections

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False)])


async def test_a_collection_marked_dropped_is_not_flushed(tmp_path: Path) -> None:
    metastore = await open_metastore(f"sqlite://{tmp_path}/meta.db")
    keys = Keys("default")
    try:
        store = CollectionStore(metastore, keys)
        for name in ("kept", "gone", "undropped"):
            await store.create(CollectionSpec(name, SCHEMA, "pk"))
        for name, dropped in (("gone", True), ("undropped", False)):
            kv = await metastore.get(collection_key(keys, name))
            assert kv is not None
            record = {**json.loads(kv.value), "dropped": dropped}
            await metastore.put(collection_key(keys, name), json.dumps(record).encode())
        names = sorted(c.name for c in await live_collections(metastore, keys))
    finally:
        await metastore.close()
    # A record without the field (older writers) and one with dropped=false are flushed.
    assert names == ["kept", "undropped"]

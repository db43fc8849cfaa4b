"""Collections as Apache Iceberg tables whose catalog lives in Headrace's metastore.

The flush pipeline (issue #12) writes Parquet files into a warehouse (a local
directory or S3) and commits them with :meth:`TableCatalog.commit_flush`: one
metastore transaction that checks the pchannel's owner term and the table
pointers, then writes segment meta, the new metadata pointers and the channel
checkpoint, in that order. Any Iceberg reader (DuckDB, Spark, Trino) reads the
committed tables from their metadata files with no Headrace code. See
``docs/pipeline.md``.

The names below are loaded on first use: the client imports
``headrace.table.collections``, ``payloads``, ``messages`` and ``records``,
which need pyarrow and pydantic only, so importing this package must not pull
in pyiceberg (the ``pipeline`` extra) through the catalog.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from headrace.table.catalog import (
        CatalogConfig,
        FlushResult,
        Outcome,
        TableCatalog,
        TableInfo,
    )
    from headrace.table.records import (
        Checkpoint,
        CheckpointRecord,
        FlushCommit,
        SealRecord,
        SegmentRecord,
        TableChanges,
        TableRecord,
        WalRange,
    )
    from headrace.table.storage import ObjectStoreOptions, Warehouse

_EXPORTS = {
    "CatalogConfig": "catalog",
    "FlushResult": "catalog",
    "Outcome": "catalog",
    "TableCatalog": "catalog",
    "TableInfo": "catalog",
    "Checkpoint": "records",
    "CheckpointRecord": "records",
    "FlushCommit": "records",
    "SealRecord": "records",
    "SegmentRecord": "records",
    "TableChanges": "records",
    "TableRecord": "records",
    "WalRange": "records",
    "ObjectStoreOptions": "storage",
    "Warehouse": "storage",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CatalogConfig",
    "Checkpoint",
    "CheckpointRecord",
    "FlushCommit",
    "FlushResult",
    "ObjectStoreOptions",
    "Outcome",
    "SealRecord",
    "SegmentRecord",
    "TableCatalog",
    "TableChanges",
    "TableInfo",
    "TableRecord",
    "WalRange",
    "Warehouse",
]

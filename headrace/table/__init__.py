"""Collections as Apache Iceberg tables whose catalog lives in Headrace's metastore.

The flush pipeline (issue #12) writes Parquet files into a warehouse (a local
directory or S3) and commits them with :meth:`TableCatalog.commit_flush`: one
metastore transaction that checks the pchannel's owner term and the table
pointers, then writes segment meta, the new metadata pointers and the channel
checkpoint, in that order. Any Iceberg reader (DuckDB, Spark, Trino) reads the
committed tables from their metadata files with no Headrace code. See
``docs/pipeline.md``.
"""

from headrace.table.catalog import CatalogConfig, FlushResult, Outcome, TableCatalog, TableInfo
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

"""A flush job that dies: run as ``python -m tests.table.flush_child CONFIG_JSON POINT``.

It writes the data file of the flush of (beginning, local:10] with rows 1..4
and then SIGKILLs itself at ``POINT``: ``after-files`` (before committing),
``before-txn`` (the tables' new metadata files are written, the metastore
transaction is not sent) or ``after-commit`` (the commit went through, nobody
heard of it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
from typing import Any

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace.table import (
    CatalogConfig,
    Checkpoint,
    FlushCommit,
    ObjectStoreOptions,
    TableCatalog,
    TableChanges,
    WalRange,
)
from tests.table.data import rows

PCHANNEL = "pchannel-000"
TERM = 3
PKS = [1, 2, 3, 4]


def the_flush(catalog: TableCatalog, name: str = "flush-pchannel-000-t3-s1") -> FlushCommit:
    path = catalog.write_data_file("orders", rows(PKS), name)
    return FlushCommit(
        PCHANNEL,
        TERM,
        WalRange("", "local:10"),
        Checkpoint("local:10", 100),
        (TableChanges("orders", (path,)),),
    )


def config_to_json(config: CatalogConfig) -> str:
    return json.dumps(
        {
            "metastore_url": config.metastore_url,
            "warehouse": config.warehouse,
            "cluster": config.cluster,
            "object_store": dataclasses.asdict(config.object_store),
        }
    )


def config_from_json(text: str) -> CatalogConfig:
    data = json.loads(text)
    return CatalogConfig(
        data["metastore_url"],
        data["warehouse"],
        cluster=data["cluster"],
        object_store=ObjectStoreOptions(**data["object_store"]),
    )


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def die_before_the_commit_txn(catalog: TableCatalog) -> None:
    store = catalog._store
    real_txn = store.txn

    def txn(*args: Any, **kwargs: Any) -> Any:
        if args[0]:  # the commit's transaction (it has compares)
            die()
        return real_txn(*args, **kwargs)

    store.txn = txn  # type: ignore[method-assign]


def main() -> None:
    config, point = config_from_json(sys.argv[1]), sys.argv[2]
    catalog = TableCatalog.open(config)
    commit = the_flush(catalog)
    if point == "before-txn":
        die_before_the_commit_txn(catalog)
    if point in ("before-txn", "after-commit"):
        catalog.commit_flush(commit)
    die()


if __name__ == "__main__":
    main()

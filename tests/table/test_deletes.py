"""Why deletes rewrite data files (copy-on-write): the evidence, as tests.

pyiceberg 0.12 cannot write Iceberg delete files: asked for merge-on-read it
warns and falls back to rewriting, and its snapshot producers put every added
file in a DATA manifest. If an upgrade changes that, these tests fail and
docs/pipeline.md's choice is to be revisited.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyiceberg.expressions import EqualTo
from pyiceberg.manifest import ManifestContent

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace.table import CatalogConfig, Checkpoint, FlushCommit, TableChanges, WalRange

from .conftest import Bed
from .data import SCHEMA, expected, rows


def test_pyiceberg_falls_back_to_rewriting_when_asked_for_delete_files(tmp_path: Path) -> None:
    bed = Bed(CatalogConfig(f"sqlite:///{tmp_path / 'meta.db'}", str(tmp_path / "wh")), None)
    bed.assign("pchannel-000", term=1)
    with bed.open() as catalog:
        catalog.create_table("orders", SCHEMA, "pk")
        path = catalog.write_data_file("orders", rows([1, 2, 3]), "f1")
        catalog.commit_flush(
            FlushCommit(
                "pchannel-000",
                1,
                WalRange("", "local:3"),
                Checkpoint("local:3"),
                (TableChanges("orders", (path,)),),
            )
        )
        table = catalog.iceberg_table("orders")
        with table.transaction() as txn:  # a direct commit through the catalog
            txn.set_properties({"write.delete.mode": "merge-on-read"})
        table = catalog.iceberg_table("orders")
        assert table.properties["write.delete.mode"] == "merge-on-read"
        with pytest.warns(UserWarning, match="Merge on read is not yet supported"):
            table.delete(EqualTo("pk", 2))
        table = catalog.iceberg_table("orders")
        snapshot = table.current_snapshot()
        assert snapshot is not None
        assert {m.content for m in snapshot.manifests(table.io)} == {ManifestContent.DATA}
        location = table.metadata_location
    assert bed.duckdb_rows(location) == expected([1, 3])

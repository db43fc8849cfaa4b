"""A table test bed: metastore (SQLite or a real etcd) x warehouse (a local
directory or a real S3, SeaweedFS), each test in its own cluster and prefix."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import headrace.wal.local.message_id  # noqa: F401 - registers local:<lsn> positions
from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.metastore.contract import KeyValue
from headrace.metastore.factory import open_metastore
from headrace.table import CatalogConfig, ObjectStoreOptions, TableCatalog
from tests.fixtures_s3 import S3Store
from tests.table import duck
from tests.table.data import SCHEMA, expected, rows

__all__ = ["SCHEMA", "Bed", "expected", "rows"]


@dataclasses.dataclass
class Bed:
    """One cluster's metastore and warehouse, and ways to look at them."""

    config: CatalogConfig
    s3: S3Store | None

    @property
    def keys(self) -> Keys:
        return Keys(self.config.cluster)

    def open(self) -> TableCatalog:
        return TableCatalog.open(self.config)

    def assign(
        self,
        pchannel: str,
        term: int,
        node: str = "node-1",
        state: AssignmentState = AssignmentState.ASSIGNED,
    ) -> None:
        record = Assignment(pchannel=pchannel, state=state, term=term, node=node)
        self._run(self._put(self.keys.pchannel(pchannel), record.to_json()))

    def get(self, key: str) -> KeyValue | None:
        return self._run(self._get(key))

    def get_prefix(self, prefix: str) -> list[KeyValue]:
        return self._run(self._get_prefix(prefix))

    def duckdb_rows(self, metadata_location: str) -> list[tuple[Any, ...]]:
        return duck.iceberg_rows(metadata_location, self.s3)

    @staticmethod
    def _run(coro: Any) -> Any:
        return asyncio.run(coro)

    async def _put(self, key: str, value: bytes) -> None:
        async with await open_metastore(self.config.metastore_url) as store:
            await store.put(key, value)

    async def _get(self, key: str) -> KeyValue | None:
        async with await open_metastore(self.config.metastore_url) as store:
            return await store.get(key)

    async def _get_prefix(self, prefix: str) -> list[KeyValue]:
        async with await open_metastore(self.config.metastore_url) as store:
            return await store.get_prefix(prefix)


def _metastore_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "etcd":
        return str(request.getfixturevalue("etcd_url"))
    return f"sqlite:///{tmp_path / 'meta.db'}"


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def metastore_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return _metastore_url(request, tmp_path)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def bed(request: pytest.FixtureRequest, metastore_url: str, tmp_path: Path) -> Iterator[Bed]:
    cluster = f"t{uuid.uuid4().hex[:10]}"
    if request.param == "s3":
        s3: S3Store = request.getfixturevalue("s3_store")
        options = ObjectStoreOptions(
            endpoint=s3.endpoint, access_key=s3.access_key, secret_key=s3.secret_key
        )
        config = CatalogConfig(
            metastore_url, f"s3://{s3.bucket}/{cluster}", cluster=cluster, object_store=options
        )
        yield Bed(config, s3)
    else:
        yield Bed(CatalogConfig(metastore_url, str(tmp_path / "warehouse"), cluster=cluster), None)

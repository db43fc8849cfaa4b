"""Stores for the metastore suites: every contract test runs on SQLite, on a
real etcd, and on a real etcd with TLS, client certificates and authentication
on (the etcd parameters carry the ``etcd`` marker)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from headrace.metastore.contract import Metastore
from headrace.metastore.etcd_security import EtcdSecurity
from headrace.metastore.factory import open_metastore
from headrace.metastore.sqlite import SqliteMetastore

OpenStore = Callable[[], Awaitable[Metastore]]


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("etcd", marks=pytest.mark.etcd),
        pytest.param("etcd-secure", marks=pytest.mark.etcd),
    ]
)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens clients of one store (SQLite file, etcd, or etcd with TLS and
    authentication); all closed at teardown."""
    opened: list[Metastore] = []
    url = ""
    security: EtcdSecurity | None = None
    if request.param == "etcd":
        url = request.getfixturevalue("etcd_url")
    elif request.param == "etcd-secure":
        url = request.getfixturevalue("etcd_secure_server").url
        security = request.getfixturevalue("etcd_secure_settings")

    async def open_one() -> Metastore:
        if url:
            store: Metastore = await open_metastore(url, etcd_security=security)
        else:
            store = await SqliteMetastore.open(str(tmp_path / "meta.db"), reap_interval=0.05)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


@pytest.fixture
async def store(open_store: OpenStore) -> Metastore:
    return await open_store()


@pytest.fixture
def prefix() -> str:
    """A key prefix no other test uses (the etcd server is shared by the session)."""
    return f"/test/{uuid.uuid4().hex[:12]}/"

"""The SQLite store's lease reaper survives a defect: the failure is logged
and the reaper starts again, so leases still expire while nobody reads (a dead
reaper would keep a crashed node's session for every watcher, and the
coordinator would never fail its pchannels over)."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from headrace.metastore import sqlite_db
from headrace.metastore.contract import EventType
from headrace.metastore.sqlite import SqliteMetastore


async def test_a_reaper_that_fails_is_restarted_and_leases_still_expire(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = await SqliteMetastore.open(str(tmp_path / "meta.db"), reap_interval=0.05)
    try:
        lease = await store.grant_lease(0.3)
        await store.put("k", b"v", lease=lease)
        watch = await store.watch_prefix("k")
        real_expire = sqlite_db.expire_leases
        injected: list[bool] = []

        def expire_once_broken(conn: sqlite3.Connection) -> bool:
            if not injected:
                injected.append(True)
                raise ValueError("injected reaper defect")
            return real_expire(conn)

        monkeypatch.setattr(sqlite_db, "expire_leases", expire_once_broken)
        async with asyncio.timeout(20):
            async for event in watch:
                if event.kv.key == "k" and event.type is EventType.DELETE:
                    break
        await watch.close()
        assert injected == [True]
        logged = [r for r in caplog.records if "injected reaper defect" in r.getMessage()]
        assert logged and logged[0].exc_info is not None
    finally:
        await store.close()

"""Opening stores from URLs, and what only one backend can show: SQLite's
locking, damage and compaction; etcd's unreachable servers and lost streams."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from headrace import errors
from headrace.metastore.etcd_wire import channel_target, parse_endpoints
from headrace.metastore.factory import MetastoreURL, open_metastore, parse_url
from headrace.metastore.sqlite import SqliteMetastore
from headrace_testbed.etcd import start_etcd
from headrace_testbed.ports import free_port

HANG_GUARD = 15.0


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "sqlite:///var/lib/headrace/meta.db",
            MetastoreURL("sqlite", path="/var/lib/headrace/meta.db"),
        ),
        ("sqlite://data/meta.db", MetastoreURL("sqlite", path="data/meta.db")),
        ("etcd://127.0.0.1:2379", MetastoreURL("etcd", endpoints=(("127.0.0.1", 2379),))),
        ("etcd://etcd", MetastoreURL("etcd", endpoints=(("etcd", 2379),))),
        (
            "etcd://10.0.0.1:1,[::1]:23790/",
            MetastoreURL("etcd", endpoints=(("10.0.0.1", 1), ("::1", 23790))),
        ),
    ],
)
def test_parse_url(url: str, expected: MetastoreURL) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(
    "url",
    [
        "",
        "/tmp/meta.db",
        "mysql://localhost/db",
        "sqlite://",
        "sqlite:///tmp/dir/",
        "sqlite://:memory:",
        "sqlite:///tmp/meta.db?mode=ro",
        "etcd://",
        "etcd://host:0",
        "etcd://host:70000",
        "etcd://host:port",
        "etcd://a:1,,b:2",
        "etcd://host:2379/prefix",
        "etcd://user@host:2379",
        "etcd://[::1:2379",
    ],
)
async def test_bad_urls_are_invalid_argument(url: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        await open_metastore(url)


def test_channel_target_for_several_endpoints() -> None:
    assert channel_target(parse_endpoints("127.0.0.1:1")) == "127.0.0.1:1"
    assert channel_target(parse_endpoints("[::1]:5")) == "[::1]:5"
    assert channel_target(parse_endpoints("10.0.0.1:1,10.0.0.2:2")) == "ipv4:10.0.0.1:1,10.0.0.2:2"
    assert channel_target(parse_endpoints("[::1]:1,[::2]:2")) == "ipv6:[::1]:1,[::2]:2"
    with pytest.raises(errors.InvalidArgument):
        channel_target(parse_endpoints("[::1]:1,10.0.0.1:2"))


# -- SQLite -------------------------------------------------------------------------


async def test_sqlite_relative_url_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    store = await open_metastore("sqlite://state/meta.db")
    await store.put("/k", b"v")
    await store.close()
    assert (tmp_path / "state" / "meta.db").is_file()


async def test_sqlite_unusable_path_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where a directory should be")
    with pytest.raises(errors.Unavailable) as caught:
        await open_metastore(f"sqlite://{blocker}/meta.db")
    assert str(blocker) in str(caught.value)
    assert caught.value.retryable


async def test_sqlite_damaged_file_is_corrupt_data(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite database, just some bytes" * 100)
    with pytest.raises(errors.CorruptData):
        await open_metastore(f"sqlite://{path}")


async def test_sqlite_write_lock_held_too_long_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    store = await SqliteMetastore.open(str(path), busy_timeout=0.2)
    await store.put("/k", b"1")
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(errors.Unavailable) as caught:
            await store.put("/k", b"2")
        assert caught.value.retryable
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await store.put("/k", b"3")
    found = await store.get("/k")
    assert found is not None and found.value == b"3"
    await store.close()


async def test_sqlite_compaction_truncates_old_watches(tmp_path: Path) -> None:
    store = await SqliteMetastore.open(str(tmp_path / "meta.db"), event_retention=5)
    first = await store.put("/c/k", b"0")
    for i in range(1, 20):
        await store.put("/c/k", str(i).encode())
    lagging = await store.watch_prefix("/c/", start_revision=first + 1)
    await store.compact()
    with pytest.raises(errors.Truncated):
        await store.watch_prefix("/c/", start_revision=first)
    with pytest.raises(errors.Truncated):
        await anext(aiter(lagging))
    recent = await store.watch_prefix("/c/", start_revision=first + 17)
    async with asyncio.timeout(HANG_GUARD):
        events = [await anext(aiter(recent)) for _ in range(3)]
    assert [e.kv.value for e in events] == [b"17", b"18", b"19"]
    await store.close()


# -- etcd ---------------------------------------------------------------------------


async def test_unreachable_etcd_is_unavailable_promptly() -> None:
    port = free_port()
    async with asyncio.timeout(HANG_GUARD):
        with pytest.raises(errors.Unavailable) as caught:
            await open_metastore(f"etcd://127.0.0.1:{port}", connect_timeout=2.0)
    assert f"127.0.0.1:{port}" in str(caught.value)
    assert caught.value.retryable


@pytest.mark.etcd
async def test_etcd_fails_over_between_endpoints(etcd_endpoint: str) -> None:
    store = await open_metastore(f"etcd://127.0.0.1:{free_port()},{etcd_endpoint}")
    await store.put("/failover/k", b"v")
    found = await store.get("/failover/k")
    assert found is not None and found.value == b"v"
    await store.delete("/failover/", prefix=True)
    await store.close()


@pytest.mark.etcd
async def test_etcd_server_loss_surfaces_in_watches_and_calls(tmp_path: Path) -> None:
    server = await asyncio.to_thread(start_etcd, tmp_path / "etcd")
    try:
        store = await open_metastore(server.url)
        watch = await store.watch_prefix("/loss/")
        events = aiter(watch)
        await store.put("/loss/a", b"1")
        async with asyncio.timeout(HANG_GUARD):
            assert (await anext(events)).kv.value == b"1"
        await asyncio.to_thread(server.kill)
        async with asyncio.timeout(HANG_GUARD):
            with pytest.raises(errors.Unavailable) as caught:
                await anext(events)
        assert caught.value.retryable
        with pytest.raises(errors.Unavailable) as call_error:
            await store.get("/loss/a")
        assert server.endpoint in str(call_error.value)
        await store.close()
    finally:
        await asyncio.to_thread(server.stop)

"""One SQLite metastore file shared by several real processes."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

from headrace.metastore.contract import EventType
from headrace.metastore.sqlite import SqliteMetastore

HANG_GUARD = 60.0

_CHILD = """
import asyncio, sys
from headrace.metastore.contract import Compare, Put
from headrace.metastore.sqlite import SqliteMetastore

async def increment(store, key, times):
    done = 0
    while done < times:
        kv = await store.get(key)
        value, revision = (int(kv.value), kv.mod_revision) if kv else (0, 0)
        result = await store.txn(
            [Compare.mod_revision_is(key, revision)], [Put(key, str(value + 1).encode())]
        )
        done += result.succeeded

async def main(command, path, key, arg):
    store = await SqliteMetastore.open(path)
    if command == "increment":
        print("ready", flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        await increment(store, key, int(arg))
    elif command == "write":
        for i in range(int(arg)):
            await store.put(f"{key}{i}", str(i).encode())
    elif command == "hold-lease":
        lease = await store.grant_lease(float(arg))
        await store.put(key, b"held", lease=lease)
        print("ready", flush=True)
        await asyncio.sleep(3600)
    await store.close()

asyncio.run(main(*sys.argv[1:]))
"""


async def run_child(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _CHILD,
        *args,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )


async def test_concurrent_compare_and_swap_loses_no_update(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.db")
    store = await SqliteMetastore.open(path)
    children = [await run_child("increment", path, "/counter", "100") for _ in range(2)]
    async with asyncio.timeout(HANG_GUARD):
        for child in children:
            assert child.stdout is not None
            assert (await child.stdout.readline()).strip() == b"ready"
        for child in children:
            assert child.stdin is not None
            child.stdin.write(b"go\n")
            await child.stdin.drain()
        codes = [await child.wait() for child in children]
    assert codes == [0, 0]
    counter = await store.get("/counter")
    assert counter is not None
    assert (counter.value, counter.version) == (b"200", 200)
    await store.close()


async def test_watch_sees_the_writes_of_another_process(tmp_path: Path) -> None:
    path = str(tmp_path / "meta.db")
    store = await SqliteMetastore.open(path)
    watch = await store.watch_prefix("/from-child/")
    child = await run_child("write", path, "/from-child/", "5")
    async with asyncio.timeout(HANG_GUARD):
        events = [await anext(watch) for _ in range(5)]
        assert await child.wait() == 0
    assert [(e.kv.key, e.kv.value) for e in events] == [
        (f"/from-child/{i}", str(i).encode()) for i in range(5)
    ]
    await watch.close()
    await store.close()


async def test_lease_of_a_killed_process_expires(tmp_path: Path) -> None:
    """The dead process cannot expire its lease: the survivor's instance does."""
    path = str(tmp_path / "meta.db")
    store = await SqliteMetastore.open(path, reap_interval=0.05)
    watch = await store.watch_prefix("/owned")
    child = await run_child("hold-lease", path, "/owned", "1.0")
    assert child.stdout is not None
    async with asyncio.timeout(HANG_GUARD):
        assert (await child.stdout.readline()).strip() == b"ready"
        child.send_signal(signal.SIGKILL)
        await child.wait()
        put, deleted = await anext(watch), await anext(watch)
    assert (put.type, put.kv.value) == (EventType.PUT, b"held")
    assert (deleted.type, deleted.kv.key) == (EventType.DELETE, "/owned")
    assert await store.get("/owned") is None
    await watch.close()
    await store.close()

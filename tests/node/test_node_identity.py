"""One node id, one live process (issue #11, item 1).

Two processes of one node id follow the same assignment records and open the
same WALs under the same terms. A node starting with the id of a live session
is refused (status 2, naming the holder), on SQLite and on etcd; one whose
predecessor crashed registers once the predecessor's lease expired; and a
paused process that lost its session to a newer process of its id stops
instead of taking the id back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import signal
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.cluster import Keys, NodeInfo
from headrace.metastore.contract import KeyValue, Metastore
from headrace.metastore.factory import open_metastore
from tests.node.harness import HANG_GUARD

pytestmark = pytest.mark.timeout(180)

NODE = "node-dup"
TTL = "1"


async def start_node(url: str, cluster: str, wal_dir: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "headrace.cli",
        "node",
        "--node-id",
        NODE,
        "--metastore",
        url,
        "--cluster",
        cluster,
        "--wal",
        "local",
        "--wal-dir",
        str(wal_dir),
        "--lease-ttl",
        TTL,
        stderr=asyncio.subprocess.PIPE,
    )


async def registered(
    store: Metastore, key: str, process: asyncio.subprocess.Process, *, not_lease: int = 0
) -> KeyValue:
    """The node key once a session other than ``not_lease`` holds it."""
    async with asyncio.timeout(HANG_GUARD):
        while True:
            assert process.returncode is None, "the node process ended while registering"
            current = await store.get(key)
            if current is not None and current.lease != not_lease:
                return current
            await asyncio.sleep(0.05)


async def ended(process: asyncio.subprocess.Process) -> tuple[int, str]:
    assert process.stderr is not None
    async with asyncio.timeout(HANG_GUARD):
        stderr = await process.stderr.read()
        return await process.wait(), stderr.decode()


async def stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()


@dataclasses.dataclass
class NodeRun:
    """The node processes one test starts for :data:`NODE` in a fresh cluster."""

    url: str
    cluster: str
    key: str
    store: Metastore
    processes: list[asyncio.subprocess.Process] = dataclasses.field(default_factory=list)

    async def start(self, wal_dir: Path) -> asyncio.subprocess.Process:
        process = await start_node(self.url, self.cluster, wal_dir)
        self.processes.append(process)
        return process


@contextlib.asynccontextmanager
async def node_run(url: str) -> AsyncIterator[NodeRun]:
    """A :class:`NodeRun` whose processes are killed (resumed first, if paused) at the end."""
    cluster = f"dup-{uuid.uuid4().hex[:8]}"
    run = NodeRun(url, cluster, Keys(cluster).node(NODE), await open_metastore(url))
    try:
        yield run
    finally:
        for process in run.processes:
            if process.returncode is None:
                process.send_signal(signal.SIGCONT)
            await stop(process)
        await run.store.close()


@pytest.fixture(params=["sqlite", pytest.param("etcd", marks=pytest.mark.etcd)])
def metastore_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "etcd":
        return str(request.getfixturevalue("etcd_url"))
    return f"sqlite:///{tmp_path / 'meta.db'}"


async def test_second_process_with_a_live_node_id_is_refused(
    metastore_url: str, tmp_path: Path
) -> None:
    async with node_run(metastore_url) as run:
        first = await run.start(tmp_path / "wal-1")
        held = await registered(run.store, run.key, first)
        address = NodeInfo.from_json(held.value).address

        second = await run.start(tmp_path / "wal-2")
        code, stderr = await ended(second)
        assert code == 2, stderr
        assert f"node id '{NODE}' is held by the node at {address}" in stderr
        assert "Traceback" not in stderr
        current = await run.store.get(run.key)
        assert current is not None and current.lease == held.lease
        assert first.returncode is None

        # A crash (no revoke): the next process takes the id once the lease expired.
        first.send_signal(signal.SIGKILL)
        await first.wait()
        third = await run.start(tmp_path / "wal-3")
        await registered(run.store, run.key, third, not_lease=held.lease)
        third.send_signal(signal.SIGTERM)
        code, stderr = await ended(third)
        assert code == 0, stderr


@pytest.mark.etcd
async def test_paused_node_that_lost_its_id_to_a_new_process_stops(
    etcd_url: str, tmp_path: Path
) -> None:
    """SIGSTOP outlives the session; a new process of the id registers; the old
    one, resumed, finds the id taken by a live session and exits with status 2.

    (On etcd: a process paused inside a SQLite write transaction would hold
    the database lock for everyone, a hazard of the file store, not of this.)
    """
    async with node_run(etcd_url) as run:
        paused = await run.start(tmp_path / "wal-1")
        old = await registered(run.store, run.key, paused)
        paused.send_signal(signal.SIGSTOP)
        async with asyncio.timeout(HANG_GUARD):
            while True:
                if await run.store.get(run.key) is None:
                    break
                await asyncio.sleep(0.1)
        successor = await run.start(tmp_path / "wal-2")
        new = await registered(run.store, run.key, successor, not_lease=old.lease)
        paused.send_signal(signal.SIGCONT)
        code, stderr = await ended(paused)
        assert code == 2, stderr
        assert f"node id '{NODE}' is held by the node at" in stderr
        current = await run.store.get(run.key)
        assert current is not None and current.lease == new.lease
        assert successor.returncode is None

"""A long-running task of a node that fails is not lost: it is logged at once,
and what depends on it stops (the node turns NOT_SERVING and its process
exits non-zero; a session counts as lost; a WAL turns UNAVAILABLE and is
reopened). Faults are injected by patching the task's code in the test."""

from __future__ import annotations

import asyncio
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headrace.cluster import Assignment, AssignmentState, Keys
from headrace.message.types import Message, MessageType
from headrace.metastore.contract import KeyValue
from headrace.metastore.factory import open_metastore
from headrace.node.server import StreamingNode
from headrace.wal.api import WALState
from tests.node.harness import HANG_GUARD, Cluster, until

P = "pchannel-000"


def assigning(node_id: str, term: int) -> Assignment:
    return Assignment(
        pchannel=P,
        state=AssignmentState.ASSIGNING,
        term=term,
        node=node_id,
        updated_at=time.time(),
    )


async def health(node: StreamingNode) -> int:
    async with grpc.aio.insecure_channel(node.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=HANG_GUARD
        )
    return int(reply.status)


async def test_a_reactor_task_that_fails_turns_the_node_not_serving(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    node = await cluster.start_node("node-a")
    assert await health(node) == health_pb2.HealthCheckResponse.SERVING
    assert node.reactor is not None

    async def defect(pchannel: str, kv: KeyValue | None) -> None:
        raise RuntimeError("injected defect")

    node.reactor._react = defect  # type: ignore[method-assign]
    await cluster.write(assigning("node-a", 1))
    async with asyncio.timeout(HANG_GUARD):
        while True:
            if await health(node) == health_pb2.HealthCheckResponse.NOT_SERVING:
                break
            await asyncio.sleep(0.05)
    assert node.ended.is_set() and node.fatal is not None
    assert "task node-a-react-pchannel-000 failed: RuntimeError" in node.fatal.message
    logged = [r for r in caplog.records if "injected defect" in r.getMessage()]
    assert logged, "the failure was not logged"
    assert logged[0].exc_info is not None, "the failure was logged without its traceback"
    # It stays NOT_SERVING: nothing turns it back while the node lives.
    await asyncio.sleep(0.2)
    assert await health(node) == health_pb2.HealthCheckResponse.NOT_SERVING


async def test_a_keep_alive_task_that_fails_loses_the_session_and_the_node_registers_again(
    cluster: Cluster,
) -> None:
    node = await cluster.start_node("node-a", session_ttl=1.0)
    key = cluster.keys.node("node-a")
    before = await cluster.metastore.get(key)
    assert before is not None
    store = node.metastore
    real_keep_alive = store.keep_alive
    injected = []

    async def keep_alive_once_broken(lease: int) -> None:
        if not injected:
            injected.append(lease)
            raise RuntimeError("injected keep-alive defect")
        await real_keep_alive(lease)

    store.keep_alive = keep_alive_once_broken  # type: ignore[method-assign]

    def registered_anew(kv: KeyValue | None) -> bool:
        return kv is not None and kv.lease != before.lease and node.registered.is_set()

    async with asyncio.timeout(HANG_GUARD):
        while True:
            if registered_anew(await cluster.metastore.get(key)):
                break
            await asyncio.sleep(0.05)
    assert injected == [before.lease]
    assert not node.ended.is_set()
    assert await health(node) == health_pb2.HealthCheckResponse.SERVING


async def test_a_timetick_sync_that_fails_makes_the_wal_reopen(cluster: Cluster) -> None:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    manager = node.manager
    assert manager is not None
    wal = manager.get(P)
    appender: Any = wal._appender
    real_tick = appender.tick
    injected = []

    async def tick_once_broken(*, sync: bool) -> Any:
        if sync and not injected:
            injected.append(sync)
            raise RuntimeError("injected tick defect")
        return await real_tick(sync=sync)

    appender.tick = tick_once_broken
    # An idle WAL is not ticked: data makes a tick due.
    await wal.append_many([Message(MessageType.INSERT, "v", b"x")])
    await until(lambda: manager.held.get(P) not in (None, wal))
    reopened = manager.get(P)
    assert (reopened.term, reopened.state) == (1, WALState.SERVING)
    assert wal.state is not WALState.SERVING
    assert injected and not node.ended.is_set()


SCRIPT = textwrap.dedent(
    """
    import sys
    from headrace.cli.main import main
    from headrace.node import assignments

    async def defect(self, pchannel, kv):
        raise RuntimeError("injected defect")

    assignments.Reactor._react = defect  # the fault: a bug in the reactor
    sys.exit(main([
        "node", "--node-id", "proc-node", "--metastore", sys.argv[1], "--cluster", "proc",
        "--wal", "local", "--wal-dir", sys.argv[2],
    ]))
    """
)


async def test_a_node_process_whose_task_fails_exits_non_zero(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/meta.db"
    metastore = await open_metastore(url)
    keys = Keys("proc")
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        SCRIPT,
        url,
        str(tmp_path / "wal"),
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(HANG_GUARD):
            while await metastore.get(keys.node("proc-node")) is None:
                assert process.returncode is None, "the node process died while starting"
                await asyncio.sleep(0.05)
        await metastore.put(keys.pchannel(P), assigning("proc-node", 1).to_json())
        async with asyncio.timeout(HANG_GUARD):
            _, stderr = await process.communicate()
        output = stderr.decode()
        assert process.returncode == 1, output
        assert "Traceback" in output and "RuntimeError: injected defect" in output, output
        assert "node proc-node stopped: task proc-node-react-pchannel-000 failed" in output
        # It stopped cleanly: its session is revoked, so failover need not wait for the TTL.
        assert await metastore.get(keys.node("proc-node")) is None
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await metastore.close()

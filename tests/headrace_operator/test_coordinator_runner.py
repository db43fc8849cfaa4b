"""The in-operator coordinators: one leader per cluster across operator replicas."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from headrace.cluster import AssignmentState, Keys
from headrace.metastore.contract import Metastore
from headrace.metastore.sqlite import SqliteMetastore
from headrace_operator.coordinator_runner import CoordinatorRunners, RunnerConfig
from tests.headrace_operator.op_harness import SimNode

pytestmark = pytest.mark.timeout(60)

CONFIG = RunnerConfig(
    metastore_url="etcd://db:2379",
    cluster="ns.demo",
    pchannels=("pchannel-000", "pchannel-001"),
    wal_backend="local",
    lease_ttl_s=0.5,
    retry_s=0.1,
    relist_interval_s=0.1,
    balance_interval_s=0.2,
)


def sqlite_opener(path: Path) -> Callable[[str], Awaitable[Metastore]]:
    async def opener(_url: str) -> Metastore:
        return await SqliteMetastore.open(str(path), reap_interval=0.05, busy_timeout=30.0)

    return opener


async def eventually(check: Callable[[], Awaitable[bool]], what: str, limit: float = 20) -> None:
    """Poll ``check`` until it holds; fail naming ``what`` after ``limit`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    while not await check():
        assert loop.time() < deadline, f"not reached within {limit}s: {what}"
        await asyncio.sleep(0.05)


async def test_two_replicas_elect_one_coordinator_and_fail_over(tmp_path: Path) -> None:
    opener = sqlite_opener(tmp_path / "meta.db")
    store = await opener("")
    replicas = [CoordinatorRunners(f"operator-{i}", opener) for i in range(2)]
    runners = [await r.ensure("ns/demo", CONFIG) for r in replicas]
    node = SimNode(store, Keys(CONFIG.cluster), "demo-node-0")
    await node.start()
    try:

        async def one_leader() -> bool:
            return sum(r.is_leader for r in runners) == 1

        await eventually(one_leader, "exactly one leader")
        leader = next(r for r in runners if r.is_leader)
        other = next(r for r in runners if not r.is_leader)
        control = leader.control()
        assert control is not None
        assert await control.leader() == leader.coordinator_id

        async def assigned() -> bool:
            snap = await control.snapshot()
            states = [a.state for a in snap.assignments.values()]
            return states == [AssignmentState.ASSIGNED] * 2

        await eventually(assigned, "both pchannels assigned")
        await replicas[runners.index(leader)].stop("ns/demo")

        async def taken_over() -> bool:
            return other.is_leader

        await eventually(taken_over, "the standby took over")
        other_control = other.control()
        assert other_control is not None
        assert await other_control.leader() == other.coordinator_id
    finally:
        await node.stop()
        for replica in replicas:
            await replica.stop_all()
        await store.close()


async def test_control_requests_reach_the_metastore(tmp_path: Path) -> None:
    opener = sqlite_opener(tmp_path / "meta.db")
    store = await opener("")
    runners = CoordinatorRunners("operator-0", opener)
    runner = await runners.ensure("ns/demo", CONFIG)
    node = SimNode(store, Keys(CONFIG.cluster), "demo-node-0")
    await node.start()
    try:

        async def connected() -> bool:
            return runner.control() is not None and runner.is_leader

        await eventually(connected, "connected and leading")
        control = runner.control()
        assert control is not None
        await control.drain("demo-node-0")
        snap = await control.snapshot()
        assert snap.node_controls["demo-node-0"].draining
        await control.undrain("demo-node-0")
        snap = await control.snapshot()
        assert not snap.node_controls["demo-node-0"].frozen
        assert control.coordinator_error() == ""
        assert await runners.ensure("ns/demo", CONFIG) is runner, "same settings: same runner"
        changed = await runners.ensure("ns/demo", dataclasses.replace(CONFIG, lease_ttl_s=1.0))
        assert changed is not runner, "changed settings restart the coordinator"
    finally:
        await node.stop()
        await runners.stop_all()
        await store.close()


async def test_unreachable_metastore_is_reported(tmp_path: Path) -> None:
    runners = CoordinatorRunners("operator-0")
    config = dataclasses.replace(CONFIG, metastore_url="etcd://127.0.0.1:1")
    runner = await runners.ensure("ns/demo", config)
    try:

        async def failed() -> bool:
            return bool(runner.error)

        await eventually(failed, "an error is recorded", limit=30)
        assert "cannot open the metastore etcd://127.0.0.1:1" in runner.error
        assert runner.control() is None
    finally:
        await runners.stop_all()

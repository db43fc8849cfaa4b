from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace.client import HeadraceClient
from tests.node.harness import Cluster, make_cluster

PCHANNELS = ["pchannel-000", "pchannel-001"]


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


@pytest.fixture
async def served(cluster: Cluster) -> Cluster:
    """Two pchannels, both served by node-a at term 1."""
    await cluster.configure(PCHANNELS)
    await cluster.start_node("node-a")
    for pchannel in PCHANNELS:
        await cluster.assign(pchannel, "node-a", 1)
    return cluster


@pytest.fixture
async def client(cluster: Cluster) -> AsyncIterator[HeadraceClient]:
    async with HeadraceClient(cluster.url, "test") as c:
        yield c

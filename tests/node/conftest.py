from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.node.harness import Cluster, make_cluster


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c

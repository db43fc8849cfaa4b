"""A coordinator whose watch task fails stops leading with that error instead
of going on with watches that silently died (it relisted on a timer only)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.coordinator.coordinator import Coordinator
from headrace.metastore.contract import Metastore
from headrace.metastore.sqlite import SqliteMetastore
from tests.coordinator.test_coordinator import CLUSTER, KEYS, fast_config


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Metastore]:
    metastore = await SqliteMetastore.open(f"{tmp_path}/meta.db", reap_interval=0.05)
    yield metastore
    await metastore.close()


async def test_a_watch_that_fails_ends_the_leadership_with_its_error(
    store: Metastore, caplog: pytest.LogCaptureFixture
) -> None:
    coordinator = Coordinator(store, CLUSTER, fast_config())
    prefixes: list[str] = []

    async def broken_watch(prefix: str, *_: object) -> None:
        prefixes.append(prefix)
        if prefix == KEYS.pchannels:
            raise RuntimeError("injected watch defect")
        await asyncio.Event().wait()

    coordinator._watch = broken_watch  # type: ignore[method-assign, assignment]
    with pytest.raises(errors.HeadraceError, match="injected watch defect") as info:
        await asyncio.wait_for(coordinator.run(asyncio.Event()), 10)
    assert f"task watch {KEYS.pchannels} failed: RuntimeError" in info.value.message
    assert KEYS.pchannels in prefixes and not coordinator.is_leader
    logged = [r for r in caplog.records if "injected watch defect" in r.getMessage()]
    assert logged and logged[0].exc_info is not None

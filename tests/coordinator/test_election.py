"""Coordinator election on the real SQLite metastore."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.cluster import Keys
from headrace.coordinator.election import Election, NotLeader, current_leader
from headrace.metastore.contract import Compare, Metastore, Put
from headrace.metastore.sqlite import SqliteMetastore

pytestmark = pytest.mark.timeout(30)
KEYS = Keys("election")


@pytest.fixture
async def stores(tmp_path: Path) -> AsyncIterator[list[Metastore]]:
    """Two stores on one file, like two processes sharing the metastore."""
    path = str(tmp_path / "meta.db")
    opened: list[Metastore] = [
        await SqliteMetastore.open(path, reap_interval=0.05),
        await SqliteMetastore.open(path, reap_interval=0.05),
    ]
    yield opened
    for store in opened:
        await store.close()


async def test_one_winner_among_concurrent_candidates(stores: list[Metastore]) -> None:
    candidates = [Election(stores[i % 2], KEYS, f"coord-{i}", ttl=2.0) for i in range(6)]
    results = await asyncio.gather(*(c.try_acquire() for c in candidates))
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    leader = await current_leader(stores[0], KEYS)
    assert leader is not None
    assert (leader.coordinator_id, leader.term) == (winners[0].coordinator_id, 1)
    term = await stores[1].get(KEYS.coordinator_term)
    assert term is not None and term.value == b"1"
    await candidates[results.index(winners[0])].resign(winners[0])


async def test_resign_lets_the_next_one_in_with_a_higher_term(stores: list[Metastore]) -> None:
    first = Election(stores[0], KEYS, "first", ttl=2.0)
    second = Election(stores[1], KEYS, "second", ttl=2.0)
    held = await first.try_acquire()
    assert held is not None
    assert await second.try_acquire() is None
    stop = asyncio.Event()
    campaign = asyncio.create_task(second.campaign(stop))
    await asyncio.sleep(0.2)
    assert not campaign.done()
    await first.resign(held)
    taken = await asyncio.wait_for(campaign, 10)
    assert taken is not None and taken.term == held.term + 1
    await second.resign(taken)


async def test_campaign_returns_none_when_stopped(stores: list[Metastore]) -> None:
    first = Election(stores[0], KEYS, "first", ttl=2.0)
    held = await first.try_acquire()
    assert held is not None
    stop = asyncio.Event()
    campaign = asyncio.create_task(Election(stores[1], KEYS, "other", ttl=2.0).campaign(stop))
    await asyncio.sleep(0.1)
    stop.set()
    assert await asyncio.wait_for(campaign, 5) is None
    await first.resign(held)


async def test_deposed_leader_cannot_write(stores: list[Metastore]) -> None:
    old = Election(stores[0], KEYS, "old", ttl=1.0)
    held = await old.try_acquire()
    assert held is not None
    probe = f"{KEYS.root}/probe"
    ok = await held.guarded_txn([], [Put(probe, b"from old")])
    assert ok.succeeded
    # Its lease disappears (e.g. a long pause): the session notices.
    await stores[1].revoke_lease(held.lease)
    await asyncio.wait_for(held.lost.wait(), 5)
    new = await Election(stores[1], KEYS, "new", ttl=1.0).try_acquire()
    assert new is not None and new.term == held.term + 1
    with pytest.raises(NotLeader):
        await held.guarded_txn([], [Put(probe, b"stale")])
    kv = await stores[0].get(probe)
    assert kv is not None and kv.value == b"from old"
    assert issubclass(NotLeader, errors.Conflict)
    await new.session.close()


async def test_write_of_a_deposed_leader_that_has_not_noticed(stores: list[Metastore]) -> None:
    held = await Election(stores[0], KEYS, "slow", ttl=5.0).try_acquire()
    assert held is not None
    # Another actor replaces the leader key while the old lease still lives.
    await stores[1].delete(KEYS.leader)
    new = await Election(stores[1], KEYS, "fast", ttl=5.0).try_acquire()
    assert new is not None
    assert not held.lost.is_set()
    with pytest.raises(NotLeader):
        await held.guarded_txn([], [Put(f"{KEYS.root}/probe", b"stale")])
    assert held.lost.is_set(), "a failed guarded write steps the leader down"
    await held.session.close()
    await new.session.close()


async def test_failed_compare_is_not_a_deposition(stores: list[Metastore]) -> None:
    held = await Election(stores[0], KEYS, "leader", ttl=2.0).try_acquire()
    assert held is not None
    key = f"{KEYS.root}/cas"
    await stores[0].put(key, b"x")
    result = await held.guarded_txn([Compare.absent(key)], [Put(key, b"y")])
    assert not result.succeeded and not held.lost.is_set()
    await held.session.close()


async def test_malformed_term_is_reported(stores: list[Metastore]) -> None:
    await stores[0].put(KEYS.coordinator_term, b"not-a-number")
    with pytest.raises(errors.CorruptData):
        await Election(stores[0], KEYS, "x").try_acquire()
    with pytest.raises(errors.InvalidArgument):
        Election(stores[0], KEYS, "x", ttl=0)

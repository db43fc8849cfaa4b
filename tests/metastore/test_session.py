"""Sessions (kept-alive leases) and elections, on SQLite and on a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from headrace import errors
from headrace.metastore.contract import (
    Compare,
    KeyValue,
    LeaseExpired,
    Metastore,
    Op,
    TxnResult,
    Watch,
)
from headrace.metastore.session import Election, Session, start_exclusive

from .conftest import OpenStore

HANG_GUARD = 15.0


class FlakyKeepAlive(Metastore):
    """Delegates to a real store; keep-alives fail with Unavailable while ``failures`` > 0."""

    def __init__(self, inner: Metastore, failures: int) -> None:
        self.inner = inner
        self.url = inner.url
        self.failures = failures
        self.attempts = 0
        self._attempted = asyncio.Condition()

    async def wait_attempts(self, count: int) -> None:
        async with self._attempted:
            await self._attempted.wait_for(lambda: self.attempts >= count)

    async def keep_alive(self, lease: int) -> None:
        async with self._attempted:
            self.attempts += 1
            self._attempted.notify_all()
        if self.failures > 0:
            self.failures -= 1
            raise errors.Unavailable("simulated: the metastore does not answer")
        await self.inner.keep_alive(lease)

    async def get(self, key: str) -> KeyValue | None:
        return await self.inner.get(key)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        return await self.inner.get_prefix(prefix)

    async def put(self, key: str, value: bytes, *, lease: int = 0) -> int:
        return await self.inner.put(key, value, lease=lease)

    async def delete(self, key: str, *, prefix: bool = False) -> int:
        return await self.inner.delete(key, prefix=prefix)

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[Op], failure: Sequence[Op] = ()
    ) -> TxnResult:
        return await self.inner.txn(compares, success, failure)

    async def grant_lease(self, ttl: float) -> int:
        return await self.inner.grant_lease(ttl)

    async def revoke_lease(self, lease: int) -> None:
        await self.inner.revoke_lease(lease)

    async def watch_prefix(self, prefix: str, *, start_revision: int = 0) -> Watch:
        return await self.inner.watch_prefix(prefix, start_revision=start_revision)

    async def revision(self) -> int:
        return await self.inner.revision()

    async def close(self) -> None:
        await self.inner.close()


async def test_session_keeps_its_key_alive_and_close_revokes(store: Metastore, prefix: str) -> None:
    key = prefix + "node"
    session = await Session.start(store, ttl=1.0, key=key, value=b"info")
    found = await store.get(key)
    assert found is not None and found.lease == session.lease
    await asyncio.sleep(2.5)
    assert not session.lost.is_set()
    assert await store.get(key) is not None
    await session.close()
    assert await store.get(key) is None
    assert not session.lost.is_set()


async def test_session_put_binds_more_keys(store: Metastore, prefix: str) -> None:
    async with await Session.start(store, ttl=5.0) as session:
        await session.put(prefix + "a", b"1")
        await session.put(prefix + "b", b"2")
        assert [kv.lease for kv in await store.get_prefix(prefix)] == [session.lease] * 2
    assert await store.get_prefix(prefix) == []


async def test_session_is_lost_when_its_lease_is_revoked(store: Metastore, prefix: str) -> None:
    called = asyncio.Event()

    async def on_lost() -> None:
        called.set()

    session = await Session.start(store, ttl=1.0, key=prefix + "node", on_lost=on_lost)
    await store.revoke_lease(session.lease)
    async with asyncio.timeout(HANG_GUARD):
        await session.lost.wait()
        await called.wait()
    with pytest.raises(LeaseExpired):
        await session.put(prefix + "again", b"x")
    await session.close()


async def test_session_is_lost_when_the_store_stays_unreachable(
    store: Metastore, prefix: str
) -> None:
    flaky = FlakyKeepAlive(store, failures=1_000_000)
    calls: list[str] = []
    session = await Session.start(flaky, ttl=1.0, on_lost=lambda: calls.append("lost"))
    async with asyncio.timeout(HANG_GUARD):
        await session.lost.wait()
    assert calls == ["lost"]
    assert flaky.attempts >= 2
    await session.close()


async def test_session_survives_a_short_outage(store: Metastore, prefix: str) -> None:
    flaky = FlakyKeepAlive(store, failures=2)
    session = await Session.start(flaky, ttl=2.0, key=prefix + "node")
    async with asyncio.timeout(HANG_GUARD):
        await flaky.wait_attempts(4)
    assert not session.lost.is_set()
    assert await store.get(prefix + "node") is not None
    await session.close()


async def test_election_hands_over_leadership(open_store: OpenStore, prefix: str) -> None:
    key = prefix + "leader"
    first_store, second_store = await open_store(), await open_store()
    first = Election(await Session.start(first_store, ttl=5.0), key, b"first")
    second = Election(await Session.start(second_store, ttl=5.0), key, b"second")
    first_term = await first.campaign()
    assert await first.campaign() == first_term
    waiting = asyncio.create_task(second.campaign())
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert await first.is_leader()
    assert not await second.is_leader()
    assert not await second.resign()
    assert await first.resign()
    async with asyncio.timeout(HANG_GUARD):
        second_term = await waiting
    assert second_term > first_term
    holder = await first_store.get(key)
    assert holder is not None and holder.value == b"second"
    await second.session.close()
    assert await first.campaign() > second_term
    await first.session.close()


async def test_lost_session_stops_a_campaign(store: Metastore, prefix: str) -> None:
    key = prefix + "leader"
    leader = Election(await Session.start(store, ttl=5.0), key, b"leader")
    await leader.campaign()
    candidate_session = await Session.start(store, ttl=1.0)
    candidate = Election(candidate_session, key, b"candidate")
    waiting = asyncio.create_task(candidate.campaign())
    await asyncio.sleep(0.1)
    await store.revoke_lease(candidate_session.lease)
    async with asyncio.timeout(HANG_GUARD):
        with pytest.raises(LeaseExpired):
            await waiting
    await candidate_session.close()
    await leader.session.close()


async def test_exclusive_key_is_refused_while_its_holder_lives(
    open_store: OpenStore, prefix: str
) -> None:
    """A second process asking for a key a live session holds (a node id) gets
    the holder back after waiting, and the holder is not disturbed."""
    key = prefix + "node-1"
    first_store, second_store = await open_store(), await open_store()
    holder = await start_exclusive(first_store, ttl=1.0, key=key, value=b"first", wait_s=0.0)
    assert isinstance(holder, Session)
    refused = await start_exclusive(second_store, ttl=1.0, key=key, value=b"second", wait_s=2.5)
    assert isinstance(refused, KeyValue)
    assert (refused.value, refused.lease) == (b"first", holder.lease)
    current = await second_store.get(key)
    assert current is not None and (current.value, current.lease) == (b"first", holder.lease)
    assert not holder.lost.is_set()
    await holder.close()
    after = await start_exclusive(second_store, ttl=1.0, key=key, value=b"second", wait_s=0.0)
    assert isinstance(after, Session)
    await after.close()


async def test_exclusive_key_of_a_crashed_holder_is_taken_once_its_lease_expires(
    store: Metastore, prefix: str
) -> None:
    key = prefix + "node-1"
    crashed = await store.grant_lease(1.0)  # never kept alive: its process died
    await store.put(key, b"crashed", lease=crashed)
    session = await start_exclusive(store, ttl=1.0, key=key, value=b"restarted", wait_s=10.0)
    assert isinstance(session, Session)
    current = await store.get(key)
    assert current is not None and (current.value, current.lease) == (b"restarted", session.lease)
    await session.close()


async def test_exclusive_key_bound_to_the_holders_own_lost_lease_is_taken_over(
    store: Metastore, prefix: str
) -> None:
    key = prefix + "node-1"
    lost = await store.grant_lease(30.0)
    await store.put(key, b"before", lease=lost)
    session = await start_exclusive(
        store, ttl=1.0, key=key, value=b"again", wait_s=0.0, replaces=lost
    )
    assert isinstance(session, Session)
    current = await store.get(key)
    assert current is not None and (current.value, current.lease) == (b"again", session.lease)
    await session.close()
    await store.revoke_lease(lost)

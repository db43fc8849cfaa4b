"""The metastore contract suite, run on SQLite and on a real etcd server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from headrace import errors
from headrace.metastore.contract import (
    Compare,
    CompareOp,
    Delete,
    Get,
    LeaseExpired,
    Metastore,
    Put,
    Target,
    WatchEvent,
)

from .conftest import OpenStore

HANG_GUARD = 15.0


async def take(events: AsyncIterator[WatchEvent], count: int) -> list[WatchEvent]:
    async with asyncio.timeout(HANG_GUARD):
        return [await anext(events) for _ in range(count)]


def summary(events: list[WatchEvent]) -> list[tuple[str, str, bytes]]:
    return [(e.type.value, e.kv.key, e.kv.value) for e in events]


# -- keys, values, revisions ---------------------------------------------------


async def test_put_get_overwrite_delete(store: Metastore, prefix: str) -> None:
    key = prefix + "k"
    assert await store.get(key) is None
    rev1 = await store.put(key, b"one")
    first = await store.get(key)
    assert first is not None
    assert (first.key, first.value, first.version, first.lease) == (key, b"one", 1, 0)
    assert first.create_revision == first.mod_revision == rev1
    rev2 = await store.put(key, b"two")
    second = await store.get(key)
    assert rev2 > rev1
    assert second is not None
    assert (second.value, second.version) == (b"two", 2)
    assert (second.create_revision, second.mod_revision) == (rev1, rev2)
    assert await store.revision() == rev2
    assert await store.delete(key) == 1
    assert await store.get(key) is None
    assert await store.delete(key) == 0
    again = await store.put(key, b"three")
    recreated = await store.get(key)
    assert recreated is not None
    assert (recreated.version, recreated.create_revision) == (1, again)


async def test_prefix_reads_and_deletes_in_key_order(store: Metastore, prefix: str) -> None:
    for name in ["b/2", "b/10", "a", "b/1", "bc", "b/"]:
        await store.put(prefix + name, name.encode())
    listed = await store.get_prefix(prefix + "b/")
    assert [kv.key for kv in listed] == [prefix + n for n in ["b/", "b/1", "b/10", "b/2"]]
    assert [kv.value for kv in listed] == [b"b/", b"b/1", b"b/10", b"b/2"]
    assert await store.delete(prefix + "b/", prefix=True) == 4
    assert [kv.key for kv in await store.get_prefix(prefix)] == [prefix + "a", prefix + "bc"]
    assert await store.get_prefix(prefix + "zz") == []


async def test_deleting_nothing_keeps_the_revision(store: Metastore, prefix: str) -> None:
    rev = await store.put(prefix + "x", b"1")
    assert await store.delete(prefix + "missing") == 0
    assert await store.delete(prefix + "none/", prefix=True) == 0
    assert await store.revision() == rev


async def test_unicode_keys_round_trip(store: Metastore, prefix: str) -> None:
    key = prefix + "zürich/日本"
    await store.put(key, b"\x00\xff")
    found = await store.get_prefix(prefix + "zürich/")
    assert [(kv.key, kv.value) for kv in found] == [(key, b"\x00\xff")]


async def test_bad_requests_are_invalid_argument(store: Metastore, prefix: str) -> None:
    with pytest.raises(errors.InvalidArgument):
        await store.put("", b"x")
    with pytest.raises(errors.InvalidArgument):
        await store.grant_lease(0)
    with pytest.raises(errors.InvalidArgument):
        await store.txn([Compare(prefix + "k", Target.VERSION, CompareOp.EQUAL, b"1")], [])
    with pytest.raises(errors.InvalidArgument):
        await store.txn([Compare(prefix + "k", Target.VALUE, CompareOp.EQUAL, 1)], [])
    with pytest.raises(errors.InvalidArgument):
        await store.txn([], [Put(prefix + "k", b"1"), Put(prefix + "k", b"2")])
    with pytest.raises(errors.InvalidArgument):
        await store.txn([], [Put(prefix + "d/k", b"1"), Delete(prefix + "d/", prefix=True)])
    assert await store.get_prefix(prefix) == []


# -- transactions --------------------------------------------------------------


async def _fixture_key(store: Metastore, key: str) -> tuple[int, int, int]:
    """Write ``key`` twice under a lease; its (create, mod, lease)."""
    lease = await store.grant_lease(30)
    create = await store.put(key, b"m")
    mod = await store.put(key, b"m", lease=lease)
    return create, mod, lease


async def test_every_compare_target_and_op(store: Metastore, prefix: str) -> None:
    key, missing = prefix + "k", prefix + "missing"
    create, mod, lease = await _fixture_key(store, key)
    cases = [
        (key, Target.VALUE, CompareOp.EQUAL, b"m", True),
        (key, Target.VALUE, CompareOp.NOT_EQUAL, b"m", False),
        (key, Target.VALUE, CompareOp.NOT_EQUAL, b"n", True),
        (key, Target.VALUE, CompareOp.LESS, b"n", True),
        (key, Target.VALUE, CompareOp.LESS, b"m", False),
        (key, Target.VALUE, CompareOp.GREATER, b"l", True),
        (key, Target.VALUE, CompareOp.GREATER, b"mm", False),
        (key, Target.VERSION, CompareOp.EQUAL, 2, True),
        (key, Target.VERSION, CompareOp.NOT_EQUAL, 2, False),
        (key, Target.VERSION, CompareOp.LESS, 3, True),
        (key, Target.VERSION, CompareOp.GREATER, 2, False),
        (key, Target.CREATE_REVISION, CompareOp.EQUAL, create, True),
        (key, Target.CREATE_REVISION, CompareOp.LESS, create, False),
        (key, Target.CREATE_REVISION, CompareOp.GREATER, create - 1, True),
        (key, Target.MOD_REVISION, CompareOp.EQUAL, mod, True),
        (key, Target.MOD_REVISION, CompareOp.EQUAL, create, False),
        (key, Target.MOD_REVISION, CompareOp.LESS, mod + 1, True),
        (key, Target.MOD_REVISION, CompareOp.NOT_EQUAL, mod, False),
        (key, Target.LEASE, CompareOp.EQUAL, lease, True),
        (key, Target.LEASE, CompareOp.NOT_EQUAL, 0, True),
        (key, Target.LEASE, CompareOp.EQUAL, 0, False),
        (missing, Target.VERSION, CompareOp.EQUAL, 0, True),
        (missing, Target.VALUE, CompareOp.EQUAL, b"", False),
        (missing, Target.VALUE, CompareOp.NOT_EQUAL, b"m", True),
        (missing, Target.VALUE, CompareOp.GREATER, b"", False),
        (missing, Target.CREATE_REVISION, CompareOp.LESS, 1, True),
        (missing, Target.MOD_REVISION, CompareOp.GREATER, 0, False),
        (missing, Target.LEASE, CompareOp.EQUAL, 0, True),
    ]
    outcomes = []
    for k, target, op, value, _ in cases:
        result = await store.txn([Compare(k, target, op, value)], [], [])
        outcomes.append(result.succeeded)
    assert outcomes == [case[-1] for case in cases]


async def test_compare_helpers(store: Metastore, prefix: str) -> None:
    key = prefix + "k"
    create, mod, lease = await _fixture_key(store, key)
    assert (await store.txn([Compare.value_is(key, b"m")], [])).succeeded
    assert (await store.txn([Compare.mod_revision_is(key, mod)], [])).succeeded
    assert not (await store.txn([Compare.mod_revision_is(key, create)], [])).succeeded
    assert (await store.txn([Compare.lease_is(key, lease)], [])).succeeded
    assert not (await store.txn([Compare.absent(key)], [])).succeeded
    assert (await store.txn([Compare.absent(prefix + "nope")], [])).succeeded


async def test_txn_success_branch_applies_ops_in_order(store: Metastore, prefix: str) -> None:
    a, b = prefix + "a", prefix + "b"
    await store.put(a, b"1")
    await store.put(prefix + "old/1", b"x")
    await store.put(prefix + "old/2", b"y")
    result = await store.txn(
        [Compare.value_is(a, b"1"), Compare.absent(b)],
        [
            Get(a),
            Put(a, b"2"),
            Put(b, b"new"),
            Delete(prefix + "old/", prefix=True),
            Get(a),
            Get(prefix, prefix=True),
        ],
        [Put(prefix + "failed", b"!")],
    )
    assert result.succeeded
    assert [[kv.value for kv in g] for g in result.gets] == [[b"1"], [b"2"], [b"2", b"new"]]
    assert result.revision == await store.revision()
    after_a, after_b = await store.get(a), await store.get(b)
    assert after_a is not None and after_b is not None
    assert after_a.mod_revision == after_b.mod_revision == result.revision
    assert await store.get(prefix + "failed") is None
    assert await store.get_prefix(prefix + "old/") == []


async def test_txn_failure_branch(store: Metastore, prefix: str) -> None:
    a = prefix + "a"
    await store.put(a, b"1")
    result = await store.txn(
        [Compare.value_is(a, b"other")],
        [Put(a, b"success")],
        [Put(prefix + "f", b"fail"), Get(a), Get(prefix + "f")],
    )
    assert not result.succeeded
    assert [[kv.value for kv in g] for g in result.gets] == [[b"1"], [b"fail"]]
    found = await store.get(a)
    assert found is not None and found.value == b"1"


async def test_txn_without_writes_keeps_the_revision(store: Metastore, prefix: str) -> None:
    rev = await store.put(prefix + "a", b"1")
    result = await store.txn([Compare.absent(prefix + "a")], [Put(prefix + "a", b"2")])
    assert not result.succeeded
    assert result.gets == []
    assert result.revision == rev == await store.revision()


async def test_several_value_inequalities(store: Metastore, prefix: str) -> None:
    present, missing = prefix + "present", prefix + "missing"
    await store.put(present, b"v")
    unequal = CompareOp.NOT_EQUAL
    hold = [
        Compare(present, Target.VALUE, unequal, b"w"),
        Compare(missing, Target.VALUE, unequal, b"w"),
    ]
    result = await store.txn(hold, [Put(prefix + "out", b"yes"), Get(prefix + "out")])
    assert result.succeeded
    assert [[kv.value for kv in g] for g in result.gets] == [[b"yes"]]
    fail = [
        Compare(missing, Target.VALUE, unequal, b"w"),
        Compare(present, Target.VALUE, unequal, b"v"),
    ]
    result = await store.txn(fail, [Put(prefix + "out", b"no")], [Get(present)])
    assert not result.succeeded
    assert [[kv.value for kv in g] for g in result.gets] == [[b"v"]]


async def test_compare_and_swap_admits_one_writer(store: Metastore, prefix: str) -> None:
    key = prefix + "counter"
    await store.put(key, b"0")
    seen = await store.get(key)
    assert seen is not None

    async def bump(value: bytes) -> bool:
        result = await store.txn(
            [Compare.mod_revision_is(key, seen.mod_revision)], [Put(key, value)]
        )
        return result.succeeded

    outcomes = await asyncio.gather(*(bump(str(i).encode()) for i in range(5)))
    assert sorted(outcomes) == [False] * 4 + [True]


# -- leases ----------------------------------------------------------------------


async def test_lease_binds_keys_and_revoke_deletes_them(store: Metastore, prefix: str) -> None:
    lease = await store.grant_lease(30)
    await store.put(prefix + "a", b"1", lease=lease)
    await store.txn([], [Put(prefix + "b", b"2", lease=lease)])
    await store.put(prefix + "free", b"3")
    bound = await store.get(prefix + "a")
    assert bound is not None and bound.lease == lease
    events = aiter(await store.watch_prefix(prefix))
    await store.revoke_lease(lease)
    deleted = await take(events, 2)
    assert sorted(summary(deleted)) == [
        ("DELETE", prefix + "a", b""),
        ("DELETE", prefix + "b", b""),
    ]
    assert deleted[0].kv.mod_revision == deleted[1].kv.mod_revision
    assert [kv.key for kv in await store.get_prefix(prefix)] == [prefix + "free"]
    await store.revoke_lease(lease)
    with pytest.raises(LeaseExpired):
        await store.keep_alive(lease)
    with pytest.raises(LeaseExpired):
        await store.put(prefix + "c", b"4", lease=lease)
    with pytest.raises(LeaseExpired):
        await store.txn([], [Put(prefix + "c", b"4", lease=lease)])
    assert await store.get(prefix + "c") is None


async def test_expired_lease_deletes_its_keys(store: Metastore, prefix: str) -> None:
    events = aiter(await store.watch_prefix(prefix))
    lease = await store.grant_lease(1)
    await store.put(prefix + "ephemeral", b"x", lease=lease)
    put, deleted = await take(events, 2)
    assert summary([put, deleted]) == [
        ("PUT", prefix + "ephemeral", b"x"),
        ("DELETE", prefix + "ephemeral", b""),
    ]
    assert await store.get(prefix + "ephemeral") is None
    with pytest.raises(LeaseExpired):
        await store.keep_alive(lease)


async def test_keep_alive_extends_the_lease(store: Metastore, prefix: str) -> None:
    """The key must outlive the first deadline. On a badly stalled machine the
    timing precondition may not hold; the attempt is then repeated."""
    ttl = 2.0
    for _ in range(3):
        lease = await store.grant_lease(ttl)
        granted = time.monotonic()
        await store.put(prefix + "kept", b"x", lease=lease)
        await asyncio.sleep(ttl * 0.6)
        renewed = time.monotonic()
        await store.keep_alive(lease)
        await asyncio.sleep(max(0.0, granted + ttl + 0.4 - time.monotonic()))
        present = await store.get(prefix + "kept")
        checked = time.monotonic()
        await store.revoke_lease(lease)
        if renewed - granted < ttl - 0.3 and checked - renewed < ttl - 0.3:
            assert present is not None
            return
    pytest.fail("the machine was too slow to check keep-alive timing three times")


# -- watches ---------------------------------------------------------------------


async def test_watch_from_now_sees_later_changes_in_order(store: Metastore, prefix: str) -> None:
    await store.put(prefix + "before", b"0")
    watch = await store.watch_prefix(prefix + "w/")
    events = aiter(watch)
    await store.put(prefix + "other", b"ignored")
    await store.put(prefix + "w/a", b"1")
    await store.put(prefix + "w/b", b"2")
    await store.put(prefix + "w/a", b"3")
    await store.delete(prefix + "w/b")
    got = await take(events, 4)
    assert summary(got) == [
        ("PUT", prefix + "w/a", b"1"),
        ("PUT", prefix + "w/b", b"2"),
        ("PUT", prefix + "w/a", b"3"),
        ("DELETE", prefix + "w/b", b""),
    ]
    revisions = [e.kv.mod_revision for e in got]
    assert revisions == sorted(revisions) and len(set(revisions)) == 4
    assert got[2].kv.version == 2 and got[2].kv.create_revision == got[0].kv.mod_revision
    await watch.close()


async def test_watch_from_a_past_revision(store: Metastore, prefix: str) -> None:
    first = await store.put(prefix + "a", b"1")
    await store.put(prefix + "b", b"2")
    await store.delete(prefix + "a")
    await store.txn([], [Put(prefix + "c", b"3"), Put(prefix + "d", b"4")])
    watch = await store.watch_prefix(prefix, start_revision=first + 1)
    got = await take(aiter(watch), 4)
    assert summary(got) == [
        ("PUT", prefix + "b", b"2"),
        ("DELETE", prefix + "a", b""),
        ("PUT", prefix + "c", b"3"),
        ("PUT", prefix + "d", b"4"),
    ]
    assert got[2].kv.mod_revision == got[3].kv.mod_revision
    await watch.close()


async def test_watch_sees_writes_of_another_client(open_store: OpenStore, prefix: str) -> None:
    reader, writer = await open_store(), await open_store()
    watch = await reader.watch_prefix(prefix)
    await writer.put(prefix + "x", b"from-writer")
    assert summary(await take(aiter(watch), 1)) == [("PUT", prefix + "x", b"from-writer")]
    await watch.close()


async def test_closed_watch_ends_iteration(store: Metastore, prefix: str) -> None:
    watch = await store.watch_prefix(prefix)
    events = aiter(watch)
    await store.put(prefix + "a", b"1")
    assert len(await take(events, 1)) == 1
    await watch.close()
    async with asyncio.timeout(HANG_GUARD):
        with pytest.raises(StopAsyncIteration):
            await anext(events)


# -- closing ------------------------------------------------------------------------


async def test_closed_store_raises_closed(open_store: OpenStore, prefix: str) -> None:
    store = await open_store()
    watch = await store.watch_prefix(prefix)
    events = aiter(watch)
    pending = asyncio.ensure_future(anext(events))
    await asyncio.sleep(0.05)
    await store.close()
    with pytest.raises(errors.Closed):
        await store.get(prefix + "a")
    with pytest.raises(errors.Closed):
        await store.put(prefix + "a", b"1")
    with pytest.raises(errors.Closed):
        await store.watch_prefix(prefix)
    async with asyncio.timeout(HANG_GUARD):
        with pytest.raises(errors.Closed):
            await pending
    await store.close()

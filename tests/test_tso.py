"""Hybrid timestamps: the pure block rule, LocalTSO and the metastore-backed TSO."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from headrace import errors, tso
from headrace.cluster import Keys
from headrace.metastore.sqlite import SqliteMetastore
from headrace.tso import (
    MAX_LOGICAL,
    LocalTSO,
    MetastoreTSO,
    compose,
    logical,
    next_block,
    physical_ms,
)

KEY = Keys("tso-test").tso
START_MS = 1_800_000_000_000


class FakeClock:
    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock(START_MS)
    monkeypatch.setattr(tso, "now_ms", fake)
    return fake


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteMetastore]:
    opened = await SqliteMetastore.open(str(tmp_path / "meta.db"))
    yield opened
    await opened.close()


async def stored_bound(store: SqliteMetastore) -> int:
    kv = await store.get(KEY)
    assert kv is not None
    return int(kv.value)


def test_next_block_rules() -> None:
    assert next_block(100, 0, 0, 1) == compose(100, 0)
    assert next_block(100, compose(100, 5), 0, 3) == compose(100, 6)
    assert next_block(90, compose(100, 5), 0, 1) == compose(100, 6)
    assert next_block(100, 0, 120, 1) == compose(120, 0)
    assert next_block(100, compose(100, MAX_LOGICAL - 1), 0, 2) == compose(101, 0)
    assert next_block(100, compose(100, MAX_LOGICAL - 2), 0, 2) == compose(100, MAX_LOGICAL - 1)


async def test_local_tso_is_strictly_increasing() -> None:
    local = LocalTSO()
    values = [await local.allocate() for _ in range(1000)]
    assert values == sorted(set(values))


async def test_allocations_increase_and_reserve_counts(
    store: SqliteMetastore, clock: FakeClock
) -> None:
    allocator = MetastoreTSO(store, KEY)
    first = await allocator.allocate()
    block = await allocator.allocate(10)
    after = await allocator.allocate()
    assert first < block and after == block + 10
    assert physical_ms(first) == START_MS
    values = [await allocator.allocate() for _ in range(500)]
    assert values == sorted(set(values)) and values[0] > after
    assert await stored_bound(store) > physical_ms(values[-1])
    await allocator.close()


async def test_logical_overflow_moves_to_the_next_millisecond(
    store: SqliteMetastore, clock: FakeClock
) -> None:
    allocator = MetastoreTSO(store, KEY)
    first = await allocator.allocate(MAX_LOGICAL)
    second = await allocator.allocate(2)
    assert (physical_ms(first), logical(first)) == (START_MS, 0)
    assert (physical_ms(second), logical(second)) == (START_MS + 1, 0)
    with pytest.raises(errors.InvalidArgument):
        await allocator.allocate(0)
    with pytest.raises(errors.InvalidArgument):
        await allocator.allocate(MAX_LOGICAL + 2)
    await allocator.close()


async def test_restart_never_goes_backwards_even_if_the_clock_did(
    store: SqliteMetastore, clock: FakeClock
) -> None:
    before = MetastoreTSO(store, KEY)
    last_before = max([await before.allocate() for _ in range(100)])
    bound = await stored_bound(store)
    await before.close()
    clock.now -= 60_000
    after = MetastoreTSO(store, KEY)
    first_after = await after.allocate()
    assert first_after > last_before
    assert physical_ms(first_after) >= bound
    values = [await after.allocate() for _ in range(100)]
    assert values == sorted(set(values)) and values[0] > first_after
    await after.close()


async def test_window_is_renewed_ahead_of_time(store: SqliteMetastore, clock: FakeClock) -> None:
    allocator = MetastoreTSO(store, KEY, window_ms=100, renew_ms=40)
    await allocator.allocate()
    first_bound = await stored_bound(store)
    assert first_bound == START_MS + 1 + 100
    bound_changes = await store.watch_prefix(KEY)
    clock.now += 70
    inside = await allocator.allocate()
    assert physical_ms(inside) == START_MS + 70
    async with asyncio.timeout(10):
        renewal = await anext(bound_changes)
    assert int(renewal.kv.value) > first_bound
    await bound_changes.close()
    clock.now += 500
    late = await allocator.allocate()
    assert physical_ms(late) == START_MS + 570
    assert await stored_bound(store) > START_MS + 570
    await allocator.close()


async def test_two_allocators_on_one_key_get_disjoint_windows(
    store: SqliteMetastore, clock: FakeClock
) -> None:
    a = MetastoreTSO(store, KEY, window_ms=5, renew_ms=2)
    b = MetastoreTSO(store, KEY, window_ms=5, renew_ms=2)
    seen: dict[str, list[int]] = {"a": [], "b": []}
    windows: dict[str, set[tuple[int, int]]] = {"a": set(), "b": set()}
    handed_out: list[int] = []
    for step in range(200):
        clock.now += step % 3
        count = 1 + step % 4
        for name, allocator in (("a", a), ("b", b)):
            first = await allocator.allocate(count)
            seen[name].append(first)
            handed_out.extend(range(first, first + count))
            windows[name].add(allocator.window)
    for values in seen.values():
        assert values == sorted(set(values))
    assert len(handed_out) == len(set(handed_out))
    for start, end in windows["a"]:
        for other_start, other_end in windows["b"]:
            assert end <= other_start or other_end <= start
    await a.close()
    await b.close()


async def test_corrupt_bound_is_reported(store: SqliteMetastore, clock: FakeClock) -> None:
    await store.put(KEY, b"not-a-number")
    allocator = MetastoreTSO(store, KEY)
    with pytest.raises(errors.CorruptData):
        await allocator.allocate()
    await allocator.close()

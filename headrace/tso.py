"""Hybrid timestamps (TSO) for timeticks.

A timestamp is ``physical_ms << 18 | logical``: wall-clock milliseconds in the
high bits, a counter in the low 18 bits. Allocators hand out strictly
increasing values. :class:`MetastoreTSO` reserves windows of physical time in
the metastore so that a restarted allocator never hands out a smaller value
than any one before the restart, even if the wall clock went backwards.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import time

from headrace import errors
from headrace.guarded import TaskFailure, guarded_task
from headrace.metastore.contract import Compare, Get, KeyValue, Metastore, Put

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_LOGICAL = LOGICAL_MASK
_log = logging.getLogger(__name__)


def compose(physical_ms: int, logical: int) -> int:
    return (physical_ms << LOGICAL_BITS) | logical


def physical_ms(ts: int) -> int:
    return ts >> LOGICAL_BITS


def logical(ts: int) -> int:
    return ts & LOGICAL_MASK


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class TimestampAllocator(abc.ABC):
    """Source of strictly increasing hybrid timestamps."""

    @abc.abstractmethod
    async def allocate(self, count: int = 1) -> int:
        """Reserve ``count`` consecutive timestamps; return the first."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release resources; default does nothing."""


class LocalTSO(TimestampAllocator):
    """In-process allocator without persistence (tests, single-process tools)."""

    def __init__(self, floor: int = 0) -> None:
        self._last = floor

    async def allocate(self, count: int = 1) -> int:
        return self.allocate_sync(count)

    def allocate_sync(self, count: int = 1) -> int:
        candidate = compose(now_ms(), 0)
        first = max(candidate, self._last + 1)
        if logical(first) + count - 1 > MAX_LOGICAL:
            first = compose(physical_ms(first) + 1, 0)
        self._last = first + count - 1
        return first


def next_block(now: int, last: int, floor_physical: int, count: int) -> int:
    """First of ``count`` consecutive timestamps after ``last``, not before
    ``now`` ms nor ``floor_physical`` ms, all within one millisecond."""
    first = max(compose(now, 0), last + 1, compose(floor_physical, 0))
    if logical(first) + count - 1 > MAX_LOGICAL:
        first = compose(physical_ms(first) + 1, 0)
    return first


class MetastoreTSO(TimestampAllocator):
    """Allocator whose physical time is reserved in the metastore in windows.

    The key (e.g. ``Keys(cluster).tso``) holds an exclusive upper bound ``U`` in
    milliseconds: no timestamp with a physical part ``>= U`` was ever handed
    out. A reservation replaces ``U`` by ``U' > U`` with compare-and-swap on
    the key's revision and entitles this allocator to the physical range
    ``[U, U')`` (joined to its current window when that ended at ``U``). A new
    allocator therefore starts at ``U`` or later, so a restart never goes
    backwards even if the wall clock did. Windows are ``window_ms`` ahead of
    the clock and are renewed in the background once less than ``renew_ms``
    remains; an allocation only waits for the metastore when its window ran out.

    Two allocators sharing a key get disjoint windows, so no timestamp is ever
    handed out twice and each allocator's values strictly increase; values of
    different allocators interleave, though an allocator's values after a
    renewal exceed everything the other reserved before it. One allocator per
    cluster (the coordinator's) is the intended use; sharing is a safe overlap
    during a handoff, not a source of global order.
    """

    _MAX_CAS_ATTEMPTS = 16

    def __init__(
        self, store: Metastore, key: str, *, window_ms: int = 3000, renew_ms: int = 1000
    ) -> None:
        if window_ms < 2 or not 0 <= renew_ms < window_ms:
            raise errors.InvalidArgument(f"bad TSO window {window_ms} ms / renew {renew_ms} ms")
        self._store = store
        self._key = key
        self._window_ms = window_ms
        self._renew_ms = renew_ms
        self._last = 0
        self._start = 0
        self._end = -1
        """This allocator may use physical ms in ``[_start, _end)``."""
        self._stored: tuple[int, int] | None = None
        """(bound, mod revision) of the key as last seen; None before the first read."""
        self._lock = asyncio.Lock()
        self._reserve_lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None

    @property
    def window(self) -> tuple[int, int]:
        """The physical range ``[start, end)`` in ms this allocator holds now."""
        return (self._start, max(self._end, self._start))

    async def allocate(self, count: int = 1) -> int:
        if not 1 <= count <= MAX_LOGICAL + 1:
            raise errors.InvalidArgument(f"cannot allocate {count} timestamps at once")
        async with self._lock:
            while True:
                first = next_block(now_ms(), self._last, self._start, count)
                need = physical_ms(first + count - 1)
                if need < self._end:
                    break
                await self._reserve(need)
            self._last = first + count - 1
            if self._end - need <= self._renew_ms and (
                self._background is None or self._background.done()
            ):
                self._background = guarded_task(
                    self._renew_in_background(need),
                    f"tso-renewal {self._key}",
                    self._renewal_failed,
                    finishable=True,
                    logger=_log,
                )
            return first

    async def _renew_in_background(self, need: int) -> None:
        try:
            await self._reserve(need)
        except errors.HeadraceError as exc:
            _log.warning("TSO window renewal on %s failed (will retry): %s", self._key, exc)

    async def _renewal_failed(self, failure: TaskFailure) -> None:
        """Nothing else depends on a background renewal (it is logged): an
        allocation that needs the window renews it in the foreground."""

    async def _reserve(self, need: int) -> None:
        """Make ``_end`` exceed ``need`` ms (plus a window ahead of the clock)."""
        async with self._reserve_lock:
            if self._stored is None:
                self._stored = _decode_bound(self._key, await self._store.get(self._key))
            for _ in range(self._MAX_CAS_ATTEMPTS):
                if need < self._end - self._renew_ms:
                    return
                base, revision = self._stored
                new_end = max(need + 1, now_ms(), base) + self._window_ms
                result = await self._store.txn(
                    [Compare.mod_revision_is(self._key, revision)],
                    [Put(self._key, str(new_end).encode())],
                    [Get(self._key)],
                )
                if result.succeeded:
                    if base != self._end:
                        self._start = base
                    self._end = new_end
                    self._stored = (new_end, result.revision)
                    return
                found = result.gets[0][0] if result.gets and result.gets[0] else None
                self._stored = _decode_bound(self._key, found)
        raise errors.Unavailable(f"TSO: lost {self._MAX_CAS_ATTEMPTS} reservations on {self._key}")

    async def close(self) -> None:
        if self._background is not None:
            self._background.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._background


def _decode_bound(key: str, kv: KeyValue | None) -> tuple[int, int]:
    if kv is None:
        return (0, 0)
    try:
        return (int(kv.value.decode("ascii")), kv.mod_revision)
    except (UnicodeDecodeError, ValueError):
        raise errors.CorruptData(f"TSO bound under {key!r} is not a number: {kv.value!r}") from None

"""Hybrid timestamps (TSO) for timeticks.

A timestamp is ``physical_ms << 18 | logical``: wall-clock milliseconds in the
high bits, a counter in the low 18 bits. Allocators hand out strictly
increasing values. :class:`MetastoreTSO` reserves windows of physical time in
the metastore so that a restarted allocator never hands out a smaller value
than any one before the restart, even if the wall clock went backwards.
"""

from __future__ import annotations

import abc
import time

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_LOGICAL = LOGICAL_MASK


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

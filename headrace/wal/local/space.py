"""The local WAL's free-space reserve.

The WAL stops taking appends while the file system it lives on has less than
a reserve free, so a growing log never takes the last bytes that the
metastore, the node logs and its own segment rolls on the same disk need: a
producer gets STORAGE_FULL for its appends (retryable, acknowledging nothing)
while the node keeps its session and its pchannels, instead of the node
losing them because the metastore cannot write. Appends resume by themselves
once space is freed.

Free space is read with ``statvfs`` at most four times a second while it is well
above the reserve, and before every write once it is near it.
"""

from __future__ import annotations

import dataclasses
import os
import time

from headrace import errors

RESERVE_MAX = 64 * 1024 * 1024
RESERVE_SHARE = 20
"""The default reserve is 1/20 of the file system, at most RESERVE_MAX."""
NEAR = 16 * 1024 * 1024
"""Within this much of the reserve, free space is read before every write."""
READ_EVERY_S = 0.25


def default_reserve(total_bytes: int) -> int:
    """The reserve kept on a file system of ``total_bytes`` (pure)."""
    return min(RESERVE_MAX, total_bytes // RESERVE_SHARE)


def free_space(directory: str) -> tuple[int, int]:
    """Bytes available to this process and total bytes of ``directory``'s file system."""
    stat = os.statvfs(directory)
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


@dataclasses.dataclass(frozen=True, slots=True)
class Reading:
    free: int
    """Free bytes as read, less what was written since."""
    reserve: int
    at: float


def needs_reading(last: Reading | None, size: int, now: float) -> bool:
    """Whether free space must be read again before writing ``size`` bytes (pure)."""
    if last is None or now - last.at >= READ_EVERY_S:
        return True
    return last.free - size < last.reserve + NEAR


class SpaceGuard:
    """Refuses writes that would leave less than the reserve free (blocking calls)."""

    def __init__(self, directory: str, reserve_bytes: int | None) -> None:
        """``reserve_bytes``: None for :func:`default_reserve`, 0 for no reserve."""
        self._directory = directory
        self._reserve = reserve_bytes
        self._last: Reading | None = None

    def check(self, size: int, path: str) -> None:
        """StorageFull if writing ``size`` bytes to ``path`` would eat into the reserve."""
        if self._reserve == 0:
            return
        now = time.monotonic()
        last = self._last
        if last is None or needs_reading(last, size, now):
            free, total = free_space(self._directory)
            reserve = default_reserve(total) if self._reserve is None else self._reserve
            last = Reading(free, reserve, now)
        if last.free - size < last.reserve:
            self._last = last
            raise errors.StorageFull(
                f"appending {size} bytes to {path}: the file system has {last.free} bytes "
                f"free, less than the {last.reserve} bytes the WAL keeps free for the "
                "metastore and logs; nothing of this write was acknowledged, acknowledged "
                "records are intact; free space and retry"
            )
        self._last = Reading(last.free - size, last.reserve, last.at)

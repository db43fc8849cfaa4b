"""Which snapshots a table keeps and which of its files are garbage (pure).

Two decisions, no I/O (the I/O is :mod:`headrace.table.maintenance`):

* :func:`snapshots_to_expire`: keep the current snapshot, every pinned one
  (branch and tag heads, and the snapshots readers hold, issue #15), every
  snapshot younger than ``max_snapshot_age_s`` and the ``min_snapshots``
  newest; expire the rest.
* :func:`orphans`: of the files listed under a table's location, those that
  no retained snapshot and no kept metadata file references, and that are
  older than ``orphan_grace_s`` (a running flush's files are not referenced
  yet); :func:`dropped_files` for a dropped collection's whole location.

Each kept thing says why (:class:`Kept`), so a log can tell.
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Iterable

from headrace import errors


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionOptions:
    """How long snapshots and unreferenced files live."""

    max_snapshot_age_s: float = 86_400.0
    """Snapshots younger than this are kept (readers may still use them)."""
    min_snapshots: int = 5
    """The newest snapshots kept whatever their age (the current one included)."""
    orphan_grace_s: float = 3_600.0
    """An unreferenced file younger than this is kept: a flush still running
    has written it and not committed yet."""

    def __post_init__(self) -> None:
        if self.max_snapshot_age_s < 0 or self.orphan_grace_s < 0:
            raise errors.InvalidArgument(
                "max_snapshot_age_s and orphan_grace_s must be >= 0, got "
                f"{self.max_snapshot_age_s} and {self.orphan_grace_s}"
            )
        if self.min_snapshots < 1:
            raise errors.InvalidArgument(f"min_snapshots must be >= 1, got {self.min_snapshots}")


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotAge:
    snapshot_id: int
    timestamp_s: float


class Kept(enum.Enum):
    CURRENT = "the current snapshot"
    PINNED = "pinned (a branch or tag head, or held by a reader)"
    YOUNG = "younger than max_snapshot_age_s"
    NEWEST = "one of the min_snapshots newest"
    REPLACED_RECENTLY = "the current snapshot less than orphan_grace_s ago"


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotPlan:
    kept: dict[int, Kept]
    """Snapshot id -> why it is kept."""
    expire: frozenset[int]


def snapshots_to_expire(
    snapshots: Iterable[SnapshotAge],
    current: int | None,
    pinned: frozenset[int],
    now_s: float,
    options: RetentionOptions,
) -> SnapshotPlan:
    """Which snapshots to keep (and why) and which to expire.

    A snapshot replaced by the next one less than ``orphan_grace_s`` ago is
    kept whatever its own age: a reader that loaded the table just before a
    compaction (or a delete's rewrite) replaced its files is still reading
    them, so files are deleted only a grace period after they stopped being
    current (and never while a reader pins the snapshot).
    """
    newest_first = sorted(snapshots, key=lambda s: (s.timestamp_s, s.snapshot_id), reverse=True)
    newest = {s.snapshot_id for s in newest_first[: options.min_snapshots]}
    replaced_at = {
        older.snapshot_id: newer.timestamp_s for newer, older in itertools.pairwise(newest_first)
    }
    kept: dict[int, Kept] = {}
    for snapshot in newest_first:
        sid = snapshot.snapshot_id
        replaced = replaced_at.get(sid)
        if sid == current:
            kept[sid] = Kept.CURRENT
        elif sid in pinned:
            kept[sid] = Kept.PINNED
        elif now_s - snapshot.timestamp_s < options.max_snapshot_age_s:
            kept[sid] = Kept.YOUNG
        elif sid in newest:
            kept[sid] = Kept.NEWEST
        elif replaced is not None and now_s - replaced < options.orphan_grace_s:
            kept[sid] = Kept.REPLACED_RECENTLY
    expire = frozenset(s.snapshot_id for s in newest_first if s.snapshot_id not in kept)
    return SnapshotPlan(kept, expire)


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """A file found under a table's location (a filesystem path, no scheme)."""

    path: str
    mtime_s: float | None
    """None when the store does not say: such a file is never deleted."""


@dataclasses.dataclass(frozen=True, slots=True)
class OrphanPlan:
    delete: tuple[str, ...]
    too_young: tuple[str, ...]
    """Unreferenced, but inside the grace period (or of unknown age): kept this time."""


def orphans(
    listed: Iterable[Listed],
    referenced: frozenset[str],
    now_s: float,
    options: RetentionOptions,
) -> OrphanPlan:
    """Files no retained snapshot or kept metadata file references, past the grace period.

    ``referenced`` holds every path the table still needs: the data files,
    manifests and manifest lists of the retained snapshots, and the current,
    previous and logged metadata files.
    """
    delete: list[str] = []
    young: list[str] = []
    for entry in listed:
        if entry.path in referenced:
            continue
        if _past_grace(entry, now_s, options.orphan_grace_s):
            delete.append(entry.path)
        else:
            young.append(entry.path)
    return OrphanPlan(tuple(sorted(delete)), tuple(sorted(young)))


def dropped_files(
    listed: Iterable[Listed], dropped_at_s: float, now_s: float, options: RetentionOptions
) -> OrphanPlan:
    """A dropped collection's files: all garbage once the drop is past the
    grace period (a flush launched before the drop may still be writing)."""
    files = list(listed)
    if now_s - dropped_at_s < options.orphan_grace_s:
        return OrphanPlan((), tuple(sorted(f.path for f in files)))
    return orphans(files, frozenset(), now_s, options)


def _past_grace(entry: Listed, now_s: float, grace_s: float) -> bool:
    return entry.mtime_s is not None and now_s - entry.mtime_s >= grace_s

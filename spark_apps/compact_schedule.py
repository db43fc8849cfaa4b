"""Which collection shards the runner compacts, and why the others wait (pure).

Three triggers, each a measure of one shard's live data files in the table's
current snapshot, plus a request from ``headrace compact``:

* **small files**: at least ``min_small_files`` files smaller than
  ``small_file_bytes`` (each flush adds a file per segment; thousands of them
  make every scan and every delete's rewrite slow);
* **delete ratio**: rows deleted since the shard's last compaction over its
  live rows reaches ``max_delete_ratio``; deletes rewrite files without the
  deleted rows (copy-on-write), so a delete-heavy shard ends up in shrunken
  files, and every file is rewritten (not only the small ones);
* **age**: two or more small files, the oldest older than
  ``max_small_file_age_s`` (a trickle of small files is merged eventually);
* **request**: ``headrace compact --collection C`` merges the small files now.

A shard with fewer than two candidate files never compacts (one file is
already one file). A compaction takes at most ``max_input_files`` files per
run (milvus #32553: a compaction that must take everything at once stalls on
thousands of files), so a big backlog is worked off in bounded steps, one per
round. A failed run backs off like a flush (:func:`spark_apps.schedule.backoff`).
"""

from __future__ import annotations

import dataclasses
import enum

from headrace import errors
from spark_apps.schedule import RetryPolicy, backoff


@dataclasses.dataclass(frozen=True, slots=True)
class CompactionPolicy:
    target_file_bytes: int = 128 * 2**20
    """Size of the files a compaction writes."""
    small_file_bytes: int = 64 * 2**20
    """A file below this is small (a candidate for merging)."""
    min_small_files: int = 8
    max_delete_ratio: float = 0.2
    max_small_file_age_s: float = 3_600.0
    max_input_files: int = 1_000
    """Files one run takes at most: bounded work per run."""

    def __post_init__(self) -> None:
        if not 0 < self.small_file_bytes <= self.target_file_bytes:
            raise errors.InvalidArgument(
                f"small_file_bytes must be in (0, target_file_bytes], got {self.small_file_bytes}"
                f" with target_file_bytes {self.target_file_bytes}"
            )
        if self.min_small_files < 2 or self.max_input_files < 2:
            raise errors.InvalidArgument(
                "min_small_files and max_input_files must be at least 2, got "
                f"{self.min_small_files} and {self.max_input_files}"
            )
        if not self.max_delete_ratio > 0 or self.max_small_file_age_s < 0:
            raise errors.InvalidArgument(
                f"max_delete_ratio must be > 0 and max_small_file_age_s >= 0, got "
                f"{self.max_delete_ratio} and {self.max_small_file_age_s}"
            )


class Selection(enum.Enum):
    SMALL = "SMALL"
    """The small files only."""
    ALL = "ALL"
    """Every file (the delete-ratio trigger: files shrunk by deletes)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardState:
    """What the table says about one shard now."""

    collection: str
    shard: int
    files: int
    small_files: int
    live_rows: int
    deleted_rows: int
    """Rows deleted since the shard's last compaction (an estimate: flushed rows
    minus live rows, less the same difference at that compaction)."""
    oldest_small_at_s: float | None
    """Wall-clock time the oldest small file was committed; None: no small file."""
    requested: bool = False

    @property
    def delete_ratio(self) -> float:
        if self.deleted_rows <= 0:
            return 0.0
        return self.deleted_rows / max(self.live_rows, 1)


@dataclasses.dataclass(frozen=True, slots=True)
class Failures:
    """The runner's history of one shard's compactions since the last success."""

    count: int = 0
    retry_at: float = 0.0
    """Monotonic time before which the shard is not compacted again."""
    last_error: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class Compact:
    collection: str
    shard: int
    selection: Selection
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class Hold:
    collection: str
    shard: int
    reason: str
    until: float | None = None
    """Monotonic time the hold ends by itself; None: until the files change."""


def next_compaction(
    state: ShardState,
    policy: CompactionPolicy,
    failures: Failures,
    now_s: float,
    now_mono: float,
) -> Compact | Hold:
    """Whether to compact the shard now (and which files), or why not."""
    c, s = state.collection, state.shard
    if state.files < 2:
        return Hold(c, s, f"nothing to merge: {state.files} data file(s)")
    if now_mono < failures.retry_at:
        return Hold(
            c,
            s,
            f"backing off after {failures.count} failure(s): {failures.last_error}",
            until=failures.retry_at,
        )
    if state.small_files >= 2 and state.requested:
        return Compact(c, s, Selection.SMALL, f"requested; {state.small_files} small files")
    if state.small_files >= policy.min_small_files:
        return Compact(
            c,
            s,
            Selection.SMALL,
            f"{state.small_files} small files (at least {policy.min_small_files})",
        )
    if state.delete_ratio >= policy.max_delete_ratio:
        return Compact(
            c,
            s,
            Selection.ALL,
            f"delete ratio {state.delete_ratio:.2f} ({state.deleted_rows} deleted, "
            f"{state.live_rows} live; at least {policy.max_delete_ratio})",
        )
    age = None if state.oldest_small_at_s is None else now_s - state.oldest_small_at_s
    if state.small_files >= 2 and age is not None and age >= policy.max_small_file_age_s:
        return Compact(
            c,
            s,
            Selection.SMALL,
            f"{state.small_files} small files, the oldest {age:.0f}s old "
            f"(at least {policy.max_small_file_age_s:.0f}s)",
        )
    return Hold(
        c,
        s,
        f"{state.small_files} small files (compacts at {policy.min_small_files}), delete ratio "
        f"{state.delete_ratio:.2f} (at {policy.max_delete_ratio}), oldest small file "
        + ("none" if age is None else f"{age:.0f}s old")
        + f" (at {policy.max_small_file_age_s:.0f}s with 2 or more)",
    )


def after_failure(
    failures: Failures, error: errors.HeadraceError, now_mono: float, policy: RetryPolicy
) -> Failures:
    """The shard's history after a failed compaction: back off."""
    count = failures.count + 1
    return Failures(count, now_mono + backoff(count, policy), str(error))

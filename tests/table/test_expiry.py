"""The pure retention decisions: which snapshots are expired, which files are orphans."""

from __future__ import annotations

import pytest

from headrace import errors
from headrace.table.expiry import (
    Kept,
    Listed,
    RetentionOptions,
    SnapshotAge,
    dropped_files,
    orphans,
    snapshots_to_expire,
)

NOW = 1_000_000.0
DAY = 86_400.0


def ages(*days_old: float) -> list[SnapshotAge]:
    """Snapshot i (id i + 1) taken ``days_old[i]`` days before NOW."""
    return [SnapshotAge(i + 1, NOW - d * DAY) for i, d in enumerate(days_old)]


def test_keeps_current_young_and_the_newest_and_expires_the_rest() -> None:
    snapshots = ages(10, 9, 8, 7, 6, 5, 4, 3, 0.5, 0.1)
    plan = snapshots_to_expire(snapshots, 10, frozenset(), NOW, RetentionOptions(min_snapshots=4))
    assert plan.kept == {10: Kept.CURRENT, 9: Kept.YOUNG, 8: Kept.NEWEST, 7: Kept.NEWEST}
    assert plan.expire == frozenset({1, 2, 3, 4, 5, 6})


def test_young_snapshots_are_kept_beyond_min_snapshots() -> None:
    snapshots = ages(0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3)
    plan = snapshots_to_expire(snapshots, 7, frozenset(), NOW, RetentionOptions(min_snapshots=1))
    assert plan.expire == frozenset()
    assert len(plan.kept) == 7


def test_pinned_snapshots_are_kept_whatever_their_age() -> None:
    snapshots = ages(30, 20, 10, 0)
    # no grace: snapshot 3, replaced just now, is not kept for its readers either
    options = RetentionOptions(min_snapshots=1, max_snapshot_age_s=0, orphan_grace_s=0)
    plan = snapshots_to_expire(snapshots, 4, frozenset({1}), NOW, options)
    assert plan.kept == {4: Kept.CURRENT, 1: Kept.PINNED}
    assert plan.expire == frozenset({2, 3})


def test_the_current_snapshot_is_kept_even_when_not_the_newest() -> None:
    # A rolled-back table: the current snapshot is older than another one.
    snapshots = ages(30, 20, 10)
    options = RetentionOptions(min_snapshots=1, max_snapshot_age_s=0)
    plan = snapshots_to_expire(snapshots, 1, frozenset(), NOW, options)
    assert plan.kept == {1: Kept.CURRENT, 3: Kept.NEWEST}
    assert plan.expire == frozenset({2})


def test_a_snapshot_replaced_within_the_grace_period_is_kept_however_old() -> None:
    """A compaction replaced the files of a two-day-old snapshot 10 s ago: a
    reader that loaded it just before may still read those files, so the
    snapshot (and so its files) stays until the grace period has passed."""
    snapshots = [SnapshotAge(1, NOW - 2 * DAY), SnapshotAge(2, NOW - 10)]
    options = RetentionOptions(min_snapshots=1, max_snapshot_age_s=DAY, orphan_grace_s=3600)
    plan = snapshots_to_expire(snapshots, 2, frozenset(), NOW, options)
    assert plan.kept == {2: Kept.CURRENT, 1: Kept.REPLACED_RECENTLY}
    later = snapshots_to_expire(snapshots, 2, frozenset(), NOW + 3600, options)
    assert later.expire == frozenset({1})


def test_no_snapshots_expires_nothing() -> None:
    assert snapshots_to_expire([], None, frozenset(), NOW, RetentionOptions()).expire == frozenset()


def test_unreferenced_files_past_the_grace_period_are_orphans() -> None:
    listed = [
        Listed("/t/data/committed.parquet", NOW - 7200),
        Listed("/t/data/killed.parquet", NOW - 7200),
        Listed("/t/data/running.parquet", NOW - 60),
        Listed("/t/metadata/staged.avro", NOW - 3600),
        Listed("/t/metadata/unknown-age.avro", None),
        Listed("/t/metadata/00001.metadata.json", NOW - 9000),
    ]
    referenced = frozenset({"/t/data/committed.parquet", "/t/metadata/00001.metadata.json"})
    plan = orphans(listed, referenced, NOW, RetentionOptions(orphan_grace_s=3600))
    assert plan.delete == ("/t/data/killed.parquet", "/t/metadata/staged.avro")
    assert plan.too_young == ("/t/data/running.parquet", "/t/metadata/unknown-age.avro")


def test_a_referenced_file_is_never_an_orphan_however_old() -> None:
    listed = [Listed("/t/data/a.parquet", 0.0)]
    plan = orphans(listed, frozenset({"/t/data/a.parquet"}), NOW, RetentionOptions())
    assert plan.delete == () and plan.too_young == ()


def test_a_dropped_collection_is_garbage_only_after_the_grace_period() -> None:
    listed = [Listed("/t/data/a.parquet", NOW - 9 * DAY), Listed("/t/data/b.parquet", NOW - 10)]
    options = RetentionOptions(orphan_grace_s=3600)
    early = dropped_files(listed, NOW - 60, NOW, options)
    assert early.delete == () and early.too_young == ("/t/data/a.parquet", "/t/data/b.parquet")
    late = dropped_files(listed, NOW - 7200, NOW, options)
    # b was written after the drop (a flush launched before it): still in its grace.
    assert late.delete == ("/t/data/a.parquet",) and late.too_young == ("/t/data/b.parquet",)


@pytest.mark.parametrize(
    "fields",
    [{"min_snapshots": 0}, {"max_snapshot_age_s": -1.0}, {"orphan_grace_s": -5.0}],
)
def test_bad_options_are_refused(fields: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidArgument):
        RetentionOptions(**fields)  # type: ignore[arg-type]

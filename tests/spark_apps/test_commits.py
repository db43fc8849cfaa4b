"""Splitting a flush into commits of consecutive WAL ranges (pure)."""

from __future__ import annotations

import itertools

import headrace.wal.memory  # noqa: F401 - registers the memory: message ids
from headrace.table import CatalogConfig, FlushCommit, SegmentRecord
from headrace.table.records import MAX_KEYS_PER_COMMIT
from spark_apps.commits import plan_commits
from spark_apps.shard import PositionedDelete, RangeJob, ShardResult

JOB = RangeJob(
    cluster="default",
    metastore_url="sqlite:///x.db",
    pchannel="p",
    term=3,
    start="memory:5",
    end="memory:1000",
    catalog=CatalogConfig("sqlite:///x.db", "/w"),
    attempt="a",
)


def shard(collection: str, vchannel: str, seals: list[int], **extra: object) -> ShardResult:
    """A shard whose segment i (id = its seal position) was sealed at memory:<seal>."""
    segments = tuple(
        SegmentRecord(
            segment_id=seal, vchannel=vchannel, start="memory:6", end=f"memory:{seal}",
            collection=collection, rows=1, files=[f"f{seal}"],
        )
        for seal in seals
    )  # fmt: skip
    return ShardResult(
        collection,
        vchannel,
        segments,
        tuple(extra.get("deletes", ())),  # type: ignore[arg-type]
        timetick=5000,
        seal_timeticks=tuple((seal, seal * 10) for seal in seals),
    )


def test_a_flush_that_fits_is_one_commit_over_the_whole_range() -> None:
    results = [
        shard("a", "a-0", [10, 30], deletes=[PositionedDelete("memory:20", (1, 2))]),
        shard("a", "a-1", [40], deletes=[PositionedDelete("memory:50", (2, 3))]),
    ]
    (commit,) = plan_commits(JOB, results)
    assert (commit.wal_range.start, commit.wal_range.end) == ("memory:5", "memory:1000")
    assert commit.checkpoint.position == "memory:1000"
    assert commit.checkpoint.timetick == 5000
    (table,) = commit.tables
    assert [s.segment_id for s in table.segments] == [10, 30, 40]
    assert table.data_files == ("f10", "f30", "f40")
    assert table.deletes == (1, 2, 3)


def test_more_segments_than_a_commit_holds_become_consecutive_ranges() -> None:
    seals_a = list(range(10, 610, 2))  # 300 segments, seals at even positions
    seals_b = list(range(11, 611, 4))  # 150 segments on another collection
    results = [
        shard("a", "a-0", seals_a, deletes=[PositionedDelete("memory:301", (7,))]),
        shard("b", "b-0", seals_b, deletes=[PositionedDelete("memory:999", (8,))]),
    ]
    commits = plan_commits(JOB, results)
    assert len(commits) > 1
    # Consecutive: each starts where the previous ended, from the flush's start to its end.
    assert commits[0].wal_range.start == JOB.start
    assert commits[-1].wal_range.end == JOB.end
    for before, after in itertools.pairwise(commits):
        assert after.wal_range.start == before.wal_range.end == before.checkpoint.position
    for commit in commits:
        keys = sum(len(t.segments) for t in commit.tables) + len(commit.tables)
        assert keys <= MAX_KEYS_PER_COMMIT
        FlushCommit(**{f: getattr(commit, f) for f in commit.__dataclass_fields__})
    # Every segment exactly once, each in the commit whose range holds its seal.
    flushed = [s.segment_id for c in commits for t in c.tables for s in t.segments]
    assert sorted(flushed) == sorted(seals_a + seals_b)
    for commit in commits[:-1]:
        end = int(commit.wal_range.end.split(":")[1])
        assert max(s.segment_id for t in commit.tables for s in t.segments) == end
        # An intermediate checkpoint carries the timetick of the seal it ends at.
        assert commit.checkpoint.timetick == end * 10
    # Each delete is in the commit whose range holds it; the last one's past every seal.
    where = {k: i for i, c in enumerate(commits) for t in c.tables for k in t.deletes}
    lows = [int(c.wal_range.start.split(":")[1]) for c in commits]
    highs = [int(c.wal_range.end.split(":")[1]) for c in commits]
    assert lows[where[7]] < 301 <= highs[where[7]]
    assert where[8] == len(commits) - 1


def test_exactly_the_largest_commit_is_not_split() -> None:
    fits = list(range(10, 10 + MAX_KEYS_PER_COMMIT - 1))
    assert len(plan_commits(JOB, [shard("a", "a-0", fits)])) == 1
    assert len(plan_commits(JOB, [shard("a", "a-0", [*fits, 500])])) == 2


def test_a_range_without_collection_data_is_one_empty_commit() -> None:
    (commit,) = plan_commits(JOB, [])
    assert commit.tables == ()
    assert commit.checkpoint.position == JOB.end

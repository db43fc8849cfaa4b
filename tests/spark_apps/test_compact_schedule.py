"""The compaction triggers (pure) and the client's wait decision."""

from __future__ import annotations

import pytest

from headrace import errors
from headrace.client.compacting import settled
from headrace.table.records import CompactionRequest, CompactionState
from spark_apps.compact_schedule import (
    Compact,
    CompactionPolicy,
    Failures,
    Hold,
    Selection,
    ShardState,
    after_failure,
    next_compaction,
)
from spark_apps.schedule import RetryPolicy

POLICY = CompactionPolicy(
    min_small_files=8, max_delete_ratio=0.2, max_small_file_age_s=600, max_input_files=100
)
NOW = 10_000.0


def state(**fields: object) -> ShardState:
    base: dict[str, object] = {
        "collection": "orders",
        "shard": 0,
        "files": 4,
        "small_files": 3,
        "live_rows": 1000,
        "deleted_rows": 0,
        "oldest_small_at_s": NOW - 10,
    }
    base.update(fields)
    return ShardState(**base)  # type: ignore[arg-type]


NO_FAILURES = Failures()


def decide(s: ShardState, failures: Failures = NO_FAILURES, mono: float = 0.0) -> Compact | Hold:
    return next_compaction(s, POLICY, failures, NOW, mono)


def test_a_shard_below_every_trigger_holds_and_says_each_measure() -> None:
    step = decide(state())
    assert isinstance(step, Hold)
    assert "3 small files (compacts at 8)" in step.reason
    assert "delete ratio 0.00 (at 0.2)" in step.reason
    assert "10s old" in step.reason


@pytest.mark.parametrize(
    ("fields", "selection", "why"),
    [
        ({"small_files": 8, "files": 9}, Selection.SMALL, "8 small files"),
        ({"deleted_rows": 250}, Selection.ALL, "delete ratio 0.25"),
        ({"oldest_small_at_s": NOW - 601}, Selection.SMALL, "the oldest 601s old"),
        ({"requested": True}, Selection.SMALL, "requested"),
    ],
)
def test_each_trigger_compacts(fields: dict[str, object], selection: Selection, why: str) -> None:
    step = decide(state(**fields))
    assert isinstance(step, Compact)
    assert step.selection is selection
    assert why in step.reason


def test_one_file_or_one_small_file_is_never_merged() -> None:
    assert isinstance(decide(state(files=1, small_files=1, deleted_rows=900)), Hold)
    old_single = state(small_files=1, oldest_small_at_s=NOW - 10_000)
    assert isinstance(decide(old_single), Hold)
    assert isinstance(decide(state(small_files=1, requested=True)), Hold)


def test_a_failure_backs_off_then_compacts_again() -> None:
    failures = after_failure(Failures(), errors.Unavailable("store down"), 100.0, RetryPolicy())
    assert failures.count == 1 and failures.retry_at == 101.0
    held = decide(state(small_files=9, files=9), failures, mono=100.5)
    assert isinstance(held, Hold) and held.until == 101.0 and "store down" in held.reason
    assert isinstance(decide(state(small_files=9, files=9), failures, mono=101.0), Compact)
    again = after_failure(failures, errors.Unavailable("still"), 101.0, RetryPolicy())
    assert again.retry_at == 103.0


def test_bad_policies_are_refused_naming_the_field() -> None:
    with pytest.raises(errors.InvalidArgument, match="small_file_bytes"):
        CompactionPolicy(target_file_bytes=10, small_file_bytes=20)
    with pytest.raises(errors.InvalidArgument, match="max_input_files"):
        CompactionPolicy(max_input_files=1)
    with pytest.raises(errors.InvalidArgument, match="max_delete_ratio"):
        CompactionPolicy(max_delete_ratio=0)


def request(
    rid: str, at: float, st: CompactionState = CompactionState.PENDING
) -> CompactionRequest:
    return CompactionRequest(collection="orders", request_id=rid, requested_at=at, state=st)


def test_the_wait_ends_on_done_follows_a_newer_request_and_reports_failure() -> None:
    mine = request("a", 10.0)
    assert settled(mine, request("a", 10.0)) is None
    done = request("a", 10.0, CompactionState.DONE)
    assert settled(mine, done) == done
    assert settled(mine, request("b", 11.0)) is None
    newer_done = request("b", 11.0, CompactionState.DONE)
    assert settled(mine, newer_done) == newer_done
    failed = settled(mine, request("a", 10.0, CompactionState.FAILED))
    assert isinstance(failed, errors.Unavailable)
    assert isinstance(settled(mine, None), errors.NotFound)
    assert isinstance(settled(mine, request("z", 9.0)), errors.NotFound)

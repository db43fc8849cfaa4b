"""The flush runner's decisions (pure: what to flush next and why it waits), and how a
runner whose Spark session cannot start reports it."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import headrace.wal.memory  # noqa: F401 - registers the memory: message ids
from headrace import errors
from headrace.cluster import Assignment, AssignmentState
from headrace.metastore.factory import open_metastore
from headrace.table.records import CheckpointRecord, SealRecord
from spark_apps.runner import FlushRunner, RunnerOptions
from spark_apps.schedule import (
    Attempts,
    Channel,
    Launch,
    Outcome,
    Result,
    RetryPolicy,
    Unreadable,
    Wait,
    after,
    backoff,
    is_poison,
    next_step,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

P = "pch-0"
POLICY = RetryPolicy(base_s=1.0, cap_s=8.0, poison_s=300.0)


def channel(
    seal: int | None = 20,
    checkpoint: int | None = 10,
    term: int = 3,
    state: AssignmentState = AssignmentState.ASSIGNED,
) -> Channel:
    return Channel(
        P,
        None if seal is None else SealRecord(pchannel=P, position=f"memory:{seal}", term=1),
        None
        if checkpoint is None
        else CheckpointRecord(pchannel=P, position=f"memory:{checkpoint}"),
        Assignment(pchannel=P, state=state, term=term, node="n1"),
    )


def test_a_seal_past_the_checkpoint_is_flushed_under_the_current_term() -> None:
    # The seal was written under term 1; the flush is launched under the Assignment's term.
    assert next_step(channel(), Attempts(), 0.0) == Launch(P, 3, "memory:10", "memory:20")
    assert next_step(channel(checkpoint=None), Attempts(), 0.0) == Launch(P, 3, "", "memory:20")


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (channel(seal=None), "no seal"),
        (channel(seal=10, checkpoint=10), "at or past the last seal"),
        (channel(seal=9, checkpoint=10), "at or past the last seal"),
        (channel(state=AssignmentState.UNASSIGNED), "no owner to flush under (UNASSIGNED)"),
        (channel(state=AssignmentState.UNAVAILABLE), "no owner"),
        (Channel(P, channel().seal, None, None), "no owner to flush under (no assignment)"),
    ],
)
def test_waits_say_why(state: Channel, reason: str) -> None:
    step = next_step(state, Attempts(), 0.0)
    assert isinstance(step, Wait)
    assert reason in step.reason
    assert step.until is None


def test_unassigning_and_assigning_owners_still_flush() -> None:
    for state in (AssignmentState.ASSIGNING, AssignmentState.UNASSIGNING):
        assert isinstance(next_step(channel(state=state), Attempts(), 0.0), Launch)


def failed(code: type[errors.HeadraceError], term: int = 3, **kw: object) -> Result:
    launch = Launch(P, term, "memory:10", "memory:20")
    return Result(launch, Outcome.FAILED, code("boom", **kw))  # type: ignore[arg-type]


def test_retryable_failures_back_off_exponentially_up_to_the_cap() -> None:
    history = Attempts()
    waits = []
    for now in (100.0, 200.0, 300.0, 400.0, 500.0):
        history = after(history, failed(errors.Unavailable), now, POLICY)
        waits.append(history.retry_at - now)
        step = next_step(channel(), history, now)
        assert isinstance(step, Wait) and step.until == history.retry_at
        assert "UNAVAILABLE" in step.reason
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0]
    assert isinstance(next_step(channel(), history, history.retry_at), Launch)
    # Success clears the history.
    ok = Result(Launch(P, 3, "memory:10", "memory:20"), Outcome.COMMITTED)
    assert after(history, ok, 600.0, POLICY) == Attempts()


def test_a_deadline_is_a_retryable_failure() -> None:
    timed_out = Result(Launch(P, 3, "", "memory:20"), Outcome.TIMED_OUT)
    history = after(Attempts(), timed_out, 10.0, POLICY)
    assert history.retry_at == 11.0
    assert "deadline" in history.last_error


@pytest.mark.parametrize(
    "error", [errors.InvalidArgument, errors.CorruptData, errors.NotFound, errors.Truncated]
)
def test_bad_data_backs_off_long(error: type[errors.HeadraceError]) -> None:
    result = failed(error)
    assert is_poison(result)
    history = after(Attempts(), result, 10.0, POLICY)
    assert history.retry_at == 310.0
    assert isinstance(next_step(channel(), history, 309.0), Wait)


def test_storage_full_and_conflict_are_retried() -> None:
    for error in (errors.StorageFull, errors.Conflict):
        result = failed(error)
        assert not is_poison(result)
        assert after(Attempts(), result, 10.0, POLICY).retry_at == 11.0


def test_fenced_waits_for_a_newer_term_and_never_reuses_the_refused_one() -> None:
    history = after(Attempts(), failed(errors.Fenced, term=3), 10.0, POLICY)
    step = next_step(channel(term=3), history, 10.0)
    assert isinstance(step, Wait) and "term 3 was fenced" in step.reason
    assert step.until is None
    # The new owner's term re-arms the pchannel at once.
    assert next_step(channel(term=4), history, 10.0) == Launch(P, 4, "memory:10", "memory:20")
    # A later success keeps the memory of the fenced term.
    ok = Result(Launch(P, 4, "memory:10", "memory:20"), Outcome.COMMITTED)
    assert after(history, ok, 11.0, POLICY).fenced_term == 3


def test_unreadable_records_wait_loudly_until_they_change() -> None:
    step = next_step(Unreadable(P, "CORRUPT: malformed SealRecord"), Attempts(), 0.0)
    assert isinstance(step, Wait)
    assert step.loud and step.until is None
    assert "cannot be read: CORRUPT" in step.reason


def test_a_poison_back_off_is_reported_loudly_a_transient_one_not() -> None:
    poisoned = after(Attempts(), failed(errors.CorruptData), 0.0, POLICY)
    step = next_step(channel(), poisoned, 1.0)
    assert isinstance(step, Wait) and step.loud
    transient = after(Attempts(), failed(errors.Unavailable), 0.0, POLICY)
    step = next_step(channel(), transient, 0.5)
    assert isinstance(step, Wait) and not step.loud


def test_backoff() -> None:
    assert [backoff(n, POLICY) for n in range(6)] == [1.0, 1.0, 2.0, 4.0, 8.0, 8.0]


async def test_a_session_that_cannot_start_is_a_retryable_failure(tmp_path: Path) -> None:
    """No JVM, a bad master: the flush fails UNAVAILABLE and backs off; the
    runner does not die (its supervisor would restart it in a loop)."""

    def no_java() -> SparkSession:
        raise RuntimeError("Java gateway process exited before sending its port number\nmore")

    metastore = await open_metastore(f"sqlite://{tmp_path}/meta.db")
    try:
        runner = FlushRunner(RunnerOptions(metastore.url, str(tmp_path)), no_java, metastore)
        result = await runner.flush(Launch(P, 3, "", "memory:20"), asyncio.Event())
    finally:
        await metastore.close()
    assert result.outcome is Outcome.FAILED
    assert isinstance(result.error, errors.Unavailable)
    assert "did not start: RuntimeError: Java gateway process exited" in str(result.error)
    assert "more" not in str(result.error)
    assert after(Attempts(), result, 0.0, POLICY).retry_at == 1.0

"""The flush and compaction run decisions (pure): what the operator records,
deletes and creates per pchannel, and why it waits."""

from __future__ import annotations

import dataclasses
import datetime

import headrace.wal.memory  # noqa: F401 - registers the memory: message ids
from headrace import tso
from headrace.cluster import Assignment, AssignmentState
from headrace.table.records import CheckpointRecord, SealRecord
from headrace_operator.events import Reason
from headrace_operator.flushplan import (
    PlanOptions,
    RunInputs,
    RunPlan,
    flush_health,
    flush_lag_s,
    plan_run,
)
from headrace_operator.models import FlushRunStatus, RunJob, RunPhase
from headrace_operator.sparkapps import AppView
from spark_apps.schedule import Channel, RetryPolicy, Unreadable

P = "pchannel-001"
T0 = 1_800_000_000.0
OPTIONS = PlanOptions(RetryPolicy(base_s=10, cap_s=80, poison_s=80), 60.0, 300.0)


def channel(seal: int = 20, checkpoint: int | None = 10, term: int = 3) -> Channel:
    return Channel(
        P,
        SealRecord(pchannel=P, position=f"memory:{seal}", term=1),
        None
        if checkpoint is None
        else CheckpointRecord(pchannel=P, position=f"memory:{checkpoint}"),
        Assignment(pchannel=P, state=AssignmentState.ASSIGNED, term=term, node="n1"),
    )


def app(
    name: str,
    phase: RunPhase,
    state: str,
    *,
    age: float = 5.0,
    message: str = "",
    code: int | None = None,
) -> AppView:
    created = datetime.datetime.fromtimestamp(T0 - age, datetime.UTC)
    return AppView(
        name=name,
        pchannel=P,
        job=RunJob.FLUSH,
        phase=phase,
        app_state=state,
        created=created,
        message=message,
        exit_code=code,
        term=3,
        start="memory:10",
        end="memory:20",
    )


def plan(
    previous: FlushRunStatus | None,
    apps: list[AppView],
    *,
    now: float = T0,
    ch: Channel | Unreadable | None = None,
    job: RunJob = RunJob.FLUSH,
) -> RunPlan:
    inputs = RunInputs(job, P, ch if ch is not None else channel(), previous, apps)
    return plan_run(inputs, now, OPTIONS, cluster="lake", nonce="n0")


def launched(name: str = "lake-flush-pchannel-001-old", age: float = 5.0) -> FlushRunStatus:
    created = datetime.datetime.fromtimestamp(T0 - age, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return FlushRunStatus(
        pchannel=P,
        job=RunJob.FLUSH,
        run=name,
        phase=RunPhase.PENDING,
        created=created,
        term=3,
        start="memory:10",
        end="memory:20",
    )


def test_a_seal_past_the_checkpoint_launches_a_flush_of_that_range() -> None:
    result = plan(None, [])
    assert result.create is not None
    assert (result.create.term, result.create.start, result.create.end) == (
        3,
        "memory:10",
        "memory:20",
    )
    assert result.status.run == "lake-flush-pchannel-001-n0"
    assert result.status.phase is RunPhase.PENDING


def test_nothing_to_flush_says_why() -> None:
    result = plan(None, [], ch=channel(seal=10, checkpoint=10))
    assert result.create is None
    assert "at or past the last seal" in result.status.waiting
    no_seal = plan_run(
        RunInputs(RunJob.FLUSH, P, None, None, []), T0, OPTIONS, cluster="c", nonce="n"
    )
    assert no_seal.create is None and no_seal.status.waiting == "no seal recorded yet"


def test_one_run_per_pchannel_while_the_last_is_running() -> None:
    running = app("lake-flush-pchannel-001-old", RunPhase.SUBMITTED, "SUBMITTED")
    result = plan(launched(), [running])
    assert result.create is None and result.delete == ()
    assert result.status.phase is RunPhase.SUBMITTED
    assert result.status.waiting == "run lake-flush-pchannel-001-old is SUBMITTED"


def test_a_completed_run_is_recorded_and_the_next_range_launched() -> None:
    done = app("lake-flush-pchannel-001-old", RunPhase.COMPLETED, "COMPLETED")
    result = plan(launched(), [done], ch=channel(seal=30, checkpoint=20))
    assert result.completed == 1 and result.failed == 0
    assert [n.reason for n in result.notes] == [Reason.SPARK_RUN_COMPLETED]
    assert result.create is not None and (result.create.start, result.create.end) == (
        "memory:20",
        "memory:30",
    )
    assert result.status.last_success and result.status.failures == 0


def test_a_failed_run_backs_off_then_retries() -> None:
    failed = app(
        "lake-flush-pchannel-001-old",
        RunPhase.FAILED,
        "FAILED",
        message="driver container failed with ExitCode: 5, Reason: Error",
        code=5,
    )
    result = plan(launched(), [failed])
    assert result.failed == 1 and result.create is None
    (note,) = result.notes
    assert note.reason is Reason.SPARK_RUN_FAILED and note.warning
    assert result.status.failures == 1 and result.status.retry_at
    assert "backing off after 1 failure" in result.status.waiting
    # Still backing off 5 s later; launched once the 10 s back-off passed.
    assert plan(result.status, [failed], now=T0 + 5).create is None
    again = plan(result.status, [failed], now=T0 + 11)
    assert again.create is not None and again.failed == 0, "an outcome is recorded once"
    # A second failure in a row doubles the back-off.
    second = plan(again.status, [app(again.status.run, RunPhase.FAILED, "FAILED")], now=T0 + 12)
    assert second.status.failures == 2
    assert plan(second.status, [], now=T0 + 12 + 15).create is None
    assert plan(second.status, [], now=T0 + 12 + 21).create is not None


def test_a_fenced_run_waits_for_a_newer_term() -> None:
    fenced = app("lake-flush-pchannel-001-old", RunPhase.FAILED, "FAILED", code=3)
    result = plan(launched(), [fenced])
    assert result.status.fenced_term == 3 and result.create is None
    assert "fenced" in result.status.waiting
    assert plan(result.status, [fenced], ch=channel(term=4)).create is not None


def test_a_run_hung_in_submitted_is_deleted_at_its_deadline_and_retried() -> None:
    hung = app("lake-flush-pchannel-001-old", RunPhase.SUBMITTED, "SUBMITTED", age=61)
    result = plan(launched(age=61), [hung])
    assert result.delete == ("lake-flush-pchannel-001-old",)
    assert [n.reason for n in result.notes] == [Reason.SPARK_RUN_TIMED_OUT]
    assert result.status.phase is RunPhase.TIMED_OUT and result.failed == 1
    assert "did not end within 60s (SUBMITTED)" in result.status.last_error
    retried = plan(result.status, [], now=T0 + 11)
    assert retried.create is not None


def test_a_run_deleted_by_hand_is_recorded_and_retried() -> None:
    result = plan(launched(), [])
    assert result.status.phase is RunPhase.VANISHED
    assert [n.reason for n in result.notes] == [Reason.SPARK_RUN_VANISHED]
    assert "deleted before it ended" in result.status.last_error


def test_a_run_the_status_does_not_know_is_adopted_not_duplicated() -> None:
    # The pass that created it could not write the status (operator restart).
    unknown = app("lake-flush-pchannel-001-new", RunPhase.RUNNING, "RUNNING", age=1)
    result = plan(
        launched(age=30),
        [unknown, app("lake-flush-pchannel-001-old", RunPhase.COMPLETED, "COMPLETED", age=30)],
    )
    assert result.create is None
    assert result.status.run == "lake-flush-pchannel-001-new"
    assert result.status.waiting.startswith("run lake-flush-pchannel-001-new")
    # Another run still active that the status does not name blocks a new one.
    stray = dataclasses.replace(
        unknown, name="stray", created=unknown.created - datetime.timedelta(seconds=100)
    )
    done = FlushRunStatus(
        pchannel=P,
        job=RunJob.FLUSH,
        run="gone",
        phase=RunPhase.COMPLETED,
        created="2030-01-01T00:00:00Z",
    )
    blocked = plan(done, [stray])
    assert blocked.create is None and "another run is active: stray" in blocked.status.waiting


def test_compaction_is_due_an_interval_after_the_last() -> None:
    first = plan(None, [], job=RunJob.COMPACT)
    assert first.create is not None and first.create.job is RunJob.COMPACT
    assert first.status.run == "lake-compact-pchannel-001-n0"
    done = dataclasses.replace(
        app(first.status.run, RunPhase.COMPLETED, "COMPLETED"), job=RunJob.COMPACT
    )
    after = plan(first.status, [done], job=RunJob.COMPACT)
    assert after.create is None and "next compaction is due" in after.status.waiting
    assert plan(after.status, [done], now=T0 + 301, job=RunJob.COMPACT).create is not None
    assert plan(None, [], ch=channel(checkpoint=None), job=RunJob.COMPACT).create is None


def test_lag_and_health() -> None:
    now = T0
    tick = tso.compose(int((now - 42) * 1000), 0)
    behind = Channel(
        P,
        SealRecord(pchannel=P, position="memory:20", timetick=tso.compose(int(now * 1000), 0)),
        CheckpointRecord(pchannel=P, position="memory:10", timetick=tick),
        None,
    )
    caught_up = Channel(
        "p2",
        SealRecord(pchannel="p2", position="memory:5"),
        CheckpointRecord(pchannel="p2", position="memory:5"),
        None,
    )
    assert flush_lag_s([behind, caught_up], now) == 42
    assert flush_lag_s([caught_up], now) == 0
    failing = FlushRunStatus(pchannel=P, job=RunJob.FLUSH, failures=2, last_error="boom")
    assert flush_health([failing], [], 0)[:2] == (False, "RunsFailing")
    assert flush_health([], ["no Spark operator"], 0)[:2] == (False, "FlushBlocked")
    assert flush_health([FlushRunStatus(pchannel=P, job=RunJob.FLUSH)], [], 3)[0] is True

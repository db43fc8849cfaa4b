"""Which flush and compaction runs to record, stop or start, per pchannel (pure).

For each pchannel and job (flush, compaction) :func:`plan_run` takes what the
metastore says (the last seal, the checkpoint and the Assignment, read as
:class:`spark_apps.schedule.Channel`), the run history kept in the
StreamingCluster's status (:class:`~.models.FlushRunStatus`) and the
SparkApplications of that pchannel and job, and decides, in order:

1. adopt a run the status does not name yet (its status write was lost);
2. if the last run has not ended: record its end when it completed or
   failed, delete it when it passed the deadline (it hangs, e.g. in
   SUBMITTED), record it as vanished when someone deleted it, else wait for it;
3. wait while any other run of the pchannel and job is still active (one run
   per pchannel and job at a time);
4. decide whether a new run is due. Flushes reuse the standalone runner's
   decisions (:func:`spark_apps.schedule.next_step` and
   :func:`spark_apps.schedule.after`: the range ``(checkpoint, seal]`` under
   the Assignment's term, back-off after failures, no run under a fenced term);
   compactions (:func:`compaction_step`) are due an interval after the last one.

Recorded outcomes become Events (:class:`Note`) and the retry history
(failures in a row, the time before which no run starts, the fenced term).
Every wait says why.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from headrace import errors, tso
from headrace_operator.events import Reason
from headrace_operator.models import (
    TERMINAL_PHASES,
    FlushRunStatus,
    FlushStatus,
    RunJob,
    RunPhase,
)
from headrace_operator.sparkapps import AppView, RunRequest, parse_time, run_name
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
    exit_error,
    next_step,
)


@dataclasses.dataclass(frozen=True, slots=True)
class PlanOptions:
    retry: RetryPolicy
    deadline_s: float
    compaction_interval_s: float


@dataclasses.dataclass(frozen=True, slots=True)
class Note:
    """An Event to record on the StreamingCluster."""

    reason: Reason
    message: str
    warning: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RunPlan:
    """What to do about one pchannel's job, and its status afterwards."""

    status: FlushRunStatus
    create: RunRequest | None = None
    delete: tuple[str, ...] = ()
    notes: tuple[Note, ...] = ()
    completed: int = 0
    failed: int = 0


def _stamp(value: float) -> str:
    moment = datetime.datetime.fromtimestamp(value, datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _epoch(text: str) -> float:
    moment = parse_time(text) if text else None
    return 0.0 if moment is None else moment.timestamp()


def attempts_of(status: FlushRunStatus) -> Attempts:
    """The retry history kept in the status, as the scheduler's value."""
    return Attempts(
        failures=status.failures,
        retry_at=_epoch(status.retry_at),
        fenced_term=status.fenced_term,
        last_error=status.last_error,
        poisoned=status.poisoned,
    )


def _with_attempts(status: FlushRunStatus, attempts: Attempts) -> FlushRunStatus:
    return status.model_copy(
        update={
            "failures": attempts.failures,
            "retry_at": _stamp(attempts.retry_at) if attempts.retry_at else "",
            "fenced_term": attempts.fenced_term,
            "last_error": attempts.last_error[:4096],
            "poisoned": attempts.poisoned,
        }
    )


def compaction_step(
    channel: Channel | Unreadable | None,
    attempts: Attempts,
    last_success: float,
    now: float,
    interval_s: float,
) -> Launch | Wait:
    """Whether a compaction run of the pchannel is due: something was flushed,
    no back-off holds, and ``interval_s`` passed since the last one completed."""
    if channel is None:
        return Wait("", "no seal recorded yet")
    if isinstance(channel, Unreadable):
        return Wait(channel.pchannel, f"its records cannot be read: {channel.error}", loud=True)
    p = channel.pchannel
    if channel.checkpoint is None:
        return Wait(p, "nothing flushed yet")
    if now < attempts.retry_at:
        return Wait(
            p,
            f"backing off after {attempts.failures} failure(s): {attempts.last_error}",
            until=attempts.retry_at,
            loud=attempts.poisoned,
        )
    if last_success and now < last_success + interval_s:
        due = last_success + interval_s
        return Wait(p, f"the next compaction is due at {_stamp(due)}", until=due)
    term = channel.assignment.term if channel.assignment is not None else 0
    return Launch(p, term, "", channel.checkpoint.position)


def _adopt(status: FlushRunStatus, apps: Sequence[AppView]) -> FlushRunStatus:
    """Name the newest run in the status when the status does not know it."""
    if not apps:
        return status
    newest = max(apps, key=lambda a: (a.created, a.name))
    if newest.name == status.run or newest.created.timestamp() < _epoch(status.created):
        return status
    return status.model_copy(
        update={
            "run": newest.name,
            "phase": RunPhase.PENDING,
            "app_state": newest.app_state,
            "created": _stamp(newest.created.timestamp()),
            "term": newest.term,
            "start": newest.start,
            "end": newest.end,
        }
    )


def _result(
    status: FlushRunStatus, phase: RunPhase, app: AppView | None, deadline: float
) -> Result:
    launch = Launch(status.pchannel, status.term, status.start, status.end)
    if phase is RunPhase.COMPLETED:
        return Result(launch, Outcome.COMMITTED)
    if phase is RunPhase.TIMED_OUT:
        state = app.app_state if app is not None and app.app_state else "no state"
        error = errors.Unavailable(
            f"run {status.run} did not end within {deadline:g}s ({state}); deleted"
        )
        return Result(launch, Outcome.TIMED_OUT, error)
    if phase is RunPhase.VANISHED:
        error = errors.Unavailable(f"run {status.run} was deleted before it ended")
        return Result(launch, Outcome.FAILED, error)
    message = app.message if app is not None and app.message else "no message"
    code = app.exit_code if app is not None and app.exit_code is not None else 1
    state = app.app_state if app is not None else ""
    return Result(launch, Outcome.FAILED, exit_error(code, f"run {status.run} {state}: {message}"))


_NOTES = {
    RunPhase.COMPLETED: Reason.SPARK_RUN_COMPLETED,
    RunPhase.FAILED: Reason.SPARK_RUN_FAILED,
    RunPhase.TIMED_OUT: Reason.SPARK_RUN_TIMED_OUT,
    RunPhase.VANISHED: Reason.SPARK_RUN_VANISHED,
}


def _ended(
    status: FlushRunStatus, app: AppView | None, now: float, options: PlanOptions
) -> tuple[RunPhase, bool] | None:
    """How the last run ended (and whether to delete it), None while it runs."""
    if app is None:
        return RunPhase.VANISHED, False
    if app.phase in (RunPhase.COMPLETED, RunPhase.FAILED):
        return app.phase, False
    if now - app.created.timestamp() > options.deadline_s:
        return RunPhase.TIMED_OUT, True
    return None


def _record(
    status: FlushRunStatus,
    phase: RunPhase,
    app: AppView | None,
    now: float,
    options: PlanOptions,
) -> tuple[FlushRunStatus, Note]:
    result = _result(status, phase, app, options.deadline_s)
    history = after(attempts_of(status), result, now, options.retry)
    recorded = _with_attempts(status, history).model_copy(
        update={"phase": phase, "app_state": app.app_state if app is not None else ""}
    )
    what = f"{status.job.value} run {status.run} of {status.pchannel}"
    if phase is RunPhase.COMPLETED:
        recorded = recorded.model_copy(update={"last_success": _stamp(now)})
        span = (
            f" ({status.start or 'beginning'}, {status.end}]" if status.job is RunJob.FLUSH else ""
        )
        return recorded, Note(_NOTES[phase], f"{what} completed{span}")
    retry = f"; retrying after {_stamp(history.retry_at)}" if history.retry_at > now else ""
    return recorded, Note(_NOTES[phase], f"{what}: {history.last_error}{retry}", warning=True)


def _next(
    job: RunJob,
    channel: Channel | Unreadable | None,
    status: FlushRunStatus,
    now: float,
    options: PlanOptions,
) -> Launch | Wait:
    attempts = attempts_of(status)
    if job is RunJob.COMPACT:
        return compaction_step(
            channel, attempts, _epoch(status.last_success), now, options.compaction_interval_s
        )
    if channel is None:
        return Wait(status.pchannel, "no seal recorded yet")
    return next_step(channel, attempts, now)


@dataclasses.dataclass(frozen=True, slots=True)
class RunInputs:
    """What one pchannel's job is planned from."""

    job: RunJob
    pchannel: str
    channel: Channel | Unreadable | None
    """The metastore's records (None: no seal recorded)."""
    previous: FlushRunStatus | None
    """Its status from the last pass (None: never planned)."""
    apps: Sequence[AppView]
    """Its SparkApplications."""


def plan_run(
    inputs: RunInputs, now: float, options: PlanOptions, *, cluster: str, nonce: str
) -> RunPlan:
    """The plan of one pchannel's job this pass (see the module's order)."""
    job, pchannel, channel, apps = inputs.job, inputs.pchannel, inputs.channel, inputs.apps
    status = _adopt(inputs.previous or FlushRunStatus(pchannel=pchannel, job=job), apps)
    by_name = {a.name: a for a in apps}
    notes: list[Note] = []
    delete: list[str] = []
    completed = failed = 0
    if status.run and status.phase not in TERMINAL_PHASES:
        app = by_name.get(status.run)
        ended = _ended(status, app, now, options)
        if ended is None:
            assert app is not None
            running = status.model_copy(
                update={
                    "phase": app.phase,
                    "app_state": app.app_state,
                    "waiting": f"run {app.name} is {app.app_state or app.phase.value}",
                }
            )
            return RunPlan(running)
        phase, remove = ended
        if remove:
            delete.append(status.run)
        status, note = _record(status, phase, app, now, options)
        notes.append(note)
        completed, failed = (1, 0) if phase is RunPhase.COMPLETED else (0, 1)
    others = [
        a
        for a in apps
        if a.name != status.run and a.phase not in TERMINAL_PHASES and not a.deleting
    ]
    for other in others:
        if now - other.created.timestamp() > options.deadline_s:
            delete.append(other.name)
    if others:
        waiting = f"another run is active: {', '.join(sorted(a.name for a in others))}"
        return RunPlan(
            status.model_copy(update={"waiting": waiting}),
            delete=tuple(delete),
            notes=tuple(notes),
            completed=completed,
            failed=failed,
        )
    step = _next(job, channel, status, now, options)
    if isinstance(step, Wait):
        return RunPlan(
            status.model_copy(update={"waiting": step.reason}),
            delete=tuple(delete),
            notes=tuple(notes),
            completed=completed,
            failed=failed,
        )
    request = RunRequest(job, pchannel, step.term, step.start, step.end, nonce)
    launched = status.model_copy(
        update={
            "run": run_name(cluster, job, pchannel, nonce),
            "phase": RunPhase.PENDING,
            "app_state": "",
            "created": _stamp(now),
            "term": step.term,
            "start": step.start,
            "end": step.end,
            "waiting": "",
        }
    )
    return RunPlan(launched, request, tuple(delete), tuple(notes), completed, failed)


def flush_lag_s(channels: Sequence[Channel | Unreadable], now: float) -> int:
    """Seconds the oldest sealed data not yet flushed has waited: per pchannel
    whose last seal is past its checkpoint, from the checkpoint's timetick (or
    the seal's, before the first flush) to ``now``; 0 when all are flushed."""
    worst = 0.0
    for channel in channels:
        if isinstance(channel, Unreadable) or channel.seal is None:
            continue
        checkpoint, seal = channel.checkpoint, channel.seal
        if checkpoint is not None and not checkpoint.position_id() < seal.position_id():
            continue
        base = checkpoint.timetick if checkpoint is not None and checkpoint.timetick else 0
        base = base or seal.timetick
        if base:
            worst = max(worst, now - tso.physical_ms(base) / 1000.0)
    return int(worst)


@dataclasses.dataclass(frozen=True, slots=True)
class FlushReport:
    """The flush part of a cluster's status and its ``FlushHealthy`` condition."""

    status: FlushStatus | None
    """None: the cluster has no flush section (status and condition go)."""
    healthy: bool = True
    reason: str = ""
    message: str = ""


def flush_health(
    runs: Sequence[FlushRunStatus], problems: Sequence[str], lag_s: int
) -> tuple[bool, str, str]:
    """``FlushHealthy``: (status, reason, message) (pure). ``problems``: why
    no run can be launched at all (no Spark operator, unreadable records)."""
    if problems:
        return False, "FlushBlocked", "; ".join(problems)
    failing = [r for r in runs if r.failures > 0]
    if failing:
        message = "; ".join(
            f"{r.job.value} {r.pchannel}: {r.failures} failed run(s) in a row, last: {r.last_error}"
            for r in failing
        )
        return False, "RunsFailing", message
    active = sum(1 for r in runs if r.run and r.phase not in TERMINAL_PHASES)
    return True, "RunsSucceeding", f"{active} run(s) in flight; flush lag {lag_s}s"

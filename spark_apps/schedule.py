"""What the flush runner does next, and why it waits (pure).

For each pchannel the runner reads three records (the last seal, the
checkpoint, the Assignment) and the history of its own attempts; it launches
a flush of ``(checkpoint, seal]`` under the Assignment's current term, or
waits, saying why. After an attempt, :func:`after` gives the new history:
success clears it; FENCED remembers the refused term (no flush is launched
under it again: only a newer term in the Assignment re-arms the pchannel);
retryable failures and deadlines back off exponentially; bad data
(INVALID_ARGUMENT, CORRUPT, TRUNCATED, NOT_FOUND) backs off long, so a poison
range is retried rarely and loudly instead of in a hot loop.
"""

from __future__ import annotations

import dataclasses
import enum

from headrace import errors
from headrace.cluster import ACTIVE_STATES, Assignment
from headrace.table.records import CheckpointRecord, SealRecord

POISON_CODES = frozenset(
    {
        errors.ErrorCode.INVALID_ARGUMENT,
        errors.ErrorCode.CORRUPT,
        errors.ErrorCode.TRUNCATED,
        errors.ErrorCode.NOT_FOUND,
        errors.ErrorCode.TOO_LARGE,
    }
)
"""Errors that say the range itself (or its input) is bad: retrying soon
gives the same error."""

EXIT_CODES = {
    errors.ErrorCode.INVALID_ARGUMENT: 2,
    errors.ErrorCode.CORRUPT: 2,
    errors.ErrorCode.TRUNCATED: 2,
    errors.ErrorCode.NOT_FOUND: 2,
    errors.ErrorCode.FENCED: 3,
    errors.ErrorCode.CONFLICT: 4,
    errors.ErrorCode.UNAVAILABLE: 5,
    errors.ErrorCode.STORAGE_FULL: 5,
}
"""The flush job's exit status per error (``python -m spark_apps.flush``); 1
for anything else."""


def exit_error(status: int, message: str) -> errors.HeadraceError:
    """The error a flush job that exited with ``status`` reported, as the
    launcher sees it (a job run elsewhere, e.g. a SparkApplication's driver):
    2 bad data, 3 FENCED, 4 CONFLICT; anything else is retryable UNAVAILABLE."""
    if status == 2:
        return errors.InvalidArgument(message)
    if status == 3:
        return errors.Fenced(message)
    if status == 4:
        return errors.Conflict(message)
    return errors.Unavailable(message)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    base_s: float = 1.0
    """First back-off after a retryable failure; doubled per failure in a row."""
    cap_s: float = 60.0
    poison_s: float = 300.0
    """Back-off after bad data (INVALID_ARGUMENT, CORRUPT, ...)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Channel:
    """What the metastore says about one pchannel."""

    pchannel: str
    seal: SealRecord | None
    checkpoint: CheckpointRecord | None
    assignment: Assignment | None


@dataclasses.dataclass(frozen=True, slots=True)
class Unreadable:
    """A pchannel whose records do not decode (a malformed record, a position
    of an unknown backend): nothing is flushed until they do."""

    pchannel: str
    error: str


@dataclasses.dataclass(frozen=True, slots=True)
class Attempts:
    """The runner's history of one pchannel since its last success."""

    failures: int = 0
    """Failed attempts in a row."""
    retry_at: float = 0.0
    """Monotonic time before which no flush is launched."""
    fenced_term: int = 0
    """The last term a flush was refused under (FENCED)."""
    last_error: str = ""
    poisoned: bool = False
    """The last failure was bad data (long back-off)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Launch:
    """Flush ``(start, end]`` of ``pchannel`` under ``term``."""

    pchannel: str
    term: int
    start: str
    """The checkpoint (exclusive); empty for the beginning of the log."""
    end: str
    """The last seal (inclusive)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Wait:
    pchannel: str
    reason: str
    until: float | None = None
    """Monotonic time the wait ends by itself; None: until a record changes."""
    loud: bool = False
    """Something is wrong that an operator must fix (reported as an error)."""


Step = Launch | Wait


def next_step(channel: Channel | Unreadable, attempts: Attempts, now: float) -> Step:
    """Whether to flush the pchannel now, and which range under which term."""
    p = channel.pchannel
    if isinstance(channel, Unreadable):
        return Wait(p, f"its records cannot be read: {channel.error}", loud=True)
    seal, checkpoint, assignment = channel.seal, channel.checkpoint, channel.assignment
    if seal is None:
        return Wait(p, "no seal recorded yet")
    if checkpoint is not None and not checkpoint.position_id() < seal.position_id():
        return Wait(
            p, f"the checkpoint {checkpoint.position} is at or past the last seal {seal.position}"
        )
    if assignment is None or assignment.state not in ACTIVE_STATES:
        state = "no assignment" if assignment is None else assignment.state.value
        return Wait(p, f"no owner to flush under ({state})")
    if assignment.term <= attempts.fenced_term:
        return Wait(
            p,
            f"a flush under term {attempts.fenced_term} was fenced; waiting for the "
            f"assignment to name a newer term (now {assignment.term})",
        )
    if now < attempts.retry_at:
        return Wait(
            p,
            f"backing off after {attempts.failures} failure(s): {attempts.last_error}",
            until=attempts.retry_at,
            loud=attempts.poisoned,
        )
    return Launch(p, assignment.term, checkpoint.position if checkpoint else "", seal.position)


class Outcome(enum.Enum):
    COMMITTED = "COMMITTED"
    FAILED = "FAILED"
    TIMED_OUT = "TIMED_OUT"


@dataclasses.dataclass(frozen=True, slots=True)
class Result:
    """How one launched flush ended."""

    launch: Launch
    outcome: Outcome
    error: errors.HeadraceError | None = None


def after(attempts: Attempts, result: Result, now: float, policy: RetryPolicy) -> Attempts:
    """The pchannel's history once ``result`` is known."""
    if result.outcome is Outcome.COMMITTED:
        return Attempts(fenced_term=attempts.fenced_term)
    error = result.error
    failures = attempts.failures + 1
    if result.outcome is Outcome.TIMED_OUT or error is None:
        why = "the flush passed its deadline" if error is None else str(error)
        return Attempts(failures, now + backoff(failures, policy), attempts.fenced_term, why)
    if error.code is errors.ErrorCode.FENCED:
        return Attempts(0, now, max(attempts.fenced_term, result.launch.term), str(error))
    if error.code in POISON_CODES:
        return Attempts(failures, now + policy.poison_s, attempts.fenced_term, str(error), True)
    return Attempts(failures, now + backoff(failures, policy), attempts.fenced_term, str(error))


def backoff(failures: int, policy: RetryPolicy) -> float:
    """Seconds to wait after ``failures`` retryable failures in a row."""
    return float(min(policy.base_s * 2 ** max(failures - 1, 0), policy.cap_s))


def is_poison(result: Result) -> bool:
    """Whether the failure is one to report loudly (bad data, not a transient)."""
    return result.error is not None and result.error.code in POISON_CODES

"""What a reconcile step reports, and what a pass made of it (immutable values).

A step returns a :class:`StepResult`: :data:`DONE`, waiting on something
(:func:`waiting_on`), failed (:func:`failed`: why, whether a retry can help, and
which condition it degrades), or halting the pass (:func:`halted`).
:class:`PassResult` holds a pass's results in step order; the first one that is
not done decides what follows the pass.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping, Sequence
from typing import Any


class Halt(enum.Enum):
    """Why a pass ends before its last step."""

    PAUSED = "paused"
    """The pause annotation: no object is changed and the last status stays."""
    INVALID_SPEC = "invalid-spec"
    STANDBY = "standby"
    """Another operator replica reconciles the cluster: nothing is written."""
    BLOCKED = "blocked"
    """An UpgradePlan's safety gate holds it (the reason says which)."""
    PLANNED = "planned"
    """An UpgradePlan's dry run: the plan is shown, nothing is changed."""
    FINISHED = "finished"
    """An UpgradePlan that succeeded: nothing more is done."""


class FailureKind(enum.Enum):
    STEP = "step"
    """A step could not do its work (``ReconcileFailed``)."""
    BACKEND = "backend"
    """The metastore or the WAL backend cannot be reached (``BackendUnreachable``)."""
    COORDINATOR = "coordinator"
    """The in-process coordinator cannot run (``CoordinatorFailed``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    kind: FailureKind
    message: str
    retryable: bool


@dataclasses.dataclass(frozen=True, slots=True)
class StepResult:
    """What one step reports; :data:`DONE` when it has nothing to report."""

    waiting: tuple[str, ...] = ()
    """What is under way or awaited (``Progressing``)."""
    failures: tuple[Failure, ...] = ()
    halt: Halt | None = None
    reason: str = ""
    """Why the pass halts."""

    @property
    def done(self) -> bool:
        return not (self.waiting or self.failures or self.halt)


DONE = StepResult()


def waiting_on(*what: str) -> StepResult:
    return StepResult(waiting=tuple(what))


def failed(message: str, *, retryable: bool, kind: FailureKind = FailureKind.STEP) -> StepResult:
    return StepResult(failures=(Failure(kind, message, retryable),))


def halted(halt: Halt, reason: str) -> StepResult:
    return StepResult(halt=halt, reason=reason)


def combine(results: Sequence[StepResult]) -> StepResult:
    """The results of the parts of one step, as one (the first halt wins)."""
    halt = next((r for r in results if r.halt is not None), None)
    return StepResult(
        waiting=tuple(w for r in results for w in r.waiting),
        failures=tuple(f for r in results for f in r.failures),
        halt=None if halt is None else halt.halt,
        reason="" if halt is None else halt.reason,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class PassResult:
    """The results of one pass's steps, in order, and the status it wrote."""

    steps: tuple[tuple[str, StepResult], ...]
    status: Mapping[str, Any] | None = None
    """None when nothing was written (a standby)."""

    @property
    def decision(self) -> tuple[str, StepResult] | None:
        """The first step whose result is not done: it decides what follows
        the pass (a retry, a wait, a halt); None when every step is done."""
        return next(((name, r) for name, r in self.steps if not r.done), None)

    @property
    def halt(self) -> Halt | None:
        return next((r.halt for _, r in self.steps if r.halt is not None), None)

    @property
    def halt_reason(self) -> str:
        return next((r.reason for _, r in self.steps if r.halt is not None), "")

    @property
    def paused(self) -> bool:
        return self.halt is Halt.PAUSED

    @property
    def waiting(self) -> tuple[str, ...]:
        return tuple(w for _, r in self.steps for w in r.waiting)

    def failures_of(self, kind: FailureKind) -> tuple[str, ...]:
        return tuple(f.message for _, r in self.steps for f in r.failures if f.kind is kind)

    @property
    def failures(self) -> tuple[str, ...]:
        """Steps that failed, ``"<step>: <why>"`` each."""
        return tuple(
            f"{name}: {f.message}"
            for name, r in self.steps
            for f in r.failures
            if f.kind is FailureKind.STEP
        )

    @property
    def retryable(self) -> bool:
        """A failure happened that a retry soon may clear."""
        return any(f.retryable for _, r in self.steps for f in r.failures)

    @property
    def retry_reason(self) -> str:
        """Why the pass should run again soon rather than at the next resync:
        the deciding result is a failure a retry may clear ("" otherwise)."""
        decision = self.decision
        if decision is None:
            return ""
        name, result = decision
        retryable = [f.message for f in result.failures if f.retryable]
        return f"{name}: {'; '.join(retryable)}" if retryable else ""

    @property
    def completed(self) -> bool:
        """Every step ran and none failed (``observedGeneration`` may advance)."""
        return self.halt is None and not any(r.failures for _, r in self.steps)

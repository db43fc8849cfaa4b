"""The flush step of an Offline UpgradePlan, as pure functions of what is observed.

With a ``flush`` section on the StreamingCluster (the operator runs flushes as
SparkApplications, :mod:`.flush_steps`), once writes are stopped, no append is
in flight, every node is frozen and no pchannel moves, the plan asks for a
flush of every collection (flush requests pass the write stop) and records per
pchannel the acknowledged request in ``status.flush``
(:class:`~.models.UpgradeFlush`). It then waits until every pchannel's
checkpoint is at or past its request (:func:`headrace.client.flushing.progress`)
before it stops the nodes: everything acknowledged is then in the tables, not
only in the WALs.

The recorded targets are the one thing a later pass takes from the status: an
operator restarted mid-plan waits on the same requests instead of asking
anew. Everything else (the checkpoints, whether each target is reached, when
all were) is observed again each pass. A flush that does not finish within
``flushTimeoutSeconds`` of its request makes the plan Blocked (see
:func:`overdue`); the writes stay stopped.

Without a flush section there is nothing to flush into: the step is Skipped
(:data:`FLUSH_SKIPPED`); the WALs, drained and fenced, keep every acknowledged
message across the restart.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from headrace import errors
from headrace.client.flushing import FlushProgress, FlushRequested
from headrace.message import ids
from headrace.message.ids import MessageID
from headrace.table.records import CheckpointRecord
from headrace_operator.models import ConditionType, FlushTarget, UpgradeFlush

FLUSH_SKIPPED = (
    "no flush configured (the StreamingCluster has no spec.flush): nothing is flushed; "
    "the WALs, drained and fenced, keep every acknowledged message across the restart"
)
ROLLED_BACK_UNFLUSHED = (
    "not finished: the plan went on without it (rolled back, or the flush section came "
    "after this step) before every checkpoint reached a flush request"
)


class FlushNext(enum.Enum):
    """What the flush step does now."""

    PROCEED = "proceed"
    """Nothing (more) to flush: no flush section, or every target reached."""
    REQUEST = "request"
    """Request a flush of every collection and record the targets."""
    WAIT = "wait"
    """Wait until every checkpoint reaches its target."""


@dataclasses.dataclass(frozen=True, slots=True)
class FlushFacts:
    """What one pass observed about the flush."""

    configured: bool = False
    """The StreamingCluster has a flush section."""
    record: UpgradeFlush | None = None
    """The request recorded in the plan's status (None: not requested yet)."""
    progress: FlushProgress | None = None
    """The checkpoints against the recorded targets (None: not read)."""
    unreadable: str = ""
    """Why the checkpoints could not be compared with the targets ("" when they could)."""
    runs: str = ""
    """What the cluster's ``FlushHealthy`` condition says when it is False."""

    @property
    def done(self) -> bool:
        """Every checkpoint reached its target, now or when last seen
        (checkpoints only move forward)."""
        if self.record is None:
            return False
        return bool(self.record.done) or (self.progress is not None and self.progress.done)


@dataclasses.dataclass(frozen=True, slots=True)
class FlushStep:
    next: FlushNext
    why: str = ""


def next_flush(f: FlushFacts) -> FlushStep:
    """What the flush step does now (see the module docstring)."""
    if not f.configured or f.done:
        return FlushStep(FlushNext.PROCEED)
    if f.record is None:
        return FlushStep(FlushNext.REQUEST, "requesting a flush of every collection")
    runs = f" (the cluster's flush runs: {f.runs})" if f.runs else ""
    if f.unreadable or f.progress is None:
        problem = f.unreadable or "checkpoints not read"
        return FlushStep(FlushNext.WAIT, f"waiting on the flush: {problem}{runs}")
    behind = ", ".join(b.pchannel for b in f.progress.behind)
    return FlushStep(
        FlushNext.WAIT,
        f"waiting on {behind} to flush up to the plan's request: {f.progress.reason()}{runs}",
    )


def step_outcome(f: FlushFacts) -> tuple[bool, str]:
    """Once the plan is past the flush step: (done, message); not done is
    Skipped (no flush section, or rolled back before it finished)."""
    if not f.configured:
        return False, FLUSH_SKIPPED
    if f.done and f.record is not None:
        return True, done_message(f.record)
    return False, ROLLED_BACK_UNFLUSHED


def done_message(record: UpgradeFlush) -> str:
    if not record.pchannels:
        return f"{record.collections} collection(s), nothing to flush"
    at = ", ".join(f"{t.pchannel} at {t.checkpoint}" for t in record.pchannels)
    return (
        f"flushed {record.collections} collection(s): every checkpoint reached the plan's "
        f"flush request ({at})"
    )


def requested_why(record: UpgradeFlush) -> str:
    """What the step says right after its request."""
    pchannels = ", ".join(t.pchannel for t in record.pchannels) or "none"
    return (
        f"flush of {record.collections} collection(s) requested; waiting until the "
        f"checkpoints reach it: {pchannels}"
    )


def new_record(requested: FlushRequested, now: str) -> UpgradeFlush:
    """The status record of a flush just requested."""
    return UpgradeFlush(
        requested=now,
        collections=len(requested.collections),
        pchannels=[
            FlushTarget(pchannel=pchannel, target=str(target))
            for pchannel, target in sorted(requested.targets.items())
        ],
        done=now if not requested.targets else "",
    )


def recorded_targets(record: UpgradeFlush) -> tuple[dict[str, MessageID], str]:
    """The recorded targets parsed, and why they cannot be ("" when they can:
    a status edited by hand into something else is requested anew)."""
    targets: dict[str, MessageID] = {}
    for item in record.pchannels:
        try:
            targets[item.pchannel] = ids.parse(item.target)
        except errors.HeadraceError as exc:
            return {}, f"status.flush: target of {item.pchannel}: {exc.message}"
    return targets, ""


def observed_record(
    record: UpgradeFlush,
    checkpoints: Mapping[str, CheckpointRecord | None],
    progress: FlushProgress,
    now: str,
) -> UpgradeFlush:
    """``record`` with each pchannel's checkpoint and whether it reached its
    target as observed now; ``done`` set when first seen complete."""
    behind = {b.pchannel for b in progress.behind}
    pchannels = []
    for item in record.pchannels:
        checkpoint = checkpoints.get(item.pchannel)
        pchannels.append(
            item.model_copy(
                update={
                    "checkpoint": checkpoint.position if checkpoint is not None else "",
                    "reached": item.pchannel not in behind,
                }
            )
        )
    done = record.done or (now if progress.done else "")
    return record.model_copy(update={"pchannels": pchannels, "done": done})


def previous_record(status: Mapping[str, Any]) -> tuple[UpgradeFlush | None, str]:
    """The flush recorded in a plan's status (None when there is none) and why
    it does not parse ("" when it does)."""
    raw = status.get("flush")
    if not raw:
        return None, ""
    try:
        return UpgradeFlush.model_validate(raw), ""
    except ValueError as exc:
        return None, f"status.flush does not parse: {exc}"


def runs_problem(cluster: Mapping[str, Any] | None) -> str:
    """What the cluster's ``FlushHealthy`` condition says when it is False ("" otherwise)."""
    conditions = ((cluster or {}).get("status") or {}).get("conditions") or []
    for item in conditions:
        if item.get("type") == ConditionType.FLUSH_HEALTHY.value and item.get("status") == "False":
            return f"{item.get('reason', '')}: {item.get('message', '')}".strip(": ")
    return ""

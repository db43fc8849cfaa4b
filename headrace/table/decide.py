"""Whether a flush may commit: a pure decision on what the metastore holds.

:func:`decide` looks at the pchannel's Assignment and its current checkpoint
and says, with the reason, one of:

* :class:`AlreadyCommitted`: the checkpoint was written by this very flush
  (same WAL range, same position): a retry after a crash that hit after the
  commit. Nothing is to be done, whatever the term is now.
* :class:`Refused`: the commit can never succeed: the pchannel moved to another
  term (FENCED, naming both terms), another flush moved the checkpoint
  (CONFLICT, naming both positions) or recorded one of its segments (CONFLICT).
* :class:`Proceed`: stage the table commits and try the transaction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection

from headrace import errors
from headrace.cluster import ACTIVE_STATES, Assignment
from headrace.message import ids
from headrace.table.records import CheckpointRecord, FlushCommit


@dataclasses.dataclass(frozen=True, slots=True)
class Proceed:
    node: str
    """The owner named by the Assignment, recorded in segments and checkpoint."""


@dataclasses.dataclass(frozen=True, slots=True)
class AlreadyCommitted:
    checkpoint: CheckpointRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Refused:
    error: errors.HeadraceError


Decision = Proceed | AlreadyCommitted | Refused


def decide(
    commit: FlushCommit,
    assignment: Assignment | None,
    checkpoint: CheckpointRecord | None,
    recorded_segments: Collection[int] = (),
) -> Decision:
    """``recorded_segments``: ids of this flush's segments that already have a record."""
    if checkpoint is not None and _same_flush(commit, checkpoint):
        return AlreadyCommitted(checkpoint)
    owner = _owner(commit, assignment)
    if isinstance(owner, errors.Fenced):
        return Refused(owner)
    current = "" if checkpoint is None else checkpoint.position
    if not _same_position(current, commit.wal_range.start):
        return Refused(errors.Conflict(_moved(commit, checkpoint)))
    if recorded_segments:
        return Refused(
            errors.Conflict(
                f"{commit.pchannel}: segments {sorted(recorded_segments)} are already recorded "
                "by an earlier flush; a segment is flushed once"
            )
        )
    return Proceed(owner)


def _moved(commit: FlushCommit, checkpoint: CheckpointRecord | None) -> str:
    """Why a flush that does not start at the checkpoint cannot commit."""
    start = commit.wal_range.start or "the beginning"
    if checkpoint is None:
        return (
            f"{commit.pchannel}: no checkpoint yet but this flush starts at {start}: "
            "it must start at the beginning"
        )
    written = (
        f"(written by the flush of ({checkpoint.flush_start or 'beginning'}, "
        f"{checkpoint.flush_end}] under term {checkpoint.term})"
    )
    if not ids.parse(checkpoint.position) < ids.parse(commit.wal_range.end):
        return (
            f"{commit.pchannel}: the checkpoint is at {checkpoint.position} {written}, "
            f"which already covers this flush's range ({start}, {commit.wal_range.end}]: "
            "another flush committed it first; nothing to commit"
        )
    return (
        f"{commit.pchannel}: the checkpoint is at {checkpoint.position} {written} but this "
        f"flush starts at {start}: another flush committed first"
    )


def _same_flush(commit: FlushCommit, checkpoint: CheckpointRecord) -> bool:
    return (
        _same_position(checkpoint.flush_start, commit.wal_range.start)
        and _same_position(checkpoint.flush_end, commit.wal_range.end)
        and _same_position(checkpoint.position, commit.checkpoint.position)
    )


def _same_position(a: str, b: str) -> bool:
    if not a or not b:
        return a == b
    return ids.parse(a) == ids.parse(b)


def _owner(commit: FlushCommit, assignment: Assignment | None) -> str | errors.Fenced:
    """The owning node if the pchannel is still under the launch term."""
    if assignment is None:
        return errors.Fenced(
            f"{commit.pchannel}: flush launched under term {commit.launch_term} but the "
            "pchannel has no assignment record",
            term=commit.launch_term,
        )
    if assignment.term != commit.launch_term or assignment.state not in ACTIVE_STATES:
        return errors.Fenced(
            f"{commit.pchannel}: flush launched under term {commit.launch_term} but the "
            f"pchannel is now under term {assignment.term} ({assignment.state.value}"
            f"{' on ' + assignment.node if assignment.node else ''}); the new owner's "
            "next flush covers this range",
            term=commit.launch_term,
            current_term=assignment.term,
        )
    return assignment.node

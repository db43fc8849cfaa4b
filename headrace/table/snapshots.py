"""Which table snapshot a read at a timetick uses, and where its WAL tail starts (pure).

A collection's table is written by the flushes of every pchannel carrying one
of its shards. Each flush commit tags its snapshots with its pchannel and the
checkpoint it moves to (``FlushCommit.summary``), and moves the pchannel's
``CheckpointRecord`` in the same metastore transaction as the table pointer.

:func:`plan_read` decides, for a read at timetick ``as_of``:

* when every pchannel's current checkpoint is at or before ``as_of`` (always
  for "latest"): the current snapshot, and per pchannel the current
  checkpoint (read in the same transaction as the pointer, so they agree);
* otherwise (time travel): the newest snapshot of the main branch whose
  history holds no checkpoint past ``as_of`` and that ends its commit (a
  flush's delete and append are two snapshots with one summary; only the
  last holds the whole commit), and per pchannel the checkpoint of its last
  commit in that history, or the beginning of the log when it has none.

Starting a tail earlier than needed is never wrong: the merge takes the
tail's version of every key it touches (:mod:`headrace.table.merge`); it only
costs reading more, and may reach WAL that was truncated (the read says so).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

PCHANNEL = "headrace.pchannel"
CHECKPOINT = "headrace.checkpoint"
CHECKPOINT_TIMETICK = "headrace.checkpoint-timetick"


@dataclasses.dataclass(frozen=True, slots=True)
class Position:
    """A checkpoint: a WAL position and its timetick."""

    position: str
    timetick: int


@dataclasses.dataclass(frozen=True, slots=True)
class SnapshotFacts:
    """What a read needs of one snapshot (from its summary)."""

    snapshot_id: int
    pchannel: str = ""
    """Empty for a snapshot that no flush made (compaction, a tool)."""
    checkpoint: Position | None = None

    @classmethod
    def of(cls, snapshot_id: int, summary: Mapping[str, str]) -> SnapshotFacts:
        pchannel = summary.get(PCHANNEL, "")
        position = summary.get(CHECKPOINT, "")
        tick = summary.get(CHECKPOINT_TIMETICK, "")
        if not pchannel or not position or not tick.isdigit():
            return cls(snapshot_id)
        return cls(snapshot_id, pchannel, Position(position, int(tick)))


@dataclasses.dataclass(frozen=True, slots=True)
class ReadPlan:
    snapshot_id: int | None
    """None: read no table rows (no table yet, or nothing committed by ``as_of``)."""
    starts: dict[str, str | None]
    """Pchannel -> the position the tail starts after (None: the log's beginning)."""
    why: str


def plan_read(
    history: Sequence[SnapshotFacts],
    checkpoints: Mapping[str, Position],
    pchannels: Sequence[str],
    as_of: int,
    expired_until: int = 0,
) -> ReadPlan:
    """The snapshot and tail starts of a read at ``as_of``.

    ``history``: the main branch's retained snapshots, oldest first, the
    current one last (empty: no table). ``checkpoints``: the pchannels'
    current checkpoint records, read with the table pointer.
    ``expired_until``: when older snapshots were expired, a timetick no
    checkpoint of theirs is past (the first retained snapshot's commit time);
    0 when the history is complete. Time travel to before it reads no table.
    """
    current = [checkpoints[p] for p in pchannels if p in checkpoints]
    if all(c.timetick <= as_of for c in current):
        starts = {p: checkpoints[p].position if p in checkpoints else None for p in pchannels}
        snapshot = history[-1].snapshot_id if history else None
        return ReadPlan(snapshot, starts, "every checkpoint is at or before as_of")
    latest: dict[str, Position] = {}
    newest = expired_until
    chosen: ReadPlan = ReadPlan(
        None, dict.fromkeys(pchannels), "no retained snapshot has its checkpoints by as_of"
    )
    for index, facts in enumerate(history):
        if facts.checkpoint is not None:
            latest[facts.pchannel] = facts.checkpoint
            newest = max(newest, facts.checkpoint.timetick)
        if newest > as_of:
            break
        if _ends_commit(history, index):
            starts = {p: latest[p].position if p in latest else None for p in pchannels}
            chosen = ReadPlan(facts.snapshot_id, starts, "the newest snapshot by as_of")
    return chosen


def _ends_commit(history: Sequence[SnapshotFacts], index: int) -> bool:
    """Whether the snapshot at ``index`` is the last of its commit (the next
    one carries another checkpoint, or none)."""
    facts = history[index]
    if facts.checkpoint is None or index + 1 == len(history):
        return True
    following = history[index + 1]
    return (following.pchannel, following.checkpoint) != (facts.pchannel, facts.checkpoint)

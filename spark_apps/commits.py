"""A flush's commits: one, or several of consecutive WAL ranges (pure).

One metastore transaction holds at most ``MAX_KEYS_PER_COMMIT`` segments and
tables together (etcd's ``--max-txn-ops``). A flush with more segments is
committed as consecutive ranges ``(start, e1], (e1, e2], ..., (ek, end]``, each
ending at the seal of its last segment (the last one at the flush's end), in
log order, so the checkpoint only ever moves forward over fully committed
ranges and a job killed between two commits resumes from the checkpoint.

Each delete goes into the commit whose range holds its position. That commit
removes its keys from everything committed before it, including earlier
commits of the same flush: correct, because a row that survived the job's
fold was inserted after every delete of its key in the range, so its segment
is sealed after that delete and sits in the same commit or a later one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from headrace.message import ids
from headrace.message.ids import MessageID
from headrace.table import Checkpoint, FlushCommit, SegmentRecord, TableChanges, WalRange
from headrace.table.records import MAX_KEYS_PER_COMMIT, PrimaryKey
from spark_apps.shard import PositionedDelete, RangeJob, ShardResult


@dataclasses.dataclass(frozen=True, slots=True)
class _Sealed:
    end: MessageID
    collection: str
    record: SegmentRecord
    timetick: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Deleted:
    position: MessageID
    collection: str
    delete: PositionedDelete


def plan_commits(
    job: RangeJob, results: Sequence[ShardResult], limit: int = MAX_KEYS_PER_COMMIT
) -> tuple[FlushCommit, ...]:
    """The commits of a flush's task results, in the order they must be made."""
    sealed = sorted(
        (
            _Sealed(
                ids.parse(record.end),
                result.collection,
                record,
                dict(result.seal_timeticks).get(record.segment_id, 0),
            )
            for result in results
            for record in result.segments
        ),
        key=lambda s: s.end,
    )
    deleted = [
        _Deleted(ids.parse(d.position), result.collection, d)
        for result in results
        for d in result.deletes
    ]
    timetick = max((r.timetick for r in results), default=0)
    # A table that only receives deletes counts too (at most once per collection).
    chunks = _chunks(sealed, limit - len({d.collection for d in deleted}))
    commits: list[FlushCommit] = []
    start = job.start
    for number, chunk in enumerate(chunks):
        last = number == len(chunks) - 1
        end = job.end if last else str(chunk[-1].record.end)
        low = ids.parse(start) if start else None
        high = ids.parse(end)
        mine = [
            d for d in deleted if (low is None or low < d.position) and (last or d.position <= high)
        ]
        commits.append(
            FlushCommit(
                pchannel=job.pchannel,
                launch_term=job.term,
                wal_range=WalRange(start, end),
                checkpoint=Checkpoint(end, timetick if last else chunk[-1].timetick),
                tables=_tables(chunk, mine),
            )
        )
        start = end
    return tuple(commits)


def _chunks(sealed: Sequence[_Sealed], limit: int) -> list[list[_Sealed]]:
    """Consecutive runs of segments (in seal order), each with its tables within
    ``limit``; always at least one (possibly empty) chunk."""
    chunks: list[list[_Sealed]] = [[]]
    for segment in sealed:
        chunk = chunks[-1]
        tables = {s.collection for s in chunk} | {segment.collection}
        if chunk and len(chunk) + 1 + len(tables) > limit:
            chunks.append([segment])
        else:
            chunk.append(segment)
    return chunks


def _tables(chunk: Sequence[_Sealed], deletes: Sequence[_Deleted]) -> tuple[TableChanges, ...]:
    names = sorted({s.collection for s in chunk} | {d.collection for d in deletes})
    tables = []
    for name in names:
        segments = tuple(s.record for s in chunk if s.collection == name)
        keys: dict[PrimaryKey, None] = {}
        for d in deletes:
            if d.collection == name:
                keys.update(dict.fromkeys(d.delete.keys))
        tables.append(
            TableChanges(
                name,
                data_files=tuple(f for s in segments for f in s.files),
                deletes=tuple(keys),
                segments=segments,
            )
        )
    return tuple(tables)

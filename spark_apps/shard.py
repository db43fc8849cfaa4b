"""One Spark task of a flush: one shard vchannel of one collection.

:func:`fold` is pure: it turns the shard's messages in the range into the rows
of each sealed segment (deletes applied to the rows before them in log order)
and the delete keys the commit applies to rows committed before the flush.
:func:`flush_shard` runs in a Spark Python worker: it reads the range through
the public consumer, folds it and writes the segments' Parquet files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time

import pyarrow as pa
import pyarrow.compute as pc

from headrace import errors
from headrace.client import HeadraceClient
from headrace.message import ids
from headrace.message.types import LogEntry
from headrace.table import CatalogConfig, SegmentRecord, TableCatalog, messages
from headrace.table.collections import Collection
from headrace.table.records import PrimaryKey
from spark_apps.wal_range import Bounds, read_range


@dataclasses.dataclass(frozen=True, slots=True)
class RangeJob:
    """What every task of one flush shares (the job's options)."""

    cluster: str
    metastore_url: str
    pchannel: str
    term: int
    start: str
    """The last checkpoint (exclusive); empty for the beginning of the log."""
    end: str
    """The last seal (inclusive)."""
    catalog: CatalogConfig
    attempt: str
    """Unique per run of the job: part of every data file name."""
    rows_per_file: int = 1_000_000
    read_idle_timeout_s: float = 60.0


@dataclasses.dataclass(frozen=True, slots=True)
class ShardTask:
    job: RangeJob
    collection: Collection
    vchannel: str


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentRows:
    segment_id: int
    start: str
    end: str
    """The seal's position."""
    rows: pa.Table
    seal_timetick: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class PositionedDelete:
    """A delete message's keys and where it is in the log: a flush split into
    several commits applies it in the commit whose range holds it."""

    position: str
    keys: tuple[PrimaryKey, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class ShardFold:
    segments: tuple[SegmentRows, ...]
    deletes: tuple[PositionedDelete, ...]
    timetick: int
    """The largest timetick seen in the range."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardResult:
    collection: str
    vchannel: str
    segments: tuple[SegmentRecord, ...]
    deletes: tuple[PositionedDelete, ...]
    timetick: int
    seal_timeticks: tuple[tuple[int, int], ...] = ()
    """(segment id, timetick of its seal) of every segment in ``segments``."""
    seconds: tuple[float, float, float] = (0.0, 0.0, 0.0)
    """Time the task spent reading, folding and writing (the driver logs it)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ShardFailure:
    """A task's error, carried back to the driver as a value (Spark would
    otherwise wrap it in a JVM stack trace)."""

    vchannel: str
    code: str
    message: str
    retryable: bool

    def error(self) -> errors.HeadraceError:
        error = errors.error_class(errors.ErrorCode(self.code))(f"{self.vchannel}: {self.message}")
        error.retryable = self.retryable
        return error


def fold(collection: Collection, vchannel: str, entries: list[LogEntry]) -> ShardFold:
    """The sealed segments' surviving rows and the range's delete keys.

    A delete removes its keys from the rows inserted before it (in this range
    here; the commit removes them from the committed rows). Every segment with
    rows in the range must be sealed in it (CorruptData otherwise: the
    launcher ends a flush range at a seal of every segment it covers).
    """
    known = {collection.name: collection}
    inserts: list[tuple[int, messages.Insert, str]] = []
    deletes: list[tuple[int, pa.ChunkedArray, str]] = []
    seals: dict[int, tuple[str, int]] = {}
    timetick = 0
    for seq, entry in enumerate(entries):
        timetick = max(timetick, entry.message.timetick)
        data = messages.parse(entry.message, known)
        if isinstance(data, messages.Insert):
            if data.segment_id in seals:
                raise errors.CorruptData(
                    f"{vchannel}: insert at {entry.id} into segment {data.segment_id}, "
                    f"sealed at {seals[data.segment_id][0]}"
                )
            inserts.append((seq, data, str(entry.id)))
        elif isinstance(data, messages.Delete):
            deletes.append((seq, data.keys, str(entry.id)))
        elif isinstance(data, messages.Seal):
            seals.setdefault(data.segment_id, (str(entry.id), entry.message.timetick))
    surviving = _apply_deletes(collection, inserts, deletes)
    by_segment: dict[int, list[tuple[str, pa.Table]]] = {}
    for (_, insert, position), rows in zip(inserts, surviving, strict=True):
        by_segment.setdefault(insert.segment_id, []).append((position, rows))
    unsealed = sorted(set(by_segment) - set(seals))
    if unsealed:
        raise errors.CorruptData(
            f"{vchannel}: segment(s) {unsealed} have rows in the range but are not sealed "
            "by its end; a flush range must end after the seal of every segment it covers"
        )
    segments = tuple(
        SegmentRows(
            segment_id,
            parts[0][0],
            seals[segment_id][0],
            pa.concat_tables([rows for _, rows in parts]).sort_by(collection.primary_key),
            seals[segment_id][1],
        )
        for segment_id, parts in sorted(by_segment.items())
    )
    positioned = tuple(
        PositionedDelete(position, tuple(array.to_pylist())) for _, array, position in deletes
    )
    return ShardFold(segments, positioned, timetick)


def _apply_deletes(
    collection: Collection,
    inserts: list[tuple[int, messages.Insert, str]],
    deletes: list[tuple[int, pa.ChunkedArray, str]],
) -> list[pa.Table]:
    """Each insert's rows without the keys deleted after it."""
    pk = collection.primary_key
    result: list[pa.Table] = []
    later: list[pa.Array] = []
    keys = pa.array([], collection.primary_key_type)
    pending = sorted(deletes, key=lambda d: d[0], reverse=True)
    for seq, insert, _ in reversed(inserts):
        if pending and pending[0][0] > seq:
            while pending and pending[0][0] > seq:
                later.extend(pending.pop(0)[1].chunks)
            keys = pa.chunked_array(later, collection.primary_key_type).combine_chunks()
        rows = insert.rows
        if len(keys):
            rows = rows.filter(pc.invert(pc.is_in(rows[pk], value_set=keys)))
        result.append(rows)
    result.reverse()
    return result


def data_file_name(job: RangeJob, segment_id: int, part: int) -> str:
    """Unique per run: a job never overwrites a file, so nothing it does can
    change a committed file (a killed run's files are orphans for the GC)."""
    return f"flush-{job.pchannel}-t{job.term}-s{segment_id}-{job.attempt}-{part}"


def write_segments(catalog: TableCatalog, task: ShardTask, fold: ShardFold) -> ShardResult:
    records = []
    step = task.job.rows_per_file
    for segment in fold.segments:
        files = [
            catalog.write_data_file(
                task.collection.name,
                segment.rows.slice(offset, step),
                data_file_name(task.job, segment.segment_id, part),
            )
            for part, offset in enumerate(range(0, segment.rows.num_rows, step))
        ]
        records.append(
            SegmentRecord(
                segment_id=segment.segment_id,
                vchannel=task.vchannel,
                start=segment.start,
                end=segment.end,
                collection=task.collection.name,
                rows=segment.rows.num_rows,
                files=files,
            )
        )
    return ShardResult(
        task.collection.name,
        task.vchannel,
        tuple(records),
        fold.deletes,
        fold.timetick,
        tuple((s.segment_id, s.seal_timetick) for s in fold.segments),
    )


def flush_shard(task: ShardTask) -> ShardResult | ShardFailure:
    """Run in a Spark worker: read, fold and write one shard's range."""
    try:
        started = time.monotonic()
        entries = asyncio.run(_read(task))
        read = time.monotonic()
        folded = fold(task.collection, task.vchannel, entries)
        folding = time.monotonic()
        with TableCatalog.open(task.job.catalog) as catalog:
            result = write_segments(catalog, task, folded)
        seconds = (read - started, folding - read, time.monotonic() - folding)
        return dataclasses.replace(result, seconds=seconds)
    except errors.HeadraceError as exc:
        return ShardFailure(task.vchannel, exc.code.value, exc.message, exc.retryable)


async def _read(task: ShardTask) -> list[LogEntry]:
    job = task.job
    async with HeadraceClient(job.metastore_url, job.cluster) as client:
        bounds = Bounds(ids.parse(job.start) if job.start else None, ids.parse(job.end))
        return await read_range(client, task.vchannel, bounds, job.read_idle_timeout_s)

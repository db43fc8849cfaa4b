"""What a flush commit reads and writes in the metastore: keys and records.

Keys (``<root>`` = ``/headrace/<cluster>``, see :class:`headrace.cluster.Keys`)::

    <root>/pchannels/<pchannel>                   Assignment (read and compared, never written)
    <root>/tables/<collection>                    TableRecord: the table's metadata pointer
    <root>/collections/<collection>               the collection's record (compared by reader pins)
    <root>/segments/<pchannel>/<segment id:020d>  SegmentRecord
    <root>/checkpoints/<pchannel>                 CheckpointRecord, written last
    <root>/seals/<pchannel>                       SealRecord: the last seal the owner wrote

:class:`SegmentRecord` and :class:`CheckpointRecord` are the one definition of
a recorded segment and of a channel checkpoint: the flush commit writes them and
:mod:`headrace.coordinator.checkpoint` (``CheckpointWriter``, recovery) writes
and reads them.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

import pydantic

from headrace import errors
from headrace.cluster import JsonRecord, Keys
from headrace.message import ids
from headrace.message.ids import MessageID

MAX_KEYS_PER_COMMIT = 120
"""Segments plus tables in one commit. etcd refuses a transaction with more
than 128 compares or operations (``--max-txn-ops``); a commit has one of each
per segment and per table, plus two for the Assignment and the checkpoint."""

PrimaryKey = int | str


class TableRecord(JsonRecord):
    """A collection's Iceberg table: where its current metadata file is."""

    collection: str
    primary_key: str
    metadata_location: str
    previous_metadata_location: str = ""


class SegmentRecord(JsonRecord):
    """A flushed segment: the messages of ``vchannel`` from ``start`` to ``end``
    (inclusive). ``segment_id``, ``pchannel``, ``node`` and ``term`` are filled
    in by the writer."""

    vchannel: str
    start: str
    end: str
    segment_id: int = 0
    collection: str = ""
    rows: int = 0
    files: list[str] = pydantic.Field(default_factory=list)
    pchannel: str = ""
    node: str = ""
    term: int = 0

    @classmethod
    def covering(
        cls, vchannel: str, start: MessageID, end: MessageID, **fields: object
    ) -> SegmentRecord:
        if end < start:
            raise errors.InvalidArgument(f"segment ends ({end}) before it starts ({start})")
        return cls.model_validate(
            {"vchannel": vchannel, "start": str(start), "end": str(end), **fields}
        )

    def end_id(self) -> MessageID:
        return ids.parse(self.end)


class CheckpointRecord(JsonRecord):
    """Where recovery of the pchannel starts: everything up to ``position`` is
    reflected in segments or other durable state. A flush commit also records
    the WAL range it covered (``flush_start``, ``flush_end``)."""

    pchannel: str
    position: str
    timetick: int = 0
    node: str = ""
    term: int = 0
    flush_start: str = ""
    flush_end: str = ""

    def position_id(self) -> MessageID:
        return ids.parse(self.position)


class SealRecord(JsonRecord):
    """The last seal the pchannel's owner wrote: every growing segment of the
    pchannel was sealed at or before ``position`` (a message id), so
    ``(checkpoint, position]`` is a range a flush can take. Written by the owner
    node under its ``term`` after the seal messages are acknowledged; read by
    flush launchers (the standalone's runner, the operator)."""

    pchannel: str
    position: str
    timetick: int = 0
    node: str = ""
    term: int = 0

    def position_id(self) -> MessageID:
        return ids.parse(self.position)


@dataclasses.dataclass(frozen=True, slots=True)
class WalRange:
    """The WAL range a flush read: after ``start`` (the checkpoint it resumed
    from; empty for the beginning of the log) up to ``end`` inclusive."""

    start: str
    end: str

    def __post_init__(self) -> None:
        end = _parse(self.end, "WAL range end")
        if self.start and end < _parse(self.start, "WAL range start"):
            raise errors.InvalidArgument(
                f"WAL range ends ({self.end}) before it starts ({self.start})"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpoint:
    """Where recovery of the pchannel starts once the flush is committed."""

    position: str
    timetick: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class TableChanges:
    """What one flush does to one collection's table.

    ``deletes`` are primary keys removed from the rows committed *before* this
    flush; the flush job has already dropped deleted rows from its own
    ``data_files``. ``data_files`` are Parquet files written under the
    warehouse (see :meth:`headrace.table.TableCatalog.write_data_file`).
    """

    collection: str
    data_files: tuple[str, ...] = ()
    deletes: tuple[PrimaryKey, ...] = ()
    segments: tuple[SegmentRecord, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class FlushCommit:
    """One flush of a pchannel, launched under ``launch_term``."""

    pchannel: str
    launch_term: int
    wal_range: WalRange
    checkpoint: Checkpoint
    tables: tuple[TableChanges, ...]

    def __post_init__(self) -> None:
        if self.launch_term < 1:
            raise errors.InvalidArgument(f"a launch term is at least 1, got {self.launch_term}")
        position = _parse(self.checkpoint.position, "checkpoint")
        if position > _parse(self.wal_range.end, "WAL range end") or (
            self.wal_range.start and not _parse(self.wal_range.start, "WAL range start") < position
        ):
            raise errors.InvalidArgument(
                f"checkpoint {self.checkpoint.position} lies outside the flushed WAL range "
                f"({self.wal_range.start or 'beginning'}, {self.wal_range.end}]"
            )
        names = [table.collection for table in self.tables]
        if len(set(names)) != len(names):
            raise errors.InvalidArgument(f"a collection appears twice in one flush: {names}")
        segments = [s.segment_id for t in self.tables for s in t.segments]
        if len(set(segments)) != len(segments):
            raise errors.InvalidArgument(f"a segment id appears twice in one flush: {segments}")
        if len(segments) + len(names) > MAX_KEYS_PER_COMMIT:
            raise errors.InvalidArgument(
                f"{len(segments)} segments and {len(names)} tables in one commit; at most "
                f"{MAX_KEYS_PER_COMMIT} together (split the flush into commits of "
                "consecutive WAL ranges)"
            )

    def summary(self) -> dict[str, str]:
        """Properties of the Iceberg snapshots this flush creates."""
        return {
            "headrace.pchannel": self.pchannel,
            "headrace.term": str(self.launch_term),
            "headrace.wal-start": self.wal_range.start,
            "headrace.wal-end": self.wal_range.end,
            "headrace.checkpoint": self.checkpoint.position,
            "headrace.checkpoint-timetick": str(self.checkpoint.timetick),
        }


def _parse(position: str, what: str) -> MessageID:
    if not position:
        raise errors.InvalidArgument(f"{what} is empty")
    return ids.parse(position)


def table_key(keys: Keys, collection: str) -> str:
    if not collection or "/" in collection:
        raise errors.InvalidArgument(f"invalid collection name {collection!r}")
    return f"{keys.root}/tables/{collection}"


def collection_key(keys: Keys, name: str) -> str:
    """Where the collection's record is (:mod:`headrace.table.collections`)."""
    return f"{keys.root}/collections/{name}"


def tables_prefix(keys: Keys) -> str:
    return f"{keys.root}/tables/"


def seal_key(keys: Keys, pchannel: str) -> str:
    return f"{keys.root}/seals/{pchannel}"


def seals_prefix(keys: Keys) -> str:
    return f"{keys.root}/seals/"


def segments_prefix(keys: Keys, pchannel: str) -> str:
    return f"{keys.root}/segments/{pchannel}/"


def checkpoints_prefix(keys: Keys) -> str:
    """The prefix of every pchannel's ``CheckpointRecord`` (``Keys.checkpoint``)."""
    return keys.checkpoint("")


def segment_key(keys: Keys, pchannel: str, segment_id: int) -> str:
    if not 0 <= segment_id < 10**20:
        raise errors.InvalidArgument(f"segment id out of range: {segment_id}")
    return f"{segments_prefix(keys, pchannel)}{segment_id:020d}"


def segment_keys(keys: Keys, commit: FlushCommit) -> Sequence[str]:
    return [
        segment_key(keys, commit.pchannel, segment.segment_id)
        for table in commit.tables
        for segment in table.segments
    ]


class CompactionState(enum.Enum):
    PENDING = "PENDING"
    DONE = "DONE"
    FAILED = "FAILED"


class CompactionRequest(JsonRecord):
    """``headrace compact --collection C``: compact every shard of ``collection``
    now, whatever the triggers say. Written by the client (a new
    ``request_id`` each time, replacing any earlier request of the collection);
    the runner that serves it sets ``state`` (comparing the record's revision,
    so a newer request is never marked done by an older run)."""

    collection: str
    request_id: str
    requested_at: float
    """Wall clock (seconds)."""
    state: CompactionState = CompactionState.PENDING
    message: str = ""
    done_at: float = 0.0


class ShardCompaction(JsonRecord):
    """The last compaction of one shard of a collection (for the delete-ratio
    trigger): ``deleted`` = rows the shard's flushes wrote minus its live rows,
    at that compaction. Rows deleted since = the same difference now minus it."""

    collection: str
    shard: int
    at: float
    """Wall clock (seconds) of the commit."""
    snapshot_id: int
    deleted: int
    live_rows: int


def compaction_request_key(keys: Keys, collection: str) -> str:
    if not collection or "/" in collection:
        raise errors.InvalidArgument(f"invalid collection name {collection!r}")
    return f"{compaction_requests_prefix(keys)}{collection}"


def compaction_requests_prefix(keys: Keys) -> str:
    return f"{keys.root}/compactions/requests/"


def shard_compaction_key(keys: Keys, collection: str, shard: int) -> str:
    if not collection or "/" in collection or shard < 0:
        raise errors.InvalidArgument(f"invalid collection shard {collection!r} {shard}")
    return f"{keys.root}/compactions/shards/{collection}/{shard:05d}"


def shard_compactions_prefix(keys: Keys) -> str:
    return f"{keys.root}/compactions/shards/"


def segments_root(keys: Keys) -> str:
    """The prefix of every pchannel's segment records."""
    return f"{keys.root}/segments/"

"""Lease-owned writers of state derived from a WAL.

Whoever writes state derived from a pchannel's WAL (recovery checkpoints, flush
jobs' segment meta) writes it *as the pchannel's owner*: every write is a
transaction that also compares the pchannel's Assignment record, which must
still name the writer's node and term (in ASSIGNING, ASSIGNED or UNASSIGNING).
Once the coordinator moved the pchannel on, the record changed, the write fails
with :class:`headrace.errors.Fenced` and the writer stops; a deposed writer
never overwrites its successor's state.

The order rule: **segment meta is written before the channel checkpoint.** A
crash between the two leaves a segment whose range lies after the checkpoint;
the next owner replays from the old checkpoint and discards what the segments
already hold (:class:`ReplayFilter`: a message of a vchannel at or below the
end position of a recorded segment of that vchannel is a duplicate). Nothing is
lost, nothing is stored twice.

Keys (``<root>`` = ``/headrace/<cluster>``)::

    <root>/checkpoints/<pchannel>                 CheckpointRecord
    <root>/segments/<pchannel>/<segment id:020d>  SegmentRecord

Both records are defined once, in :mod:`headrace.table.records`; the flush
commit (:meth:`headrace.table.TableCatalog.commit_flush`) writes the same ones.

Positions are printable message ids (``<backend>:<value>``, see
:mod:`headrace.message.ids`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

from headrace import errors
from headrace.cluster import ACTIVE_STATES, Assignment, Keys
from headrace.coordinator.control import parse_record
from headrace.message.ids import MessageID
from headrace.metastore.contract import Compare, KeyValue, Metastore, Op, Put
from headrace.table.records import (
    CheckpointRecord,
    SegmentRecord,
    segment_key,
    segments_prefix,
)

log = logging.getLogger(__name__)


class CheckpointWriter:
    """Writes segment meta and checkpoints of ``pchannel`` as its owner
    (``node`` under ``term``); Fenced once the pchannel has moved on."""

    max_attempts = 8
    """CAS retries when the record changes but still names this owner
    (ASSIGNING -> ASSIGNED -> UNASSIGNING)."""

    def __init__(
        self, metastore: Metastore, cluster: str, pchannel: str, node: str, term: int
    ) -> None:
        if term < 1:
            raise errors.InvalidArgument(f"an owner's term is at least 1, got {term}")
        self.metastore = metastore
        self.keys = Keys(cluster)
        self.pchannel = pchannel
        self.node = node
        self.term = term
        self.fenced = False

    async def write_segment_meta(self, segment_id: int, meta: SegmentRecord) -> None:
        """Record a flushed segment (before the checkpoint that covers it)."""
        if meta.pchannel and meta.pchannel != self.pchannel:
            raise errors.InvalidArgument(
                f"segment meta of {meta.pchannel} given to the writer of {self.pchannel}"
            )
        stored = meta.model_copy(
            update={
                "segment_id": segment_id,
                "pchannel": self.pchannel,
                "node": self.node,
                "term": self.term,
            }
        )
        key = segment_key(self.keys, self.pchannel, segment_id)
        await self._write([], [Put(key, stored.model_dump_json().encode())])

    async def write_checkpoint(self, position: MessageID, timetick: int = 0) -> None:
        """Move the channel checkpoint forward to ``position``.

        InvalidArgument if it would move backwards; Fenced if no longer owner.
        """
        key = self.keys.checkpoint(self.pchannel)
        record = CheckpointRecord(
            pchannel=self.pchannel,
            position=str(position),
            timetick=timetick,
            node=self.node,
            term=self.term,
        )
        for _ in range(self.max_attempts):
            current = await self.metastore.get(key)
            if current is not None:
                previous = CheckpointRecord.from_json(current.value).position_id()
                if position < previous:
                    raise errors.InvalidArgument(
                        f"checkpoint of {self.pchannel} would move back from {previous} "
                        f"to {position}"
                    )
            revision = 0 if current is None else current.mod_revision
            compares = [Compare.mod_revision_is(key, revision)]
            if await self._try_write(compares, [Put(key, record.model_dump_json().encode())]):
                return
        raise self._contended()

    async def _write(self, compares: Sequence[Compare], ops: Sequence[Op]) -> None:
        for _ in range(self.max_attempts):
            if await self._try_write(compares, ops):
                return
        raise self._contended()

    async def _try_write(self, compares: Sequence[Compare], ops: Sequence[Op]) -> bool:
        """One attempt: False if something changed meanwhile (try again)."""
        key = self.keys.pchannel(self.pchannel)
        kv = self._owned(await self.metastore.get(key))
        result = await self.metastore.txn(
            [Compare.mod_revision_is(key, kv.mod_revision), *compares], ops
        )
        return result.succeeded

    def _owned(self, kv: KeyValue | None) -> KeyValue:
        """``kv`` if its record still names this writer; Fenced otherwise."""
        if self.fenced:
            raise errors.Fenced(
                f"writer of {self.pchannel} term {self.term} was fenced", term=self.term
            )
        record = None if kv is None else parse_record(Assignment, kv.value)
        if (
            kv is None
            or record is None
            or record.state not in ACTIVE_STATES
            or record.node != self.node
            or record.term != self.term
        ):
            self.fenced = True
            current = 0 if record is None else record.term
            log.warning(
                "%s: writer %s term %d fenced (record names %s term %d)",
                self.pchannel,
                self.node,
                self.term,
                "nobody" if record is None else record.node or "nobody",
                current,
            )
            raise errors.Fenced(
                f"{self.pchannel} is no longer owned by {self.node} under term {self.term}",
                term=self.term,
                current_term=current,
            )
        return kv

    def _contended(self) -> errors.Unavailable:
        return errors.Unavailable(
            f"{self.pchannel}: the write kept racing with other writers; try again"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryPoint:
    checkpoint: CheckpointRecord | None
    segments: tuple[SegmentRecord, ...]

    def replay_filter(self) -> ReplayFilter:
        return ReplayFilter(self.segments)


async def load_recovery(metastore: Metastore, cluster: str, pchannel: str) -> RecoveryPoint:
    """The checkpoint and recorded segments a new owner recovers from."""
    keys = Keys(cluster)
    kv = await metastore.get(keys.checkpoint(pchannel))
    checkpoint = None if kv is None else CheckpointRecord.from_json(kv.value)
    items = await metastore.get_prefix(segments_prefix(keys, pchannel))
    segments = tuple(SegmentRecord.from_json(item.value) for item in items)
    return RecoveryPoint(checkpoint, segments)


class ReplayFilter:
    """Discards replayed messages that recorded segments already hold."""

    def __init__(self, segments: Iterable[SegmentRecord]) -> None:
        self._flushed: dict[str, MessageID] = {}
        for segment in segments:
            end = segment.end_id()
            known = self._flushed.get(segment.vchannel)
            if known is None or known < end:
                self._flushed[segment.vchannel] = end

    def flushed_up_to(self, vchannel: str) -> MessageID | None:
        return self._flushed.get(vchannel)

    def is_duplicate(self, vchannel: str, position: MessageID) -> bool:
        end = self._flushed.get(vchannel)
        return end is not None and not end < position

"""Stored records of either message format, as log entries.

A backend record holds one format 1 message (:mod:`.codec`) or one record
batch of format 2 (:mod:`.batch`); which one, its first two bytes say. A
log written before a cluster switched formats holds both. Message ``i`` of a
batch stored as record ``R`` has id ``R.with_index(i)`` (``R`` itself for
``i == 0``); a format 1 record's message has the record's id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from headrace import errors
from headrace.message import batch, codec
from headrace.message.codec import HeaderFilter, Skipped
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType

_BATCH = batch.MAGIC
_new_tuple = tuple.__new__


def message_id(record_id: MessageID, index: int) -> MessageID:
    """Id of message ``index`` of the record ``record_id``."""
    return record_id.with_index(index) if index else record_id


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class BatchEntry:
    """A stored record batch as one unit (the write-ahead buffer holds these,
    and readers that take batches get them whole)."""

    id: MessageID
    """The record's id, which is also its first message's."""
    header: batch.BatchHeader
    """Checked when the batch was appended or read."""
    record: bytes | batch.Stamped
    """The stored batch: its bytes, or (appended to this WAL) the producer's
    bytes with the WAL's stamp not joined yet (:attr:`data` joins them)."""

    @property
    def data(self) -> bytes:
        """The stored batch's bytes (stamped), joined on first need."""
        record = self.record
        return record if isinstance(record, bytes) else record.joined()

    @property
    def body(self) -> bytes:
        """Bytes with the batch's records at their offsets, without joining a
        stamp not joined yet (decoding takes the stamp from :attr:`header`)."""
        record = self.record
        return record if isinstance(record, bytes) else record.records

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BatchEntry):
            return NotImplemented
        return (self.id, self.header, self.data) == (other.id, other.header, other.data)

    def __hash__(self) -> int:
        return hash((self.id, self.header, self.data))

    @property
    def count(self) -> int:
        return self.header.count

    @property
    def last_id(self) -> MessageID:
        return message_id(self.id, self.header.count - 1)

    @property
    def last_timetick(self) -> int:
        return self.header.last_timetick

    def entries(self) -> list[LogEntry]:
        """The batch's messages as log entries."""
        rid = self.id
        msgs = batch.messages(self.body, self.header)
        return [_new_tuple(LogEntry, (message_id(rid, i), m)) for i, m in enumerate(msgs)]

    def position_of(self, mid: MessageID) -> int | None:
        """Index of the message ``mid`` in this batch, None if it is not one of its."""
        rid = self.id
        if mid.index >= self.header.count or mid.record_id() != rid:
            return None
        return mid.index

    def expand(
        self,
        keep: HeaderFilter | None,
        out: list[Decoded],
    ) -> None:
        """The batch's messages onto ``out``, with ``keep`` applied as
        :func:`decode_block` applies it."""
        _expand_checked(self.id, self.body, self.header, keep, out)

    def accepted_whole(self, keep: HeaderFilter | None) -> bool:
        """Whether ``keep`` passes every message of the batch (it then goes whole)."""
        header = self.header
        if keep is None:
            return True
        if keep.vchannels and header.vchannel and header.vchannel not in keep.vchannels:
            return False
        if header.base_timetick < keep.min_timetick:
            return False
        if keep.types:
            return keep.types.issuperset(batch.type_codes(self.body, header))
        return True


def entries(record_id: MessageID, data: bytes) -> list[LogEntry]:
    """Every message of one record, checked; CorruptData on bad input."""
    if not data.startswith(_BATCH):
        return [LogEntry(record_id, codec.decode(data))]
    msgs = batch.messages(data)
    return [LogEntry(message_id(record_id, i), msg) for i, msg in enumerate(msgs)]


def last_entry(record_id: MessageID, data: bytes) -> LogEntry:
    """The last message of one record (its id and message), checked."""
    if not data.startswith(_BATCH):
        return LogEntry(record_id, codec.decode(data))
    msgs = batch.messages(data)
    return LogEntry(message_id(record_id, len(msgs) - 1), msgs[-1])


Decoded = LogEntry | Skipped | BatchEntry
"""What :func:`decode_block` gives for a record, or each message of one."""


def decode_block(
    data: bytes,
    bounds: Sequence[int],
    ids: Sequence[MessageID],
    *,
    verify: bool = True,
    keep: HeaderFilter | None = None,
    units: bool = False,
) -> list[Decoded]:
    """:func:`codec.decode_block` for records of either format.

    ``units``: a batch without a txn id that ``keep`` passes whole comes back
    as one :class:`BatchEntry` (checked, not decoded) instead of its messages.

    Runs of format 1 records go to :func:`codec.decode_block` as they are; a
    batch comes back as its messages, in order. With ``keep``, the messages
    of a batch without a txn id that ``keep`` rejects come back as
    :class:`Skipped`: a batch of a vchannel not kept as one Skipped (its
    last message, with the type of a DDL record inside if there is one, so a
    reader still sees where a collection's transactions end), and single
    rejected messages of a kept batch (type and timetick filters) each as one.
    """
    if len(bounds) != 2 * len(ids):
        raise errors.InvalidArgument(
            f"a block of {len(ids)} records needs {2 * len(ids)} bounds, got {len(bounds)}"
        )
    starts = bounds[::2]
    first = next((i for i, start in enumerate(starts) if data.startswith(_BATCH, start)), None)
    if first is None:  # format 1 only (every log written before format 2)
        return list(codec.decode_block(data, bounds, ids, verify=verify, keep=keep))
    out: list[Decoded] = []
    run = 0  # first record of the current format 1 run
    for i, start in enumerate(starts):
        if i < first or not data.startswith(_BATCH, start):
            continue
        if run < i:
            out += codec.decode_block(
                data, bounds[2 * run : 2 * i], ids[run:i], verify=verify, keep=keep
            )
        run = i + 1
        raw = data[start : bounds[2 * i + 1]]
        header = batch.verify(raw) if verify else batch.read_header(raw)
        unit = BatchEntry(ids[i], header, raw)
        if units and not header.txn_id and unit.accepted_whole(keep):
            out.append(unit)
        else:
            unit.expand(keep, out)
    if run < len(ids):
        out += codec.decode_block(data, bounds[2 * run :], ids[run:], verify=verify, keep=keep)
    return out


def _expand_checked(
    record_id: MessageID,
    data: bytes,
    header: batch.BatchHeader,
    keep: HeaderFilter | None,
    out: list[Decoded],
) -> None:
    vch, term = header.vchannel, header.term
    if keep is not None and not header.txn_id:
        if keep.vchannels and vch and vch not in keep.vchannels:
            types = batch.record_types(data, header)
            kind = next((t for t in types if t.is_ddl), types[-1])
            last = message_id(record_id, header.count - 1)
            out.append(_new_tuple(Skipped, (last, kind, vch, header.last_timetick, term)))
            return
        if keep.types or header.base_timetick < keep.min_timetick:
            _filtered(record_id, data, header, keep, out)
            return
    msgs = batch.messages(data, header)
    out += [_new_tuple(LogEntry, (message_id(record_id, i), m)) for i, m in enumerate(msgs)]


def _filtered(
    record_id: MessageID,
    data: bytes,
    header: batch.BatchHeader,
    keep: HeaderFilter,
    out: list[Decoded],
) -> None:
    msgs: list[Message] = batch.messages(data, header)
    for i, msg in enumerate(msgs):
        mid = message_id(record_id, i)
        kind: MessageType = msg.type
        if keep.accepts(kind, msg.vchannel, msg.timetick):
            out.append(_new_tuple(LogEntry, (mid, msg)))
        else:
            out.append(_new_tuple(Skipped, (mid, kind, msg.vchannel, msg.timetick, msg.term)))

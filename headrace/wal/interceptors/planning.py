"""Planning and settling the appender's backend appends (bookkeeping, no I/O).

A :class:`Batch` collects the requests of one backend append. Planning gives
each message its timetick and the term and encodes it; settling turns the ids
the backend returned into every caller's :class:`AppendResult` and the
write-ahead buffer's entries.

In message format 2 every record is a record batch: a context carrying a
whole producer batch gets its messages' timeticks (consecutive, reserved at
once), is stamped without a copy of its bytes (the stamp stays apart until a
writer or reader joins it, :class:`~headrace.message.batch.Stamped`) and
stored as it is (the buffer keeps it whole);
any other message (the WAL's ticks and fences, the per-message path) is
stored as a batch of its own, with its batch's dedup key if it came from one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
from typing import NamedTuple

from headrace import errors, slots
from headrace.message import batch as batches
from headrace.message import codec
from headrace.message.batch import BatchHeader, Stamped
from headrace.message.ids import MessageID
from headrace.message.records import BatchEntry, message_id
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.api import append_result
from headrace.wal.interceptors.chain import AppendContext, BatchPart

SYSTEM = frozenset((MessageType.TIME_TICK, MessageType.FENCE))


class Persist(enum.Enum):
    """Whether a request's TIME_TICK or FENCE goes to the log or only to the buffer."""

    ALWAYS = "always"
    """Data, a fence, the final tick of a drain: persisted."""
    AFTER_DATA = "after data"
    """A sync tick: persisted only if data was persisted since the last
    persisted tick or fence (else it goes only to the buffer)."""
    NEVER = "never"
    """A tick while data flows: only to the buffer; the log's tick rides in
    the next data write (see ``Appender.advance``)."""


class Request:
    """One queued ``write``: contexts answered together through ``future``."""

    __slots__ = ("contexts", "future", "persist")

    def __init__(
        self, contexts: list[AppendContext], future: asyncio.Future[None], persist: Persist
    ) -> None:
        self.contexts = contexts
        self.future = future
        self.persist = persist


def persists(requests: list[Request]) -> bool:
    """Whether ``requests`` hold a record that is persisted whatever came before (pure)."""
    return any(request.persist is Persist.ALWAYS for request in requests)


class Batch:
    """Requests planned for one backend append, in log order.

    Per planned context (parallel lists): the context, its stamped message
    (a whole record batch's representative: ``wholes`` has its stamp), its
    encoded size and whether it is persisted (a sync tick may go only to
    the buffer); ``records`` holds the encoded persisted messages.
    """

    __slots__ = (
        "contexts",
        "count",
        "early",
        "messages",
        "persisted",
        "records",
        "requests",
        "sizes",
        "wholes",
    )

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.contexts: list[AppendContext] = []
        self.messages: list[Message] = []
        self.sizes: list[int] = []
        self.persisted: list[bool] = []
        self.records: list[bytes | Stamped] = []
        self.count = 0
        self.early: Settled | None = None
        """Settled ahead with the ids the backend announced (see :func:`settle_early`)."""
        self.wholes: dict[int, tuple[bytes | Stamped, BatchHeader]] = {}
        """Planned contexts (by position) that are whole record batches: the
        stored bytes and their stamped header."""


class Columns(NamedTuple):
    """The write-ahead buffer's entries of a settled batch, by columns."""

    entries: list[LogEntry | BatchEntry]
    timeticks: list[int]
    sizes: list[int]
    persisted: list[bool]


class Settled(NamedTuple):
    """A batch's bookkeeping for the ids ``ids``."""

    ids: list[MessageID]
    columns: Columns


@dataclasses.dataclass(slots=True)
class Stamp:
    """What planning carries from one batch to the next."""

    term: int
    last_timetick: int
    dirty: bool
    """Data was persisted since the last persisted tick or fence."""
    max_bytes: int
    """Largest encoded message accepted (a BEGIN_TXN's txn id included)."""
    message_format: int = codec.FORMAT_VERSION
    """The message format every record is encoded in (the cluster's, see
    :mod:`headrace.message.formats`)."""

    @property
    def batches(self) -> bool:
        """Records are record batches (message format 2)."""
        return self.message_format == batches.FORMAT_VERSION


BATCH_OVERHEAD = batches.HEADER_SIZE + batches.RECORD_HEADER_SIZE
"""What a record batch of one message adds to the message's size in format 1, at most."""


def alone(msg: Message, ctx: AppendContext, max_bytes: int) -> bytes:
    """``msg`` (stamped) stored as a record batch of its own, with the dedup key
    of the producer batch it came from, if any."""
    part = ctx.batch
    header = None if part is None else part.header
    info = batches.BatchInfo(
        msg.vchannel,
        0 if header is None else header.producer_id,
        0 if header is None else header.sequence,
        msg.txn_id,
        system=msg.type in SYSTEM,
    )
    data = bytearray(
        batches.encode([msg], info, batches.Limits(max_bytes, max_bytes + BATCH_OVERHEAD))
    )
    batches.stamp(data, msg.timetick, msg.term)
    return bytes(data)


def stamped_whole(
    part: BatchPart, base_timetick: int, term: int
) -> tuple[bytes | Stamped, BatchHeader]:
    """A producer's whole batch stamped: the record to store, its header.

    The producer's ``bytes`` are not copied (the stamp stays apart until a
    writer or reader joins it, see :class:`~headrace.message.batch.Stamped`);
    any other buffer is copied stamped, as the caller may change it after."""
    data = part.data
    assert data is not None
    header = part.header.with_stamp(base_timetick, term)
    if data.__class__ is bytes:
        return Stamped(data, header), header
    return batches.stamped(data, base_timetick, term), header


def ticks_needed(requests: list[Request]) -> int:
    """Timeticks ``requests`` take: one per message, a whole batch's messages included."""
    return sum(
        ctx.batch.header.count if ctx.batch is not None and ctx.batch.data is not None else 1
        for request in requests
        for ctx in request.contexts
    )


def plan(batch: Batch, requests: list[Request], first: int, stamp: Stamp) -> None:
    """Timeticks from ``first`` (never below the last one plus one), the term
    and the encoding of ``requests``' messages, added to ``batch`` in order.

    A TIME_TICK or FENCE goes only to the buffer as its request's
    :class:`Persist` says. A message that does not encode fails alone.
    """
    term = stamp.term
    tt = stamp.last_timetick
    dirty = stamp.dirty
    encode = codec.encode
    max_bytes = stamp.max_bytes
    message_format = stamp.message_format
    as_batches = stamp.batches
    wholes = batch.wholes
    i = first
    contexts, messages, sizes = batch.contexts, batch.messages, batch.sizes
    persisted, records = batch.persisted, batch.records
    for request in requests:
        persist = request.persist
        for ctx in request.contexts:
            tt = i if i > tt else tt + 1
            i += 1
            m = ctx.message
            part = ctx.batch
            if part is not None and part.data is not None:
                # A whole batch: its messages get tt, tt + 1, ... (reserved at
                # once); its result and entry come from its stamped header.
                record, header = stamped_whole(part, tt, term)
                wholes[len(contexts)] = (record, header)
                tt = header.last_timetick
                i += header.count - 1
                dirty = True
                records.append(record)
                contexts.append(ctx)
                messages.append(m)
                sizes.append(len(record))
                persisted.append(True)
                continue
            kind = m.type
            stamped = Message(kind, m.vchannel, m.payload, m.properties, tt, term, m.txn_id)
            if (
                persist is not Persist.ALWAYS
                and kind in SYSTEM
                and (persist is Persist.NEVER or not dirty)
            ):
                contexts.append(ctx)
                messages.append(stamped)
                sizes.append(ctx.size)
                persisted.append(False)
                continue
            try:
                data = (
                    alone(stamped, ctx, max_bytes)
                    if as_batches
                    else encode(stamped, max_bytes, message_format)
                )
            except errors.HeadraceError as exc:
                ctx.fail(exc)
                continue
            dirty = kind not in SYSTEM
            records.append(data)
            contexts.append(ctx)
            messages.append(stamped)
            sizes.append(len(data))
            persisted.append(True)
    stamp.last_timetick = tt
    stamp.dirty = dirty


_SET_ENTRY = slots.setters(BatchEntry)
"""In field order: id, header, record."""


def batch_entry(mid: MessageID, header: BatchHeader, record: bytes | Stamped) -> BatchEntry:
    """``BatchEntry(mid, header, record)``, built through its slots (one per
    appended whole batch; see :func:`headrace.wal.api.append_result`)."""
    entry = object.__new__(BatchEntry)
    set_id, set_header, set_record = _SET_ENTRY
    set_id(entry, mid)
    set_header(entry, header)
    set_record(entry, record)
    return entry


def settle(batch: Batch, ids: list[MessageID], last_id: MessageID | None) -> Columns:
    """Every planned context's result from the backend's ``ids`` (a tick that
    was not persisted carries the id of the last persisted message, starting
    from ``last_id``); the buffer's entries (a whole record batch as one
    :class:`~headrace.message.records.BatchEntry`, its last timetick in the
    timeticks column)."""
    messages, wholes = batch.messages, batch.wholes
    if len(ids) == len(messages):
        entry_ids = ids  # every planned message was persisted: one id each
    else:
        entry_ids = []
        it = iter(ids)
        for i, stored in enumerate(batch.persisted):
            if stored:
                rid = next(it)
                entry_ids.append(rid)
                whole = wholes.get(i)
                last_id = rid if whole is None else message_id(rid, whole[1].count - 1)
                continue
            assert last_id is not None, "a sync tick before any persisted record"
            entry_ids.append(last_id)
    new_tuple = tuple.__new__
    entries: list[LogEntry | BatchEntry] = []
    append = entries.append
    timeticks: list[int] = []
    for i, (ctx, mid, msg) in enumerate(zip(batch.contexts, entry_ids, messages, strict=True)):
        whole = wholes.get(i) if wholes else None
        if whole is None:
            tt = msg.timetick
            ctx.result = append_result(mid, tt, msg.term, msg.txn_id)
            append(new_tuple(LogEntry, (mid, msg)))
            timeticks.append(tt)
        else:
            record, header = whole
            base = header.base_timetick
            ctx.result = append_result(mid, base, header.term, header.txn_id)
            append(batch_entry(mid, header, record))
            timeticks.append(base + header.count - 1)  # its last timetick
    return Columns(entries, timeticks, batch.sizes, batch.persisted)


def settle_early(batch: Batch, ids: list[MessageID]) -> None:
    """Settle ``batch`` ahead with the ids its append will get if it succeeds.

    The callers' results are set but not seen before their requests are
    resolved; :func:`unsettle` takes them back if the append fails.
    """
    if len(ids) == len(batch.messages):  # every message persisted: no earlier id needed
        batch.early = Settled(ids, settle(batch, ids, None))


def unsettle(batch: Batch) -> None:
    """Take back results settled ahead (the append did not end as announced)."""
    if batch.early is not None:
        batch.early = None
        for ctx in batch.contexts:
            ctx.result = None


def settle_failed(requests: list[Request], error: errors.HeadraceError) -> None:
    """Fail every context of ``requests`` that has no outcome yet."""
    for request in requests:
        for ctx in request.contexts:
            if not ctx.settled:
                ctx.fail(error)


def resolve(requests: list[Request]) -> None:
    """Wake the callers of ``requests`` (their contexts are settled)."""
    for request in requests:
        if not request.future.done():
            request.future.set_result(None)

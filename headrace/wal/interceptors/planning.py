"""Planning and settling the appender's backend appends (bookkeeping, no I/O).

A :class:`Batch` collects the requests of one backend append. Planning gives
each message its timetick and the term and encodes it; settling turns the ids
the backend returned into every caller's :class:`AppendResult` and the
write-ahead buffer's entries.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import NamedTuple

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.api import AppendResult
from headrace.wal.interceptors.chain import AppendContext

SYSTEM = frozenset((MessageType.TIME_TICK, MessageType.FENCE))


class Request:
    """One queued ``write``: contexts answered together through ``future``."""

    __slots__ = ("contexts", "future", "sync_tick")

    def __init__(
        self, contexts: list[AppendContext], future: asyncio.Future[None], sync_tick: bool
    ) -> None:
        self.contexts = contexts
        self.future = future
        self.sync_tick = sync_tick


class Batch:
    """Requests planned for one backend append, in log order.

    Per planned context (parallel lists): the context, its stamped message,
    its encoded size and whether it is persisted (a sync tick may go only to
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
    )

    def __init__(self) -> None:
        self.requests: list[Request] = []
        self.contexts: list[AppendContext] = []
        self.messages: list[Message] = []
        self.sizes: list[int] = []
        self.persisted: list[bool] = []
        self.records: list[bytes] = []
        self.count = 0
        self.early: Settled | None = None
        """Settled ahead with the ids the backend announced (see :func:`settle_early`)."""


class Settled(NamedTuple):
    """A batch's bookkeeping for the ids ``ids``: the buffer's entries and timeticks."""

    ids: list[MessageID]
    entries: list[LogEntry]
    timeticks: list[int]


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


def plan(batch: Batch, requests: list[Request], first: int, stamp: Stamp) -> None:
    """Timeticks from ``first`` (never below the last one plus one), the term
    and the encoding of ``requests``' messages, added to ``batch`` in order.

    A sync tick goes only to the buffer unless data was persisted since the
    last persisted tick or fence. A message that does not encode fails alone.
    """
    term = stamp.term
    tt = stamp.last_timetick
    dirty = stamp.dirty
    encode = codec.encode
    max_bytes = stamp.max_bytes
    message_format = stamp.message_format
    i = first
    contexts, messages, sizes = batch.contexts, batch.messages, batch.sizes
    persisted, records = batch.persisted, batch.records
    for request in requests:
        sync_tick = request.sync_tick
        for ctx in request.contexts:
            tt = i if i > tt else tt + 1
            i += 1
            m = ctx.message
            kind = m.type
            stamped = Message(kind, m.vchannel, m.payload, m.properties, tt, term, m.txn_id)
            if sync_tick and not dirty and kind in SYSTEM:
                contexts.append(ctx)
                messages.append(stamped)
                sizes.append(ctx.size)
                persisted.append(False)
                continue
            try:
                data = encode(stamped, max_bytes, message_format)
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


_RESULT_FIELDS = ("id", "timetick", "term", "txn_id")
assert tuple(f.name for f in dataclasses.fields(AppendResult)) == _RESULT_FIELDS
_SET_RESULT = tuple(AppendResult.__dict__[name].__set__ for name in _RESULT_FIELDS)


def make_result(mid: MessageID, timetick: int, term: int, txn_id: int) -> AppendResult:
    """``AppendResult(mid, timetick, term, txn_id)``, built through its slots.

    The generated ``__init__`` of a frozen dataclass sets fields by name with
    ``object.__setattr__``; the slot setters do the same in half the time
    (one result per appended message).
    """
    result = object.__new__(AppendResult)
    set_id, set_timetick, set_term, set_txn = _SET_RESULT
    set_id(result, mid)
    set_timetick(result, timetick)
    set_term(result, term)
    set_txn(result, txn_id)
    return result


def settle(
    batch: Batch, ids: list[MessageID], last_id: MessageID | None
) -> tuple[list[LogEntry], list[int]]:
    """Every planned context's result from the backend's ``ids`` (a tick that
    was not persisted carries the id of the last persisted record, starting
    from ``last_id``); the buffer's entries and their timeticks."""
    messages = batch.messages
    if len(ids) == len(messages):
        entry_ids = ids  # every planned message was persisted: one id each
    else:
        entry_ids = []
        it = iter(ids)
        for stored in batch.persisted:
            if stored:
                last_id = next(it)
            assert last_id is not None, "a sync tick before any persisted record"
            entry_ids.append(last_id)
    new_tuple = tuple.__new__
    entries: list[LogEntry] = []
    append = entries.append
    timeticks: list[int] = []
    for ctx, mid, msg in zip(batch.contexts, entry_ids, messages, strict=True):
        tt = msg.timetick
        ctx.result = make_result(mid, tt, msg.term, msg.txn_id)
        append(new_tuple(LogEntry, (mid, msg)))
        timeticks.append(tt)
    return entries, timeticks


def settle_early(batch: Batch, ids: list[MessageID]) -> None:
    """Settle ``batch`` ahead with the ids its append will get if it succeeds.

    The callers' results are set but not seen before their requests are
    resolved; :func:`unsettle` takes them back if the append fails.
    """
    if len(ids) == len(batch.messages):  # every message persisted: no earlier id needed
        batch.early = Settled(ids, *settle(batch, ids, None))


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

"""Types of the framework WAL's public API (append results, read options)."""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Collection

from headrace import slots
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType


@dataclasses.dataclass(frozen=True, slots=True)
class AppendResult:
    """What a producer learns about an acknowledged message."""

    id: MessageID
    timetick: int
    term: int
    txn_id: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class BatchAppendResult:
    """What a producer learns about an acknowledged record batch: message ``i``
    has id :func:`~headrace.message.records.message_id` ``(record_id, i)`` and
    timetick ``timetick + i``; every message has the batch's term and txn id."""

    record_id: MessageID
    """The stored record's id, which is also the id of the batch's first message."""
    count: int
    timetick: int
    """The first message's (the batch's base timetick)."""
    term: int
    txn_id: int = 0

    def message_ids(self) -> list[MessageID]:
        return self.record_id.indexed(self.count)

    def results(self) -> list[AppendResult]:
        """Each message's result, in order: built column by column through the
        results' slot setters (the fields come from this trusted result, so
        there is nothing to check per message), a few C calls per result
        instead of a frozen dataclass's ``__init__``."""
        count = self.count
        results: list[AppendResult] = list(map(_new, _repeat(AppendResult, count)))
        set_id, set_timetick, set_term, set_txn = _SET_RESULT
        slots.drain(map(set_id, results, self.record_id.indexed(count)))
        slots.drain(map(set_timetick, results, range(self.timetick, self.timetick + count)))
        slots.drain(map(set_term, results, _repeat(self.term, count)))
        slots.drain(map(set_txn, results, _repeat(self.txn_id, count)))
        return results

    def first(self) -> AppendResult:
        """The result of the batch's first message."""
        return AppendResult(self.record_id, self.timetick, self.term, self.txn_id)

    @classmethod
    def of(cls, first: AppendResult, count: int) -> BatchAppendResult:
        """The result of a batch of ``count`` messages whose first got ``first``,
        built through its slots (one per appended batch and per remembered dedup
        key: the generated ``__init__`` of a frozen dataclass sets fields by name,
        several times slower)."""
        batch_result: BatchAppendResult = _new(cls)
        set_id, set_count, set_timetick, set_term, set_txn = _SET_BATCH_RESULT
        set_id(batch_result, first.id)
        set_count(batch_result, count)
        set_timetick(batch_result, first.timetick)
        set_term(batch_result, first.term)
        set_txn(batch_result, first.txn_id)
        return batch_result


def append_result(mid: MessageID, timetick: int, term: int, txn_id: int) -> AppendResult:
    """``AppendResult(mid, timetick, term, txn_id)``, built through its slots in
    half the time of the frozen dataclass's ``__init__`` (one per appended
    message)."""
    result: AppendResult = _new(AppendResult)
    set_id, set_timetick, set_term, set_txn = _SET_RESULT
    set_id(result, mid)
    set_timetick(result, timetick)
    set_term(result, term)
    set_txn(result, txn_id)
    return result


_SET_RESULT = slots.setters(AppendResult)
_SET_BATCH_RESULT = slots.setters(BatchAppendResult)
"""In field order: record_id, count, timetick, term, txn_id."""
"""Setters of an AppendResult's fields in declaration order (every field is set)."""
_new = object.__new__
_repeat = itertools.repeat


class DeliverPolicy(enum.Enum):
    ALL = "all"
    LATEST = "latest"
    START_FROM = "start_from"
    START_AFTER = "start_after"


@dataclasses.dataclass(frozen=True, slots=True)
class ReadOptions:
    """Where a scanner starts and what it delivers.

    ``vchannels``: deliver only these vchannels' messages, plus messages
    without a vchannel (time ticks, fences), which go to every reader. Empty
    means every vchannel.
    ``types``: deliver only these message types; empty means all.
    ``timetick_gt`` / ``timetick_ge``: deliver only messages above (or at) it.
    Resuming a scanner: ``START_AFTER(last id)`` with ``timetick_gt=last
    timetick`` delivers exactly what follows, including non-persisted time
    ticks that share the last persisted message's id.
    """

    policy: DeliverPolicy = DeliverPolicy.ALL
    start_id: MessageID | None = None
    vchannels: Collection[str] = ()
    types: Collection[MessageType] = ()
    timetick_gt: int | None = None
    timetick_ge: int | None = None

    def accepts(self, msg: Message) -> bool:
        if self.vchannels and msg.vchannel and msg.vchannel not in self.vchannels:
            return False
        if self.types and msg.type not in self.types:
            return False
        if self.timetick_gt is not None and msg.timetick <= self.timetick_gt:
            return False
        return self.timetick_ge is None or msg.timetick >= self.timetick_ge


class WALState(enum.Enum):
    OPENING = "OPENING"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    CLOSED = "CLOSED"
    UNAVAILABLE = "UNAVAILABLE"
    CORRUPT = "CORRUPT"
    """The log is damaged: readable up to the damage, takes no appends."""

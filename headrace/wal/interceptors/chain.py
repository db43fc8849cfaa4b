"""Append interceptors and the chain that composes them.

An append travels as a batch of :class:`AppendContext` (one per valid
message of one ``append``/``append_many`` call) through the interceptors,
outermost first. Each interceptor gets only pending contexts, may settle some
itself (a dedup hit, a refused message) and passes the rest on with
``call_next``; after ``call_next`` returns every context it passed on is
settled (result or error). The innermost handler is the timetick stage,
which writes to the backend.

Interceptors must not suspend between deciding about a message and passing
it on when the decision depends on shared state that the order of the log
must reflect (the txn interceptor relies on this): the inner stages reach the
appender queue without suspending.

Besides handling appends, an interceptor may have optional capabilities
(Milvus's ``InterceptorWith...`` interfaces), each a Protocol found on it once,
when its WAL builds the chain from its declared list
(:mod:`.stages`): :class:`Drains` (writes what closes its state before the
WAL's last tick), :class:`Closes` (forgets its state when the WAL closes),
:class:`Chores` (periodic work, and when it is next due),
:class:`TickProperties` (what the WAL's own ticks and fences carry) and
:class:`Reports` (its figures in the WAL's stats). :class:`Interceptors` calls
each capability on every interceptor that has it, in the declared order: the
WAL runs one lifecycle and names no interceptor.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol, runtime_checkable

from headrace import errors, slots
from headrace.message.batch import BatchHeader
from headrace.message.types import EMPTY_PROPERTIES, Message, MessageType
from headrace.wal.api import AppendResult


@dataclasses.dataclass(frozen=True, slots=True)
class BatchPart:
    """The record batch (message format 2) a context comes from.

    ``data``: the whole verified batch, when the context carries it as one
    record (the fast path: the appender stamps it in place and stores it as it
    is; the context's message is then only a representative view of it, see
    :func:`representative`); None when the batch's one message travels
    decoded as the context's message (the per-message path)."""

    header: BatchHeader
    data: bytes | None = None

    @property
    def dedup_key(self) -> tuple[int, int] | None:
        """``(producer id, sequence)``; None for producer id 0 (not deduplicated)."""
        header = self.header
        return (header.producer_id, header.sequence) if header.producer_id else None


_SET_PART_HEADER, _SET_PART_DATA = slots.setters(BatchPart, ("header", "data"))


def whole_part(header: BatchHeader, data: bytes) -> BatchPart:
    """``BatchPart(header, data)``, built through its slots (one per appended
    whole batch; see :meth:`BatchAppendResult.of`)."""
    part = object.__new__(BatchPart)
    _SET_PART_HEADER(part, header)
    _SET_PART_DATA(part, data)
    return part


def representative(header: BatchHeader, first_type: MessageType) -> Message:
    """What the interceptors see of a whole batch: its vchannel, txn id and first
    message's type, no payload and no properties (a batch on the fast path holds
    no DDL, no transaction control and no collection message, so its messages
    look alike to every stage)."""
    return Message(first_type, header.vchannel, b"", EMPTY_PROPERTIES, 0, 0, header.txn_id)


@dataclasses.dataclass(slots=True)
class AppendContext:
    """One message, or one whole record batch, on its way through the chain.

    ``size`` is the message's encoded size as validated (a whole batch's:
    its length); the timetick stage encodes the message once, after stamping
    its timetick and term (stamps a whole batch in place). ``batch``: the
    record batch the context comes from, if any (its dedup key, and the bytes
    of a whole batch).
    """

    message: Message
    size: int
    result: AppendResult | None = None
    error: errors.HeadraceError | None = None
    batch: BatchPart | None = None

    @property
    def settled(self) -> bool:
        return self.result is not None or self.error is not None

    def fail(self, error: errors.HeadraceError) -> None:
        self.error = error


Handler = Callable[[list[AppendContext]], Awaitable[None]]


class Interceptor(Protocol):
    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        """Handle ``batch`` (all pending); pass on the contexts it did not settle."""


def build_chain(interceptors: Sequence[Interceptor], innermost: Handler) -> Handler:
    """Compose ``interceptors`` (outermost first) around ``innermost``."""
    handler = innermost
    for interceptor in reversed(interceptors):
        handler = _bind(interceptor, handler)
    return handler


def _bind(interceptor: Interceptor, call_next: Handler) -> Handler:
    async def handle(batch: list[AppendContext]) -> None:
        if batch:
            await interceptor(batch, call_next)

    return handle


@runtime_checkable
class Drains(Protocol):
    async def drain(self, write: Handler) -> None:
        """The WAL stops taking appends: write (with ``write``) what closes this
        interceptor's state, before the WAL's last tick."""


@runtime_checkable
class Closes(Protocol):
    def close(self) -> None:
        """The WAL closed: forget the state (nothing more is written)."""


@runtime_checkable
class Chores(Protocol):
    def chore_due_s(self) -> float | None:
        """Seconds until :meth:`chore` has work (None: none pending)."""

    async def chore(self, write: Handler) -> None:
        """Do the periodic work (writing with ``write``) if it is due."""


@runtime_checkable
class TickProperties(Protocol):
    def tick_properties(self) -> Mapping[str, str]:
        """What the WAL's own ticks and fences carry for this interceptor."""


@runtime_checkable
class Reports(Protocol):
    def stats(self) -> Mapping[str, object]:
        """This interceptor's figures, merged into the WAL's stats."""


class Interceptors:
    """A WAL's interceptors in their declared order, with their capabilities
    found once, and the chains built from them."""

    def __init__(
        self, interceptors: Sequence[Interceptor], plain: Sequence[Interceptor], innermost: Handler
    ) -> None:
        """``plain``: the ones that plain messages (no properties, no
        transaction, no DDL) must pass; a subsequence of ``interceptors``."""
        if any(p not in interceptors for p in plain):
            raise errors.InvalidArgument(
                "the plain chain must take its interceptors from the declared list"
            )
        self.all = tuple(interceptors)
        self.chain = build_chain(self.all, innermost)
        self.plain_chain = build_chain([i for i in self.all if i in plain], innermost)
        self._drains = [i for i in self.all if isinstance(i, Drains)]
        self._closes = [i for i in self.all if isinstance(i, Closes)]
        self._chores = [i for i in self.all if isinstance(i, Chores)]
        self._ticks = [i for i in self.all if isinstance(i, TickProperties)]
        self._reports = [i for i in self.all if isinstance(i, Reports)]

    async def drain(self, write: Handler) -> None:
        for interceptor in self._drains:
            await interceptor.drain(write)

    def close(self) -> None:
        for interceptor in self._closes:
            interceptor.close()

    def chore_due_s(self) -> float | None:
        due = [d for d in (i.chore_due_s() for i in self._chores) if d is not None]
        return min(due, default=None)

    async def chores(self, write: Handler) -> None:
        for interceptor in self._chores:
            await interceptor.chore(write)

    def tick_properties(self) -> dict[str, str]:
        properties: dict[str, str] = {}
        for interceptor in self._ticks:
            properties.update(interceptor.tick_properties())
        return properties

    def stats(self) -> dict[str, object]:
        figures: dict[str, object] = {}
        for interceptor in self._reports:
            figures.update(interceptor.stats())
        return figures

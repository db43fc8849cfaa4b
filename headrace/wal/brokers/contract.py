"""What a broker backend implements to use the toolkit.

Three small parts, all blocking (the toolkit runs them in threads, never on
the event loop):

* :class:`Link` — the pchannel's topic as a writer sees it: a look at its end,
  taking it with the broker's exclusive producer, sending stamped records.
* :class:`Source` — the pchannel's topic as a reader sees it: data records in
  id order from a start position.
* :class:`Boundary` — the backend's error translation, applied once where a
  client call returns to the toolkit.

:mod:`headrace.wal.brokers.testing` holds the checks every link and source
passes; each backend runs them in one line.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from headrace import errors
from headrace.message.ids import MessageID
from headrace.wal.brokers.stamps import I, Kind, Stamp
from headrace.wal.contract import Record

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True, slots=True)
class End(Generic[I]):
    """The topic's end as one look saw it."""

    last: Stamp[I] | None
    """Stamp of the last record of any kind; None if the topic has none."""
    last_data: I | None
    """Id of the last data record; None if there is none."""


EMPTY: End[Any] = End(None, None)


def end_of(last_id: I, last: Stamp[I]) -> End[I]:
    """The end whose last record is ``last_id`` with ``last`` (pure)."""
    return End(last, last_id if last.kind is Kind.DATA else last.prev)


class Lost(Exception):
    """The broker fenced this link's producer (somebody took the topic).

    Not an error past the toolkit: the writer decides whether to take the
    topic back. ``written`` are the ids of the records of the send that were
    stored before (in order, a prefix of it). ``final``: they stay readable
    whoever writes next, so the appends they complete are acknowledged even
    if the writer turns out to be fenced. ``unsettled``: whether the rest of
    the send was stored is unknown until the link takes its topic again (the
    take's fence record settles it, and :meth:`Link.recovered` then names what
    was stored); if the writer cannot take it, their outcome stays unknown.
    """

    def __init__(
        self, written: Sequence[MessageID] = (), *, final: bool = False, unsettled: bool = False
    ) -> None:
        super().__init__(list(written))
        self.written: list[MessageID] = list(written)
        self.final = final
        self.unsettled = unsettled


class Link(Protocol[I]):
    """One writer's hold on a pchannel's topic."""

    pchannel: str
    topic: str

    def look(self) -> End[I]:
        """The topic's end as the broker lets it be read now.

        It may lag: a send that just returned can show a moment later (Kafka's
        last stable offset), and a record in flight at a take may be stored
        after the look (Pulsar; :meth:`stored` is the check for that).
        """

    def take(self) -> None:
        """Become the topic's exclusive producer, fencing the previous one."""

    def held(self) -> bool:
        """Whether the link holds a producer (it lost none since :meth:`take`)."""

    def send(self, records: Sequence[bytes], stamp: Stamp[I]) -> list[I]:
        """Store ``records`` in order, each with ``stamp``; their ids.

        Raises :class:`Lost` (and then holds no producer) when the broker
        fenced the producer; other failures as :mod:`headrace.errors` types.
        """

    def recovered(self, records: Sequence[bytes]) -> list[I]:
        """After the link took its topic back from whoever fenced its producer: the
        ids of the leading ``records`` (the unacknowledged rest of the send that
        raised :class:`Lost`) that the broker stored anyway, their receipts lost
        with the producer. Empty if there are none, or if ``records`` are not that
        rest."""

    def stored(self, after: I | None, until: I) -> Sequence[tuple[I, Stamp[I]]] | None:
        """The stamps of the records after ``after`` (from the start when None)
        and before ``until``, read from storage; None if the link does not need
        this check (its broker never stores a record in flight at a take before
        the new producer's first record)."""

    def drop(self) -> None:
        """Let the producer go (the link holds none afterwards)."""

    def release(self) -> None:
        """Flush and close everything the link holds; the last call."""


class Source(Protocol):
    """A reader's consumer of a pchannel's topic, positioned when opened."""

    topic: str

    def open(self) -> None:
        """Connect and position at the start the source was made with."""

    def fetch(self, max_records: int, wait_s: float) -> list[Record]:
        """The next data records (fence records skipped), at most ``max_records``,
        waiting at most about ``wait_s`` for the first. Empty if none came.

        Raises :class:`headrace.errors.Truncated` when the next record to read
        was truncated away.
        """

    def release(self) -> None:
        """Close the consumer; the last call."""


@dataclasses.dataclass(frozen=True, slots=True)
class Boundary:
    """Where a backend's client calls return to the toolkit.

    ``library`` are the client library's exception types; ``translate(exc,
    what)`` turns one into a :mod:`headrace.errors` type. A client call that
    lets one escape gets it translated here, once; errors already translated
    pass unchanged, and anything else (a bug) is not disguised.
    """

    backend: str
    library: tuple[type[BaseException], ...]
    translate: Callable[[BaseException, str], errors.HeadraceError]

    def call(self, what: str, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)``, its library errors translated as met while doing ``what``."""
        try:
            return fn(*args)
        except self.library as exc:
            raise self.translate(exc, what) from None

    async def run(
        self, executor: concurrent.futures.Executor, what: str, fn: Callable[..., _T], *args: Any
    ) -> _T:
        """:meth:`call` in one of ``executor``'s threads."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(executor, self.call, what, fn, *args)

"""The checks every broker backend's toolkit parts pass (the toolkit's test framework).

A backend's tests run them in one line against a real broker, e.g.::

    await asyncio.to_thread(check_parts, kafka_parts(bootstrap))

They hold the backend's :class:`~.contract.Link`, :class:`~.contract.Source`
and :class:`~.contract.Boundary` to what :class:`~.writer.BrokerWriter` and
:class:`~.reader.BrokerReader` rely on: the end a look reports, ids in order,
fence records hidden from readers, a take (and its fence record) fencing the
previous producer, and library errors translated. The calls block; failures raise AssertionError
naming the part. No test library is imported here.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from typing import Any, Generic

from headrace import errors
from headrace.wal.brokers.contract import EMPTY, Boundary, End, Link, Lost, Source
from headrace.wal.brokers.stamps import I, Kind, Stamp
from headrace.wal.contract import Record, StartPosition

WAIT_S = 20.0
"""Hang guard for reads that must find records (never a timing assertion)."""


@dataclasses.dataclass(frozen=True)
class Parts(Generic[I]):
    """What a backend hands the checks."""

    link: Callable[[str], Link[I]]
    """A new link to the (prepared) topic of a pchannel."""
    source: Callable[[str, StartPosition], Source]
    """A new, unopened source of a pchannel's topic from a start."""
    boundary: Boundary
    library_error: Callable[[], BaseException]
    """An exception of the client library, as a failed call raises it."""
    close: Callable[[], None] = lambda: None
    displaced_by_fenced: bool = False
    """Whether a fenced link's late record can make the owner's next send raise Lost
    (links that fence by where records land rather than by the broker refusing)."""


def check_parts(parts: Parts[Any]) -> None:
    """Run every check on fresh pchannels; close ``parts`` at the end."""
    try:
        for check in (check_writing, check_taking, check_boundary):
            check(parts, f"check-{uuid.uuid4().hex[:10]}")
    finally:
        parts.close()


def check_writing(parts: Parts[I], pchannel: str) -> None:
    """A look, a take, sends with stamps, the end they leave and what sources read."""
    link = parts.link(pchannel)
    try:
        assert link.look() == EMPTY, f"a new topic's end is {link.look()}, not empty"
        link.take()
        assert link.held(), "the link holds no producer after take()"
        opening: Stamp[I] = Stamp(Kind.FENCE, 1, 11)
        [fence_id] = link.send([b""], opening)
        _settles(link, End(opening, None))
        data: Stamp[I] = Stamp(Kind.DATA, 1, 11)
        ids = link.send([b"a", b"b", b"c"], data)
        assert len(ids) == 3 and fence_id < ids[0] < ids[1] < ids[2], f"ids {fence_id} {ids}"
        _settles(link, End(data, ids[-1]))
        closing = Stamp(Kind.FENCE, 2, 22, ids[-1])
        [second_fence] = link.send([b""], closing)
        _settles(link, End(closing, ids[-1]))
        stored = link.stored(None, second_fence)
        if stored is not None:
            expected = [(fence_id, opening)] + [(mid, data) for mid in ids]
            assert list(stored) == expected, f"stored before the fence: {stored}"
    finally:
        link.release()
    everything = [Record(mid, bytes([byte])) for mid, byte in zip(ids, b"abc", strict=True)]
    assert _read(parts, pchannel, StartPosition.earliest(), 3) == everything
    assert _read(parts, pchannel, StartPosition.after(ids[0]), 2) == everything[1:]
    assert _read(parts, pchannel, StartPosition.at(ids[2]), 1) == everything[2:]


def check_taking(parts: Parts[I], pchannel: str) -> None:
    """A second link's take and fence record fence the first: its send raises Lost,
    storing nothing. (Each take is followed by a fence record, as the writer does.)"""
    first, second = parts.link(pchannel), parts.link(pchannel)
    try:
        data: Stamp[I] = Stamp(Kind.DATA, 1, 1)
        first.take()
        first.send([b""], Stamp(Kind.FENCE, 1, 1))
        [kept] = first.send([b"kept"], data)
        second.take()
        second.send([b""], Stamp(Kind.FENCE, 2, 2))
        try:
            first.send([b"lost"], data)
        except Lost as lost:
            assert lost.written == [], f"a fenced send stored {lost.written}"
        else:
            raise AssertionError("a send after another link's take() did not raise Lost")
        assert not first.held(), "a link that lost its producer still holds it"
        second_data: Stamp[I] = Stamp(Kind.DATA, 2, 2)
        try:
            [after] = second.send([b"after"], second_data)
        except Lost as lost:
            # A link whose fencing is where records land (Kafka's chained one):
            # the fenced send's record landed after the fence record, so the
            # owner's next record is out of place too; the owner takes again.
            assert parts.displaced_by_fenced, "the new owner lost its producer to a fenced link"
            assert lost.written == [], f"a displaced send acknowledged {lost.written}"
            second.take()
            second.send([b""], Stamp(Kind.FENCE, 2, 2))
            [after] = second.send([b"after"], second_data)
        assert after > kept
    finally:
        first.release()
        second.release()
    records = _read(parts, pchannel, StartPosition.earliest(), 2)
    assert [r.data for r in records] == [b"kept", b"after"], f"read back {records}"


def check_boundary(parts: Parts[Any], pchannel: str) -> None:
    """A library exception leaves the boundary as a Headrace error; others pass as they are."""
    library = parts.library_error()
    assert isinstance(library, parts.boundary.library), f"{library!r} is not a library error"

    def fails(error: BaseException) -> None:
        raise error

    try:
        parts.boundary.call(f"checking {pchannel}", fails, library)
    except errors.HeadraceError as translated:
        assert pchannel in str(translated), f"{translated!r} does not say what failed"
    else:
        raise AssertionError(f"{library!r} left the boundary untranslated")
    closed = errors.Closed("already a Headrace error")
    try:
        parts.boundary.call(f"checking {pchannel}", fails, closed)
    except errors.Closed as passed:
        assert passed is closed, f"{closed!r} was translated again, to {passed!r}"


def _settles(link: Link[I], expected: End[I]) -> None:
    """A look shows ``expected`` once the broker makes the last send readable (Kafka's
    last stable offset passes a transaction's marker a moment after the commit)."""
    deadline = time.monotonic() + WAIT_S
    seen = link.look()
    while seen != expected:
        assert time.monotonic() < deadline, f"the end stays {seen}, not {expected}"
        time.sleep(0.05)
        seen = link.look()


def _read(parts: Parts[Any], pchannel: str, start: StartPosition, count: int) -> list[Record]:
    """``count`` records from ``start``, then checks that nothing follows."""
    source = parts.source(pchannel, start)
    records: list[Record] = []
    try:
        source.open()
        deadline = time.monotonic() + WAIT_S
        while len(records) < count:
            assert time.monotonic() < deadline, f"read {records} of {count} from {start}"
            records += source.fetch(count - len(records), 0.2)
        extra = source.fetch(10, 0.2)
        assert extra == [], f"records past the last one: {extra}"
    finally:
        source.release()
    return records

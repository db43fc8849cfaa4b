"""The broker writer: fence check, reacquire loop and group commit over a :class:`Link`.

Fencing is the broker's (a new exclusive producer fences the old one); the
term rule sits on top: before and after taking the topic the writer looks at
its end and refuses to follow a higher term (:func:`~.stamps.fence_check`);
then it writes a fence record carrying its term. Where the broker may store a
record that was in flight at the take before that fence record, the writer
reads that range back and yields to a higher term found there
(:func:`~.stamps.overtaken`). A writer that loses its producer to a *lower*
term (a stale opener that then gave up) takes it back and sends what was not
stored (what the broker stored without a receipt reaching the writer is
:meth:`~.contract.Link.recovered`, not sent again), so the highest term
always wins.

Appends arriving while a send is in flight go out together in the next one
(:mod:`headrace.wal.groupcommit`); each call's records stay consecutive.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from typing import Generic

from headrace import errors
from headrace.message.batch import Stamped
from headrace.message.ids import MessageID
from headrace.wal.brokers.contract import Boundary, Link, Lost
from headrace.wal.brokers.stamps import I, Kind, Stamp, fence_check, new_nonce, overtaken
from headrace.wal.contract import BackendWriter
from headrace.wal.groupcommit import Future, GroupCommit, PartlyWritten, failed
from headrace.wal.iothread import IOThread, call_in, call_job

LOG = logging.getLogger("headrace.wal.brokers")
MAX_REACQUIRE = 3
"""How many times a writer takes its topic for one open or one send before giving up."""


def unsent(records: Sequence[bytes], written: Sequence[MessageID]) -> Sequence[bytes]:
    """The records of a send still to go after ``written`` were stored (pure)."""
    return records[len(written) :]


def unknown_outcome(failure: errors.HeadraceError, records: int) -> errors.HeadraceError:
    """What callers get when the writer could not take its topic again to settle
    ``records`` records of unknown outcome (pure): never Fenced, which would
    say they were not stored, when they may be (read, before the newer fence
    record); the writer learns it is fenced again at its next take."""
    if not isinstance(failure, errors.Fenced):
        return failure
    return errors.Unavailable(
        f"{records} records were sent but their delivery is unknown, and the writer could "
        f"not take the topic again to settle it ({failure.message}): they may be stored"
    )


def sendable(record: bytes | Stamped) -> bytes:
    """``record`` as the immutable bytes a send takes (pure): a stamped record
    batch joined into a copy made for the send alone.

    The copy is not kept in the :class:`Stamped` (:meth:`Stamped.joined` would):
    the write-ahead buffer keeps the producer's bytes and the stamp apart, as
    the local WAL's does, and the copy is freed once the send is done, so the
    next one reuses its memory. A copy kept by the buffer took fresh memory
    for every batch: 16 page faults per 64 KiB batch, on the event loop (issue
    #14). A mutable buffer is copied too (its owner may reuse it)."""
    return record.copy() if isinstance(record, Stamped) else bytes(record)


class BrokerWriter(BackendWriter, Generic[I]):
    """The one writer of a pchannel under a term, over a backend's :class:`Link`."""

    def __init__(self, link: Link[I], term: int, boundary: Boundary) -> None:
        self.pchannel = link.pchannel
        self.term = term
        self._link = link
        self._boundary = boundary
        self._nonce = new_nonce()
        self._data: Stamp[I] = Stamp(Kind.DATA, term, self._nonce)
        name = boundary.backend
        self._where = f"{name}: pchannel {link.pchannel} (topic {link.topic})"
        self._thread: IOThread[Callable[[], None]] = IOThread(
            f"{name}-writer-{link.pchannel}", call_job
        )
        """Runs every blocking call of this writer (take, sends, release), in order."""
        self._group = GroupCommit(self._write, self._thread, what=f"{name} append to {link.topic}")
        self._closed = False

    # ---- opening ---------------------------------------------------------------------

    async def open(self) -> None:
        try:
            await self._run(f"taking {self._link.topic}", self._acquire)
        except BaseException:
            await self.close()
            raise

    async def _run(self, what: str, fn: Callable[[], None]) -> None:
        """``fn()`` in the writer's thread, its library errors translated."""
        await call_in(self._thread, what, functools.partial(self._boundary.call, what, fn))

    def _check(self, *, reacquire: bool) -> I | None:
        """Raise Fenced if a term that fences this writer holds the topic; the last data id."""
        end = self._link.look()
        fenced = fence_check(self.pchannel, self.term, self._nonce, end.last, reacquire=reacquire)
        if fenced is not None:
            raise fenced
        return end.last_data

    def _acquire(self, reacquire: bool = False) -> None:
        """Take the topic and write the fence record (blocking)."""
        link = self._link
        for _ in range(MAX_REACQUIRE):
            self._check(reacquire=reacquire)
            link.take()
            try:
                prev = self._check(reacquire=reacquire)
                [fence_id] = link.send([b""], Stamp(Kind.FENCE, self.term, self._nonce, prev))
            except Lost:
                reacquire = True
                continue
            except BaseException:
                # No fence record of this take is stored: the link must not count
                # as held, or the next append would send data without one.
                link.drop()
                raise
            self._verify(prev, fence_id, reacquire=reacquire)
            return
        raise self._gave_up()

    def _verify(self, prev: I | None, fence_id: I, *, reacquire: bool) -> None:
        """Raise Fenced if a record of a term that fences this writer lies before its
        fence record, after the last data record the check saw."""
        before = self._link.stored(prev, fence_id)
        if before is None:
            return
        found = overtaken(self.pchannel, self.term, self._nonce, before, prev, reacquire=reacquire)
        if found is None:
            return
        try:
            self._link.send([b""], found.restore)
        except (Lost, errors.Unavailable) as exc:
            LOG.debug("%s: no restore record after a stale fence: %r", self._where, exc)
        self._link.drop()
        raise found.fenced

    def _gave_up(self) -> errors.Unavailable:
        return errors.Unavailable(
            f"{self._where} kept losing its producer to other openers; gave up after "
            f"{MAX_REACQUIRE} attempts"
        )

    # ---- appending -------------------------------------------------------------------

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        return await self.start_append(records)

    def start_append(
        self, records: Sequence[bytes], on_done: Callable[[Future], None] | None = None
    ) -> Future:
        """:meth:`append`, whose send starts now if none is in flight."""
        return self.start_append_stamped(records, on_done)

    def start_append_stamped(
        self, records: Sequence[bytes | Stamped], on_done: Callable[[Future], None] | None = None
    ) -> Future:
        """:meth:`start_append` of records some of which are stamped record batches
        not joined yet: each is joined for its send alone (:func:`sendable`), on
        the event loop (while a send is in flight, the next group's copies are
        made meanwhile, not in the writer's thread between its sends); the
        caller's stays unjoined."""
        if self._closed:
            closed = (
                f"{self._boundary.backend} writer of {self.pchannel} (term {self.term}) is closed"
            )
            return failed(errors.Closed(closed), on_done)
        return self._group.start([sendable(r) for r in records], on_done)

    def _write(self, batch: list[bytes]) -> list[MessageID]:
        return self._boundary.call(f"appending to {self._link.topic}", self._send, batch)

    def _send(self, batch: list[bytes]) -> list[MessageID]:
        """Send ``batch``; on losing the topic to a lower term, take it back and send the rest.

        Records a lost send stored for good (:attr:`Lost.final`) complete their
        appends even if the writer then fails (:class:`PartlyWritten`)."""
        if self._group.fenced is not None:
            raise self._group.fenced
        written: list[MessageID] = []
        final = 0
        unsettled = False
        try:
            for _ in range(MAX_REACQUIRE):
                if not self._link.held():
                    self._acquire(True)
                    written += self._link.recovered(unsent(batch, written))
                    unsettled = False
                try:
                    written += self._link.send(unsent(batch, written), self._data)
                    return written
                except Lost as lost:
                    written += lost.written
                    final = len(written) if lost.final else final
                    unsettled = lost.unsettled
            raise self._gave_up()
        except errors.HeadraceError as exc:
            failure = unknown_outcome(exc, len(batch) - len(written)) if unsettled else exc
            if not final:
                raise failure from None
            raise PartlyWritten(failure, written[:final]) from None

    # ---- closing ---------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._group.drain()
        try:
            await self._run(f"closing {self._link.topic}", self._link.release)
        finally:
            self._thread.stop()

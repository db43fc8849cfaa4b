"""The WALs a node holds, and what it knows of the others' owners.

All opening and closing of a pchannel's WAL goes through :class:`WALManager`,
serialised per pchannel. Request handlers look a WAL up with :meth:`get`, which
answers NOT_OWNER with the owner this node knows from the metastore when the
pchannel is not served here.

A WAL that cannot be opened (its broker is down, say) is not served, and the
node keeps running: the last failure is kept in :attr:`WALManager.failures`
(the Manager service lists it as ``UNAVAILABLE`` with the error), :meth:`get`
answers UNAVAILABLE (retryable) while the pchannel is assigned here, and the
assignment reactor retries the open with backoff. Every open is bounded by
:func:`headrace.wal.framework.open_timeout` so an unreachable broker cannot hang it.

A WAL whose log turns out to be damaged (CorruptData while opening, or a
reader of a serving WAL finding a damaged record) is held
as a :class:`DamagedWAL` in state CORRUPT: the pchannel stays assigned here,
readable up to the damage, and refuses appends with the CORRUPT error naming
the file and offset; the node's other pchannels are not affected. Opening it
again is tried only as :class:`DamageRetry` allows (every two minutes at
most), so a repaired log is picked up without the node spinning on a damaged one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Mapping
from typing import Protocol

from headrace import errors, logs
from headrace.cluster import Assignment, AssignmentState, ClusterConfig
from headrace.node.errors import NotOwnerAt
from headrace.node.formats import WriteFormats
from headrace.tso import TimestampAllocator
from headrace.wal.api import WALState
from headrace.wal.contract import Backend, where
from headrace.wal.damaged import DamagedWAL
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.hosted import HostedWAL
from headrace.wal.interceptors.segments import CollectionHooks
from headrace.wal.ticks import TickScheduler

log = logging.getLogger(__name__)


class WALEvents(Protocol):
    """What is told of the manager's opens and releases (metrics)."""

    def opened(self, outcome: str, seconds: float) -> None: ...

    def released(self, drained: bool, seconds: float) -> None: ...


class _NoEvents:
    def opened(self, outcome: str, seconds: float) -> None:
        pass

    def released(self, drained: bool, seconds: float) -> None:
        pass


NO_EVENTS: WALEvents = _NoEvents()


@dataclasses.dataclass(frozen=True, slots=True)
class OpenFailure:
    """The last failed open of a pchannel's WAL on this node."""

    pchannel: str
    term: int
    error: errors.HeadraceError
    attempts: int
    """Failed opens in a row at this term."""
    since: float
    """time.time() of the first of them."""
    last: float
    """time.time() of the latest."""

    def stats(self) -> dict[str, str]:
        return {
            "error": str(self.error),
            "retryable": str(self.error.retryable).lower(),
            "attempts": str(self.attempts),
            "failing_since": f"{self.since:.3f}",
            "last_attempt": f"{self.last:.3f}",
        }


def next_failure(
    previous: OpenFailure | None, pchannel: str, term: int, error: errors.HeadraceError, now: float
) -> OpenFailure:
    """The failure record after one more failed open (pure)."""
    if previous is None or previous.term != term:
        return OpenFailure(pchannel, term, error, 1, now, now)
    return dataclasses.replace(previous, error=error, attempts=previous.attempts + 1, last=now)


@dataclasses.dataclass(frozen=True, slots=True)
class DamageRetry:
    """How often a damaged log is opened again: ``base_s`` after the first
    failure, doubling with each further one, at most ``cap_s`` apart."""

    base_s: float = 5.0
    cap_s: float = 120.0

    def delay(self, attempts: int) -> float:
        return min(self.cap_s, self.base_s * 2.0 ** min(max(attempts, 1) - 1, 30))

    def due(self, failure: OpenFailure, now: float) -> bool:
        """Whether the next open of the damaged log may start at ``now`` (pure)."""
        return now - failure.last >= self.delay(failure.attempts)


@dataclasses.dataclass(slots=True)
class Directory:
    """The cluster state this node learned from the metastore watch."""

    assignments: dict[str, Assignment] = dataclasses.field(default_factory=dict)
    addresses: dict[str, str] = dataclasses.field(default_factory=dict)
    config: ClusterConfig | None = None


def not_owner_hint(pchannel: str, node_id: str, directory: Directory) -> NotOwnerAt:
    """The NOT_OWNER answer for ``pchannel``, naming the owner if known."""
    record = directory.assignments.get(pchannel)
    if record is None:
        return NotOwnerAt(f"node {node_id} does not serve {pchannel}; no owner is recorded")
    owner = ""
    if record.state in (AssignmentState.ASSIGNING, AssignmentState.ASSIGNED):
        owner = record.node if record.node != node_id else ""
    elif record.state is AssignmentState.UNASSIGNING:
        owner = record.target
    if not owner:
        return NotOwnerAt(
            f"node {node_id} does not serve {pchannel} "
            f"(state {record.state.value}, term {record.term})",
            term=record.term,
        )
    address = record.address if owner == record.node else ""
    address = address or directory.addresses.get(owner, "")
    return NotOwnerAt(
        f"node {node_id} does not serve {pchannel}; owner is {owner} at term {record.term}",
        owner=owner,
        term=record.term,
        address=address,
    )


class WALManager:
    """Opens, closes and looks up the WALs of one node."""

    def __init__(
        self,
        node_id: str,
        backend: Backend,
        tso: TimestampAllocator,
        options: WALOptions,
        *,
        open_timeout_s: float | None = None,
        damage_retry: DamageRetry = DamageRetry(),
        collections: CollectionHooks | None = None,
        formats: WriteFormats | None = None,
    ) -> None:
        self.node_id = node_id
        self.formats = formats
        """Checks and records the message format of each WAL before it opens
        (None: the options' format, unchecked; for WALs without a metastore)."""
        self.collections = collections
        """Given to every WAL it opens (collection lookups, checkpoints, seal records)."""
        self.backend = backend
        self.tso = tso
        self.options = (
            options
            if open_timeout_s is None
            else dataclasses.replace(options, open_timeout_s=open_timeout_s)
        )
        self.damage_retry = damage_retry
        self.directory = Directory()
        self._held: dict[str, HostedWAL] = {}
        self._failures: dict[str, OpenFailure] = {}
        self._damaged: dict[str, OpenFailure] = {}
        self.events: WALEvents = NO_EVENTS
        """Told of every open and release (the node's metrics)."""
        """Failed opens of held damaged logs (for pacing their retries)."""
        self._locks: dict[str, asyncio.Lock] = {}
        self._accepting = True
        self.scheduler = TickScheduler(node_id)
        """One timer loop for the ticks and chores of every WAL of this node."""

    def _lock(self, pchannel: str) -> asyncio.Lock:
        return self._locks.setdefault(pchannel, asyncio.Lock())

    @property
    def held(self) -> Mapping[str, HostedWAL]:
        return self._held

    def held_term(self, pchannel: str) -> int | None:
        wal = self._held.get(pchannel)
        return None if wal is None else wal.term

    @property
    def failures(self) -> Mapping[str, OpenFailure]:
        """The last failed open of each pchannel not served since."""
        return self._failures

    def broken(self, pchannel: str, term: int) -> bool:
        """Whether this node lost ``pchannel`` at ``term`` to a backend failure:
        its held WAL turned UNAVAILABLE (or is damaged and due for another
        try), or opening it failed (nothing held)."""
        wal = self._held.get(pchannel)
        if wal is not None:
            return wal.term == term and self._needs_reopen(pchannel, wal)
        failure = self._failures.get(pchannel)
        return failure is not None and failure.term == term

    def failed_held(self) -> list[str]:
        """The held WALs to open again (none once shutting down): those a backend
        failure made UNAVAILABLE, and damaged ones as :class:`DamageRetry` allows."""
        if not self._accepting:
            return []
        return [name for name, wal in self._held.items() if self._needs_reopen(name, wal)]

    def _needs_reopen(self, pchannel: str, wal: HostedWAL) -> bool:
        """A held WAL failed in its backend, or is a damaged log due for another try."""
        state = wal.state
        if state is WALState.UNAVAILABLE:
            return True
        if state is WALState.CORRUPT and isinstance(wal, WAL):
            return True  # a reader found damage: hold it as a DamagedWAL now
        damaged = self._damaged.get(pchannel)
        return (
            state is WALState.CORRUPT
            and damaged is not None
            and self.damage_retry.due(damaged, time.time())
        )

    def forget_failure(self, pchannel: str) -> None:
        """The pchannel is no longer to be opened here: stop reporting its failure."""
        self._failures.pop(pchannel, None)

    def get(self, pchannel: str) -> HostedWAL:
        """The serving (or damaged, read-only) WAL of ``pchannel``.

        Unavailable (retryable) while it is assigned here but cannot be
        opened, or failed in its backend and is being reopened; else NotOwner
        (with hint) if it is not served here.
        """
        wal = self._held.get(pchannel)
        if wal is not None and wal.state in _HOSTING and self._accepting:
            return wal
        if wal is not None and wal.state is WALState.UNAVAILABLE and self._accepting:
            raise errors.Unavailable(
                f"the WAL of {pchannel} on node {self.node_id} (term {wal.term}) failed in its "
                "backend; the node reopens it"
            )
        failure = self._failures.get(pchannel)
        if wal is None and failure is not None and self._accepting and self._assigned_here(failure):
            raise errors.Unavailable(
                f"node {self.node_id} cannot open the WAL of {pchannel} (term {failure.term}, "
                f"{failure.attempts} failed attempts, retrying): {failure.error.message}"
            )
        raise self.not_owner(pchannel)

    def _assigned_here(self, failure: OpenFailure) -> bool:
        record = self.directory.assignments.get(failure.pchannel)
        return (
            record is not None
            and record.node == self.node_id
            and record.state in (AssignmentState.ASSIGNING, AssignmentState.ASSIGNED)
            and record.term == failure.term
        )

    def not_owner(self, pchannel: str) -> NotOwnerAt:
        return not_owner_hint(pchannel, self.node_id, self.directory)

    async def open(self, pchannel: str, term: int) -> HostedWAL:
        """Serve ``pchannel`` under ``term``; idempotent for the term held.

        A term lower than the one held raises Fenced; a higher one replaces
        the held WAL (fenced by the backend anyway). A damaged log is held
        (and returned) as a :class:`DamagedWAL`; a held one is opened again.
        """
        # The WAL's own tasks start in here: their log lines (JSON logs)
        # carry the pchannel and the term they serve.
        started = time.monotonic()
        before = self._held.get(pchannel)
        with logs.bound(pchannel=pchannel, term=term):
            try:
                wal = await self._open(pchannel, term)
            except errors.Fenced:
                self.events.opened("fenced", time.monotonic() - started)
                raise
            except errors.HeadraceError:
                self.events.opened("failed", time.monotonic() - started)
                raise
        if wal is not before:  # not the WAL already held at this term
            outcome = "served" if wal.state is WALState.SERVING else wal.state.value.lower()
            self.events.opened(outcome, time.monotonic() - started)
        return wal

    async def _open(self, pchannel: str, term: int) -> HostedWAL:
        if not self._accepting:
            raise errors.Unavailable(f"node {self.node_id} is shutting down")
        async with self._lock(pchannel):
            held = self._held.get(pchannel)
            if held is not None:
                if held.term > term:
                    raise errors.Fenced(
                        f"{pchannel} is held at term {held.term}; cannot open term {term}",
                        term=term,
                        current_term=held.term,
                    )
                if held.term == term and held.state is WALState.SERVING:
                    return held
                known = held.damage if isinstance(held, WAL) and held.term == term else None
                await self._close_held(pchannel, held, drain=False)
                if known is not None:
                    return self._hold_damaged(pchannel, term, known)
            try:
                wal = await self._open_bounded(pchannel, term, await self._write_format(pchannel))
            except errors.Fenced:
                self._failures.pop(pchannel, None)
                raise
            except errors.CorruptData as exc:
                return self._hold_damaged(pchannel, term, exc)
            except errors.HeadraceError as exc:
                failure = next_failure(
                    self._failures.get(pchannel), pchannel, term, exc, time.time()
                )
                self._failures[pchannel] = failure
                log.warning(
                    "node %s cannot open %s at term %d (attempt %d): %s",
                    self.node_id,
                    pchannel,
                    term,
                    failure.attempts,
                    exc,
                )
                raise
            self._failures.pop(pchannel, None)
            self._damaged.pop(pchannel, None)
            self._held[pchannel] = wal
            log.info("node %s serves %s at term %d", self.node_id, pchannel, term)
            return wal

    def _hold_damaged(self, pchannel: str, term: int, damage: errors.CorruptData) -> DamagedWAL:
        self._failures.pop(pchannel, None)
        failure = next_failure(self._damaged.get(pchannel), pchannel, term, damage, time.time())
        self._damaged[pchannel] = failure
        wal = DamagedWAL(self.backend, pchannel, term, damage, read_batch=self.options.read_batch)
        self._held[pchannel] = wal
        log.error(
            "node %s holds %s at term %d as CORRUPT (readable up to the damage, no appends; "
            "attempt %d, next try in %.0f s): %s",
            self.node_id,
            pchannel,
            term,
            failure.attempts,
            self.damage_retry.delay(failure.attempts),
            damage,
        )
        return wal

    async def _write_format(self, pchannel: str) -> int:
        if self.formats is None:
            return self.options.message_format
        return await self.formats.prepare(self.node_id, pchannel)

    async def _open_bounded(self, pchannel: str, term: int, message_format: int) -> WAL:
        """WAL.open (bounded by the options' open timeout) writing ``message_format``;
        every failure a Headrace error."""
        options = self.options
        if options.message_format != message_format:
            options = dataclasses.replace(options, message_format=message_format)
        try:
            return await WAL.open(
                self.backend,
                pchannel,
                term,
                tso=self.tso,
                options=options,
                collections=self.collections,
                scheduler=self.scheduler,
            )
        except errors.HeadraceError:
            raise
        except Exception as exc:  # an untranslated library error must not stop the node
            log.exception("opening %s at term %d failed unexpectedly", pchannel, term)
            raise errors.Unavailable(
                f"opening the WAL of {pchannel} at term {term} failed ({where(self.backend)}): "
                f"{type(exc).__name__}: {exc}"
            ) from None

    async def close(self, pchannel: str, *, drain: bool, below_term: int | None = None) -> bool:
        """Stop serving ``pchannel``; with ``drain``, finish in-flight appends first.

        ``below_term``: close only if the held term is lower (a newer record
        fenced it). Returns whether a WAL was closed.
        """
        async with self._lock(pchannel):
            held = self._held.get(pchannel)
            failure = self._failures.get(pchannel)
            if failure is not None and (below_term is None or failure.term < below_term):
                del self._failures[pchannel]
            if held is None or (below_term is not None and held.term >= below_term):
                return False
            self._damaged.pop(pchannel, None)
            await self._close_held(pchannel, held, drain=drain)
            return True

    async def _close_held(self, pchannel: str, held: HostedWAL, *, drain: bool) -> None:
        started = time.monotonic()
        with logs.bound(pchannel=pchannel, term=held.term):
            await self._release(pchannel, held, drain=drain)
        self.events.released(drain, time.monotonic() - started)

    async def _release(self, pchannel: str, held: HostedWAL, *, drain: bool) -> None:
        try:
            if drain:
                await held.drain()
        except errors.HeadraceError as exc:
            log.warning("draining %s at term %d failed: %s", pchannel, held.term, exc)
        finally:
            if self._held.get(pchannel) is held:
                del self._held[pchannel]
            try:
                await held.close()
            except errors.HeadraceError as exc:
                log.warning("closing %s at term %d failed: %s", pchannel, held.term, exc)
        log.info("node %s released %s at term %d", self.node_id, pchannel, held.term)

    async def close_all(self, *, drain: bool) -> None:
        await asyncio.gather(*(self.close(p, drain=drain) for p in list(self._held)))

    async def shutdown(self) -> None:
        """Refuse new work, then drain and close every WAL."""
        self._accepting = False
        await self.close_all(drain=True)
        await self.scheduler.close()


_HOSTING = frozenset((WALState.SERVING, WALState.CORRUPT))
"""States in which a held WAL answers requests (a damaged one refuses appends)."""

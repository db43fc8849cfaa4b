"""The WALs a node holds, and what it knows of the others' owners.

All opening and closing of a pchannel's WAL goes through :class:`WALManager`,
serialised per pchannel. Request handlers look a WAL up with :meth:`get`, which
answers NOT_OWNER with the owner this node knows from the metastore when the
pchannel is not served here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping

from headrace import errors
from headrace.cluster import Assignment, AssignmentState, ClusterConfig
from headrace.node.errors import NotOwnerAt
from headrace.tso import TimestampAllocator
from headrace.wal.api import WALState
from headrace.wal.contract import Backend
from headrace.wal.framework import WAL, WALOptions

log = logging.getLogger(__name__)


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
    ) -> None:
        self.node_id = node_id
        self.backend = backend
        self.tso = tso
        self.options = options
        self.directory = Directory()
        self._held: dict[str, WAL] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._accepting = True

    def _lock(self, pchannel: str) -> asyncio.Lock:
        return self._locks.setdefault(pchannel, asyncio.Lock())

    @property
    def held(self) -> Mapping[str, WAL]:
        return self._held

    def held_term(self, pchannel: str) -> int | None:
        wal = self._held.get(pchannel)
        return None if wal is None else wal.term

    def get(self, pchannel: str) -> WAL:
        """The serving WAL of ``pchannel``; NotOwner (with hint) if there is none."""
        wal = self._held.get(pchannel)
        if wal is None or wal.state is not WALState.SERVING or not self._accepting:
            raise self.not_owner(pchannel)
        return wal

    def not_owner(self, pchannel: str) -> NotOwnerAt:
        return not_owner_hint(pchannel, self.node_id, self.directory)

    def recorded_term(self, pchannel: str) -> int:
        record = self.directory.assignments.get(pchannel)
        return 0 if record is None else record.term

    async def open(self, pchannel: str, term: int) -> WAL:
        """Serve ``pchannel`` under ``term``; idempotent for the term held.

        A term lower than the one held raises Fenced; a higher one replaces
        the held WAL (fenced by the backend anyway).
        """
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
                await self._close_held(pchannel, held, drain=False)
            wal = await WAL.open(self.backend, pchannel, term, tso=self.tso, options=self.options)
            self._held[pchannel] = wal
            log.info("node %s serves %s at term %d", self.node_id, pchannel, term)
            return wal

    async def close(self, pchannel: str, *, drain: bool, below_term: int | None = None) -> bool:
        """Stop serving ``pchannel``; with ``drain``, finish in-flight appends first.

        ``below_term``: close only if the held term is lower (a newer record
        fenced it). Returns whether a WAL was closed.
        """
        async with self._lock(pchannel):
            held = self._held.get(pchannel)
            if held is None or (below_term is not None and held.term >= below_term):
                return False
            await self._close_held(pchannel, held, drain=drain)
            return True

    async def _close_held(self, pchannel: str, held: WAL, *, drain: bool) -> None:
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

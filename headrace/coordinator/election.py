"""Coordinator election through a metastore lease.

A candidate campaigns with one transaction: if ``Keys.leader`` is absent and
``Keys.coordinator_term`` is unchanged since it was read, put the leader key
(bound to the candidate's lease, value ``{"id", "term"}``) and the incremented
term. The winner keeps its lease alive; every write it makes as leader carries
:meth:`Leadership.guard` (leader key value and lease equal to its own), so once
it is deposed its writes fail with :class:`NotLeader` and it steps down and
campaigns again instead of crashing. Failing to renew the lease for a whole TTL
(or the lease being gone) sets :attr:`Leadership.lost`.

(:class:`headrace.metastore.session.Election` elects on a bare key; this one
also keeps the monotonic coordinator term of the cluster layout.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
from collections.abc import Sequence

from headrace import errors
from headrace.cluster import Keys, dumps
from headrace.metastore.contract import (
    Compare,
    Get,
    KeyValue,
    Metastore,
    Op,
    Put,
    TxnResult,
)
from headrace.metastore.session import Session

log = logging.getLogger(__name__)


class NotLeader(errors.Conflict):
    """This coordinator is no longer the leader; its write was not applied."""

    retryable = True


@dataclasses.dataclass(frozen=True, slots=True)
class LeaderInfo:
    coordinator_id: str
    term: int


def parse_leader(value: bytes) -> LeaderInfo:
    try:
        data = json.loads(value)
        return LeaderInfo(coordinator_id=str(data["id"]), term=int(data["term"]))
    except (ValueError, KeyError, TypeError):
        raise errors.CorruptData(f"malformed leader record {value!r}") from None


async def current_leader(metastore: Metastore, keys: Keys) -> LeaderInfo | None:
    kv = await metastore.get(keys.leader)
    return None if kv is None else parse_leader(kv.value)


@dataclasses.dataclass(slots=True)
class Leadership:
    """Held leadership: guard every write with :meth:`guarded_txn`."""

    session: Session
    keys: Keys
    coordinator_id: str
    term: int
    value: bytes

    @property
    def lease(self) -> int:
        return self.session.lease

    @property
    def lost(self) -> asyncio.Event:
        """Set once the lease is (or may be) gone, or a write found us deposed."""
        return self.session.lost

    def guard(self) -> list[Compare]:
        return [
            Compare.value_is(self.keys.leader, self.value),
            Compare.lease_is(self.keys.leader, self.lease),
        ]

    async def guarded_txn(self, compares: Sequence[Compare], success: Sequence[Op]) -> TxnResult:
        """Run ``success`` if ``compares`` hold and this is still the leader.

        Returns the result (``succeeded`` False when one of ``compares``
        failed); raises NotLeader (and sets :attr:`lost`) when deposed.
        """
        if self.lost.is_set():
            raise NotLeader(f"coordinator {self.coordinator_id} lost leadership")
        result = await self.session.store.txn(
            [*self.guard(), *compares], success, [Get(self.keys.leader)]
        )
        if result.succeeded:
            return result
        current = result.gets[0] if result.gets else []
        if not current or current[0].value != self.value or current[0].lease != self.lease:
            self.lost.set()
            raise NotLeader(f"coordinator {self.coordinator_id} (term {self.term}) was deposed")
        return result


class Election:
    """Campaigns for ``keys.leader``; the won lease is kept alive by a
    :class:`~headrace.metastore.session.Session`."""

    def __init__(
        self,
        metastore: Metastore,
        keys: Keys,
        coordinator_id: str,
        *,
        ttl: float = 3.0,
    ) -> None:
        if ttl <= 0:
            raise errors.InvalidArgument(f"election lease TTL must be positive, got {ttl}")
        self.metastore = metastore
        self.keys = keys
        self.coordinator_id = coordinator_id
        self.ttl = ttl

    async def try_acquire(self) -> Leadership | None:
        """One campaign attempt; None if somebody else leads."""
        if await self.metastore.get(self.keys.leader) is not None:
            return None
        term_kv = await self.metastore.get(self.keys.coordinator_term)
        term = _parse_term(term_kv)
        revision = 0 if term_kv is None else term_kv.mod_revision
        session = await Session.start(self.metastore, ttl=self.ttl)
        value = dumps({"id": self.coordinator_id, "term": term + 1})
        try:
            result = await self.metastore.txn(
                [
                    Compare.absent(self.keys.leader),
                    Compare.mod_revision_is(self.keys.coordinator_term, revision),
                ],
                [
                    Put(self.keys.leader, value, lease=session.lease),
                    Put(self.keys.coordinator_term, str(term + 1).encode()),
                ],
            )
        except BaseException:
            await session.close()
            raise
        if not result.succeeded:
            await session.close()
            return None
        log.info("coordinator %s elected leader, term %d", self.coordinator_id, term + 1)
        return Leadership(session, self.keys, self.coordinator_id, term + 1, value)

    async def campaign(self, stop: asyncio.Event) -> Leadership | None:
        """Campaign until elected (the Leadership) or ``stop`` is set (None)."""
        poll = min(0.5, self.ttl / 4)
        while not stop.is_set():
            try:
                leadership = await self.try_acquire()
            except errors.Unavailable as exc:
                log.warning("campaign of %s failed: %s", self.coordinator_id, exc)
                leadership = None
            if leadership is not None:
                return leadership
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), poll)
        return None

    async def resign(self, leadership: Leadership) -> None:
        """Stop renewing and revoke the lease (deleting the leader key)."""
        leadership.lost.set()
        await leadership.session.close()


def _parse_term(kv: KeyValue | None) -> int:
    if kv is None:
        return 0
    text = kv.value.decode("ascii", "replace")
    if not text.isdigit():
        raise errors.CorruptData(f"malformed coordinator term {kv.value!r}")
    return int(text)

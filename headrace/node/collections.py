"""What a node gives its WALs for collections (:class:`CollectionHooks`).

* Collection lookups, cached by name (a collection's definition never changes
  under its name; a DROP_COLLECTION or CREATE_COLLECTION makes the WAL forget
  the entry).
* The pchannel's flush checkpoint (where growing segments are rebuilt from).
* The previous owner's summary of the opaque records, from its
  :class:`~headrace.wal.retention.RetentionRecord` (retention seeds the
  history the open does not read from it).
* The owner's :class:`SealRecord`: written at ``seal_key`` only while the
  pchannel's Assignment names this node under the WAL's term in an active
  state, in one transaction comparing the Assignment's ``mod_revision`` (as
  the flush commit does), and only forward: a record at a later position is
  kept (seals of one term may be recorded out of order).
"""

from __future__ import annotations

from headrace import errors
from headrace.cluster import ACTIVE_STATES, Assignment, Keys
from headrace.message.ids import MessageID
from headrace.metastore.contract import Compare, Get, Metastore, Put
from headrace.table.collections import Collection, CollectionStore
from headrace.table.records import CheckpointRecord, SealRecord, seal_key
from headrace.wal.progress import OpaqueSummary
from headrace.wal.retention import RetentionRecord, retention_key

ATTEMPTS = 8
"""Tries of a seal record when another write races on its key."""


class NodeCollections:
    """The :class:`headrace.wal.interceptors.segments.CollectionHooks` of one node."""

    def __init__(self, metastore: Metastore, keys: Keys, node_id: str) -> None:
        self.metastore = metastore
        self.keys = keys
        self.node_id = node_id
        self._store = CollectionStore(metastore, keys)
        self._cache: dict[str, Collection] = {}

    async def collection(self, name: str) -> Collection:
        found = self._cache.get(name)
        if found is None:
            found = await self._store.get(name)
            self._cache[name] = found
        return found

    def forget(self, name: str) -> None:
        self._cache.pop(name, None)

    async def checkpoint(self, pchannel: str) -> MessageID | None:
        """The flush checkpoint; a malformed record is Unavailable (not CorruptData,
        which would hold the WAL as a damaged log): the open is retried and the
        failure reported until the record is repaired."""
        key = self.keys.checkpoint(pchannel)
        kv = await self.metastore.get(key)
        if kv is None:
            return None
        try:
            return CheckpointRecord.from_json(kv.value).position_id()
        except (errors.CorruptData, errors.InvalidArgument) as exc:
            raise errors.Unavailable(
                f"the checkpoint record {key} is malformed ({exc.message}); the WAL of "
                f"{pchannel} cannot rebuild its growing segments until it is repaired"
            ) from None

    async def opaque_summary(self, pchannel: str) -> OpaqueSummary | None:
        """The previous owner's summary of the opaque records, from its
        retention record; None if there is none or it does not decode (the
        open then keeps the history it does not read)."""
        kv = await self.metastore.get(retention_key(self.keys, pchannel))
        if kv is None:
            return None
        try:
            return RetentionRecord.from_json(kv.value).opaque_summary()
        except (errors.CorruptData, errors.InvalidArgument):
            return None

    async def record_seal(
        self, pchannel: str, term: int, position: MessageID, timetick: int
    ) -> None:
        assignment_key, key = self.keys.pchannel(pchannel), seal_key(self.keys, pchannel)
        for _ in range(ATTEMPTS):
            read = await self.metastore.txn([], [Get(assignment_key), Get(key)])
            assignment_kv = read.gets[0][0] if read.gets[0] else None
            current = read.gets[1][0] if read.gets[1] else None
            assignment = (
                None if assignment_kv is None else Assignment.from_json(assignment_kv.value)
            )
            refusal = self._refusal(pchannel, term, assignment)
            if refusal is not None:
                raise refusal
            assert assignment_kv is not None
            revision = 0
            if current is not None:
                revision = current.mod_revision
                if not _older(SealRecord.from_json(current.value), position):
                    return
            record = SealRecord(
                pchannel=pchannel,
                position=str(position),
                timetick=timetick,
                node=self.node_id,
                term=term,
            )
            result = await self.metastore.txn(
                [
                    Compare.mod_revision_is(assignment_key, assignment_kv.mod_revision),
                    Compare.mod_revision_is(key, revision),
                ],
                [Put(key, record.to_json())],
            )
            if result.succeeded:
                return
        raise errors.Unavailable(
            f"recording the seal of {pchannel} at {position}: its records kept changing; retry"
        )

    def _refusal(
        self, pchannel: str, term: int, assignment: Assignment | None
    ) -> errors.Fenced | None:
        """Why this node may not record a seal of ``pchannel`` under ``term`` (pure)."""
        if (
            assignment is not None
            and assignment.node == self.node_id
            and assignment.term == term
            and assignment.state in ACTIVE_STATES
        ):
            return None
        now = (
            "it has no assignment record"
            if assignment is None
            else f"it is {assignment.state.value} on {assignment.node or 'no node'} "
            f"at term {assignment.term}"
        )
        return errors.Fenced(
            f"node {self.node_id} cannot record a seal of {pchannel} under term {term}: {now}",
            term=term,
            current_term=0 if assignment is None else assignment.term,
        )


def _older(record: SealRecord, position: MessageID) -> bool:
    """Whether ``record`` is before ``position`` (an unreadable one is replaced)."""
    try:
        return record.position_id() < position
    except errors.HeadraceError:
        return True

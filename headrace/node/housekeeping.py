"""The owner node's housekeeping pass: truncation, flush state, status.

One loop per node (a guarded task) runs a pass every
``RetentionOptions.pass_interval_s`` over every WAL the node serves:

1. **Read**, in one metastore transaction: the cluster config (its pchannel
   list routes vchannels, :func:`headrace.cluster.route`), the collections,
   and the Assignment, flush checkpoint and status record of every pchannel.
   A metastore that does not answer, or a record that does not decode, ends
   the pass with a warning: nothing is truncated on information the node
   could not read; the next pass tries again.
2. Per pchannel **this node owns under the WAL's term** (ASSIGNING or
   ASSIGNED): tell the WAL's :class:`~headrace.wal.progress.Progress` the
   collections with a shard on it and the checkpoint (back-pressure reads
   them), note the tail as a sample, and run the pure
   :func:`headrace.wal.retention.decide` on the samples and the WAL's opaque
   spans (retention holds back only where opaque records lie).
3. **Truncate** the backend below the decided point when it moved forward
   since the last truncation under this term. A failing backend is logged and
   tried again next pass.
4. **Record** what it saw (checkpoint, unflushed bytes, truncation point,
   reason, and the :class:`~headrace.wal.progress.OpaqueSummary` the next
   owner's open seeds its opaque history from, known up to the tail the
   previous pass saw) at ``<root>/retention/<pchannel>``, only
   when it changed, compared against the Assignment's revision read in step 1
   (so a deposed owner never writes it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Mapping
from typing import TypeVar

from headrace import errors, tso
from headrace.cluster import Assignment, AssignmentState, ClusterConfig, Keys
from headrace.message.ids import MessageID
from headrace.metastore.contract import Compare, Get, KeyValue, Metastore, Put
from headrace.node.walmanager import WALManager
from headrace.table.collections import Collection, CollectionRecord, collections_prefix
from headrace.table.records import CheckpointRecord, checkpoints_prefix
from headrace.wal.api import WALState
from headrace.wal.framework import WAL
from headrace.wal.progress import (
    FlushState,
    OpaqueSummary,
    RetentionOptions,
    Sample,
    summarize,
)
from headrace.wal.retention import (
    Checkpointed,
    Inputs,
    RetentionRecord,
    Truncation,
    decide,
    retention_key,
    retention_prefix,
)

log = logging.getLogger(__name__)

_OWNING = frozenset((AssignmentState.ASSIGNING, AssignmentState.ASSIGNED))


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """What one pass read from the metastore."""

    config: ClusterConfig | None
    collections: tuple[Collection, ...]
    assignments: Mapping[str, tuple[Assignment, int]]
    """Assignment and its ``mod_revision`` by pchannel."""
    checkpoints: Mapping[str, CheckpointRecord]
    records: Mapping[str, RetentionRecord]


@dataclasses.dataclass(frozen=True, slots=True)
class Applied:
    """The last truncation this node made on a pchannel, under ``term``."""

    term: int
    below: MessageID


def collections_on(
    pchannel: str, collections: tuple[Collection, ...], config: ClusterConfig
) -> tuple[str, ...]:
    """Names of the live collections with a shard vchannel routed to ``pchannel``
    (pure). A dropped collection's data is garbage: it holds nothing back."""
    return tuple(
        c.name
        for c in collections
        if c.dropped is None and any(config.route(v) == pchannel for v in c.vchannels)
    )


def owns(assignment: Assignment | None, node_id: str, term: int) -> bool:
    """Whether ``node_id`` owns the pchannel under ``term`` by its record (pure):
    ASSIGNING or ASSIGNED to it under exactly that term (UNASSIGNING: it is
    handing the pchannel over, so nothing is truncated any more)."""
    return (
        assignment is not None
        and assignment.node == node_id
        and assignment.term == term
        and assignment.state in _OWNING
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Kept:
    """What the last pass saw of a pchannel, for metrics."""

    unflushed_bytes: int
    checkpoint_timetick: int | None
    """None: no flush checkpoint yet."""
    tail_timetick: int
    truncations: int
    """Truncations of the backend by this node (every term)."""


class Housekeeper:
    """The housekeeping loop of one node (see the module docstring)."""

    def __init__(self, node_id: str, metastore: Metastore, keys: Keys, manager: WALManager) -> None:
        self.node_id = node_id
        self.metastore = metastore
        self.keys = keys
        self.manager = manager
        self.options: RetentionOptions = manager.options.retention
        self._applied: dict[str, Applied] = {}
        self._tails: dict[str, Applied] = {}
        """The tail each pchannel's previous pass saw, under its term."""
        self.decisions: dict[str, Truncation] = {}
        """The last decision per pchannel (for tests and logs)."""
        self.kept: dict[str, Kept] = {}
        """What the last pass saw per pchannel (metrics)."""
        self._truncations: dict[str, int] = {}

    async def run(self) -> None:
        while True:
            await self.run_pass()
            await asyncio.sleep(self.options.pass_interval_s)

    async def run_pass(self) -> None:
        wals = {
            name: wal
            for name, wal in self.manager.held.items()
            if isinstance(wal, WAL) and wal.state is WALState.SERVING
        }
        if not wals:
            return
        try:
            snapshot = await self._read()
        except errors.HeadraceError as exc:
            log.warning("housekeeping on node %s skipped a pass: %s", self.node_id, exc)
            return
        if snapshot.config is None:
            return
        for pchannel, wal in wals.items():
            await self._keep(pchannel, wal, snapshot, snapshot.config)

    async def _read(self) -> Snapshot:
        keys = self.keys
        result = await self.metastore.txn(
            [],
            [
                Get(keys.config),
                Get(collections_prefix(keys), prefix=True),
                Get(keys.pchannels, prefix=True),
                Get(checkpoints_prefix(keys), prefix=True),
                Get(retention_prefix(keys), prefix=True),
            ],
        )
        config_kvs, collection_kvs, assignment_kvs, checkpoint_kvs, record_kvs = result.gets
        assignments = {}
        for kv in assignment_kvs:
            record = Assignment.from_json(kv.value)
            assignments[record.pchannel] = (record, kv.mod_revision)
        return Snapshot(
            config=ClusterConfig.from_json(config_kvs[0].value) if config_kvs else None,
            collections=tuple(
                CollectionRecord.from_json(kv.value).collection() for kv in collection_kvs
            ),
            assignments=assignments,
            checkpoints=_by_pchannel(CheckpointRecord, checkpoint_kvs),
            records=_by_pchannel(RetentionRecord, record_kvs),
        )

    async def _keep(
        self, pchannel: str, wal: WAL, snapshot: Snapshot, config: ClusterConfig
    ) -> None:
        owned = snapshot.assignments.get(pchannel)
        if owned is None or not owns(owned[0], self.node_id, wal.term):
            return
        revision = owned[1]
        checkpoint_record = snapshot.checkpoints.get(pchannel)
        try:
            checkpoint = (
                None
                if checkpoint_record is None
                else Checkpointed(checkpoint_record.position_id(), checkpoint_record.timetick)
            )
        except errors.HeadraceError as exc:
            log.warning(
                "housekeeping of %s: unreadable checkpoint, kept everything: %s", pchannel, exc
            )
            return
        collections = collections_on(pchannel, snapshot.collections, config)
        progress = wal.progress
        last_id = wal.last_id
        if last_id is not None:
            progress.positions.note(
                Sample(last_id, wal.last_timetick, progress.appended_bytes), force=True
            )
        progress.set_flush(
            FlushState(collections, None if checkpoint is None else checkpoint.position)
        )
        decision = decide(
            Inputs(
                checkpoint=checkpoint,
                collections=collections,
                samples=progress.positions.samples,
                appended_bytes=progress.appended_bytes,
                now_ms=tso.now_ms(),
                options=self.options,
                opaque=progress.opaque.spans,
            )
        )
        self.decisions[pchannel] = decision
        applied = await self._truncate(pchannel, wal.term, decision)
        summary = self._summary(pchannel, wal)
        self.kept[pchannel] = Kept(
            unflushed_bytes=progress.unflushed_bytes(),
            checkpoint_timetick=None if checkpoint is None else checkpoint.timetick,
            tail_timetick=wal.last_timetick,
            truncations=self._truncations.get(pchannel, 0),
        )
        record = RetentionRecord(
            pchannel=pchannel,
            node=self.node_id,
            term=wal.term,
            checkpoint=checkpoint_record.position if checkpoint_record is not None else "",
            unflushed_bytes=progress.unflushed_bytes(),
            truncated_below=str(applied.below) if applied is not None else "",
            reason=decision.reason,
            collections=list(collections),
            at_ms=tso.now_ms(),
        )
        if summary is not None:
            record = record.with_summary(summary)
        previous = snapshot.records.get(pchannel)
        if previous is not None and previous.model_copy(update={"at_ms": 0}) == record.model_copy(
            update={"at_ms": 0}
        ):
            return
        await self._record(pchannel, revision, record)

    def _summary(self, pchannel: str, wal: WAL) -> OpaqueSummary | None:
        """What the WAL knows of its opaque records up to the tail the previous
        pass under this term saw (an append's opaque records are noted just
        after its id becomes the tail: one pass later they surely are); None
        on the first pass of a term."""
        previous = self._tails.get(pchannel)
        last_id = wal.last_id
        if last_id is not None:
            self._tails[pchannel] = Applied(wal.term, last_id)
        if previous is None or previous.term != wal.term:
            return None
        return summarize(wal.progress.opaque.spans, previous.below)

    async def _truncate(self, pchannel: str, term: int, decision: Truncation) -> Applied | None:
        applied = self._applied.get(pchannel)
        if applied is not None and applied.term != term:
            applied = None
        below = decision.below
        if below is None or (applied is not None and below <= applied.below):
            return applied
        try:
            # Backends know record ids: a bound inside a batch keeps its record.
            await self.manager.backend.truncate(pchannel, below.record_id())
        except errors.HeadraceError as exc:
            log.warning(
                "truncating %s below %s failed, retried next pass: %s", pchannel, below, exc
            )
            return applied
        log.info("truncated %s below %s (%s)", pchannel, below, decision.reason)
        self._truncations[pchannel] = self._truncations.get(pchannel, 0) + 1
        applied = self._applied[pchannel] = Applied(term, below)
        return applied

    async def _record(self, pchannel: str, revision: int, record: RetentionRecord) -> None:
        try:
            await self.metastore.txn(
                [Compare.mod_revision_is(self.keys.pchannel(pchannel), revision)],
                [Put(retention_key(self.keys, pchannel), record.to_json())],
            )
        except errors.HeadraceError as exc:
            log.warning("recording the retention status of %s failed: %s", pchannel, exc)


_R = TypeVar("_R", CheckpointRecord, RetentionRecord)


def _by_pchannel(cls: type[_R], kvs: list[KeyValue]) -> dict[str, _R]:
    found: dict[str, _R] = {}
    for kv in kvs:
        record = cls.from_json(kv.value)
        found[record.pchannel] = record
    return found

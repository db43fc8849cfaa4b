"""Snapshot reads: the committed table at a snapshot plus the WAL tail after it.

A read at timetick ``as_of`` (or "latest": the largest timetick the
pchannels' owners report when the read starts, so every message
acknowledged before it is in):

1. reads the table pointer and the pchannels' checkpoints in one metastore
   transaction (a flush commit moves them in one transaction, so they agree),
   loads the table's metadata and plans the snapshot and each pchannel's tail
   start (:func:`headrace.table.snapshots.plan_read`);
2. **pins** the snapshot (:mod:`headrace.table.pins`): a leased key written
   only if the pointer has not moved since step 1 (else it plans again), kept
   alive while the read runs and removed when it ends, so snapshot expiry and
   compaction keep the snapshot's files;
3. reads each shard's WAL after its pchannel's start up to ``as_of`` (the
   first message or time tick past it ends a shard) and folds the inserts
   and deletes (:func:`headrace.table.merge.fold_tail`);
4. scans the pinned snapshot with pyiceberg (filter pushed down), drops rows
   the tail superseded and keys given already, and adds the tail's rows.

Every primary key appears at most once; see docs/pipeline.md, "Snapshot reads".
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import AsyncIterator, Generator, Sequence
from typing import TYPE_CHECKING, Literal

import pyarrow as pa

from headrace import errors, tso
from headrace.client.consumer import Consumer, ConsumerOptions
from headrace.client.manager import ManagerClient
from headrace.client.session import Session
from headrace.cluster import Keys
from headrace.guarded import TaskFailure, cancel_and_settle, guarded_task
from headrace.message import ids
from headrace.message.types import MessageType
from headrace.metastore.contract import Get, LeaseExpired, Metastore
from headrace.table import messages
from headrace.table.collections import Collection, CollectionRecord, CollectionStore
from headrace.table.merge import (
    TableRows,
    Tail,
    TailDelete,
    TailEvent,
    TailInsert,
    fold_tail,
    merge,
)
from headrace.table.pins import PIN_TTL_S, PinBasis, pin_ops
from headrace.table.records import CheckpointRecord, TableRecord, collection_key, table_key
from headrace.table.snapshots import Position, ReadPlan, plan_read
from headrace.table.storage import ObjectStoreOptions

if TYPE_CHECKING:
    from pyiceberg.table import Table

    from headrace.table.reader import RowFilter

log = logging.getLogger(__name__)

AsOf = int | Literal["latest"]

TAIL_TYPES = frozenset({MessageType.INSERT, MessageType.DELETE, MessageType.TIME_TICK})


@dataclasses.dataclass(frozen=True, slots=True)
class ReadOptions:
    object_store: ObjectStoreOptions = dataclasses.field(default_factory=ObjectStoreOptions)
    """How to reach the warehouse when it is on S3."""
    idle_timeout_s: float = 60.0
    """A shard's WAL tail that delivers nothing for this long is UNAVAILABLE."""
    plan_attempts: int = 20
    """Tries to pin a snapshot while flushes keep moving the table pointer."""


@dataclasses.dataclass(frozen=True, slots=True)
class ReadRequest:
    collection: str
    as_of: AsOf = "latest"
    columns: tuple[str, ...] | None = None
    filter: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Planned:
    """A read's decisions, before any row is read."""

    collection: Collection
    as_of: int
    plan: ReadPlan
    table: Table | None
    row_filter: RowFilter
    columns: tuple[str, ...]
    """The fields returned, in the collection's order."""

    @property
    def scanned(self) -> tuple[str, ...]:
        """The fields read from the table: the returned ones and the key."""
        pk = self.collection.primary_key
        return tuple(n for n in self.collection.schema.names if n in self.columns or n == pk)

    def describe(self) -> dict[str, object]:
        return {
            "collection": self.collection.name,
            "as_of": self.as_of,
            "snapshot_id": self.plan.snapshot_id,
            "tail_starts": self.plan.starts,
            "why": self.plan.why,
        }


class SnapshotRead:
    """One read: plan and pin on entry, rows by :meth:`batches` or :meth:`table`,
    the pin removed on exit. Create with :meth:`HeadraceClient.snapshot_read`."""

    def __init__(self, session: Session, request: ReadRequest, options: ReadOptions) -> None:
        self._session = session
        self._request = request
        self._options = options
        self._pin: _Pin | None = None
        self._planned: Planned | None = None
        self._tail: Tail | None = None

    async def __aenter__(self) -> SnapshotRead:
        self._planned, self._pin = await self._plan_and_pin()
        try:
            self._tail = await self._read_tail(self._planned)
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            await pin.release()

    @property
    def planned(self) -> Planned:
        if self._planned is None:
            raise errors.Closed("the read is not open; use `async with`")
        return self._planned

    async def batches(self) -> AsyncIterator[pa.Table]:
        """The rows in pieces: the table's, then the tail's (each key once)."""
        planned, tail = self.planned, self._require_tail()
        admitted = TableRows(tail, planned.collection.primary_key)
        async for part in self._table_files(planned):
            self._check_pin()
            rows = admitted.admit(part)
            if rows.num_rows:
                yield rows.select(list(planned.columns))
        rows = planned.row_filter.apply(tail.rows).select(list(planned.columns))
        if rows.num_rows:
            yield rows

    async def table(self) -> pa.Table:
        """The whole result as one Table (the collection's schema, ``columns`` only)."""
        planned, tail = self.planned, self._require_tail()
        files = [f async for f in self._table_files(planned)]
        self._check_pin()
        scanned = pa.schema([planned.collection.schema.field(n) for n in planned.scanned])
        rows = planned.row_filter.apply(tail.rows).select(list(planned.scanned))
        merged = merge(
            files, dataclasses.replace(tail, rows=rows), planned.collection.primary_key, scanned
        )
        return merged.select(list(planned.columns))

    def _require_tail(self) -> Tail:
        if self._tail is None:
            raise errors.Closed("the read is not open; use `async with`")
        return self._tail

    def _check_pin(self) -> None:
        if self._pin is not None and self._pin.lost is not None:
            raise self._pin.lost

    async def _table_files(self, planned: Planned) -> AsyncIterator[pa.Table]:
        """The snapshot's rows, data file by data file, newest first."""
        from headrace.table.reader import scan_files  # noqa: PLC0415

        if planned.table is None or planned.plan.snapshot_id is None:
            return
        parts: Generator[pa.Table, None, None] = scan_files(
            planned.table,
            snapshot_id=planned.plan.snapshot_id,
            row_filter=planned.row_filter,
            fields=planned.scanned,
            arrow_schema=planned.collection.schema,
            object_store=self._options.object_store,
        )
        try:
            while True:
                try:
                    part = await asyncio.to_thread(next, parts, None)
                except errors.MissingFile as missing:
                    raise await self._missing(missing) from None
                if part is None:
                    return
                yield part
        finally:
            # A read ended early: stop the scan's threads (off the event loop).
            await asyncio.to_thread(parts.close)

    async def _missing(self, missing: errors.MissingFile) -> errors.HeadraceError:
        """Why a file of the read's snapshot is gone: the pin was lost (seen by
        its renewal, or its lease found expired now), so expiry could collect
        the snapshot's files and reading again succeeds (UNAVAILABLE); or the
        file went while the pin held, which only a hand deletion does (the
        scan's error: lost data)."""
        lost = None if self._pin is None else await self._pin.confirm()
        return missing if lost is None else errors.Unavailable(f"{lost.message}: {missing.message}")

    # -- planning and pinning -------------------------------------------------

    async def _plan_and_pin(self) -> tuple[Planned, _Pin | None]:
        from headrace.table.reader import RowFilter  # noqa: PLC0415

        view = self._session.view
        request = self._request
        collection = await CollectionStore(view.metastore, view.keys).get(request.collection)
        if collection.dropped is not None:
            raise errors.NotFound(f"collection {collection.name} was dropped")
        columns = _columns(collection, request.columns)
        row_filter = RowFilter.parse(request.filter, collection.schema)
        pchannels = sorted({view.route(v) for v in collection.vchannels})
        as_of = await self._as_of(pchannels)
        for _ in range(self._options.plan_attempts):
            basis, record, checkpoints = await self._read_pointers(collection.name, pchannels)
            table = None if record is None else await asyncio.to_thread(self._open, record)
            plan = await asyncio.to_thread(_plan, table, checkpoints, pchannels, as_of)
            planned = Planned(collection, as_of, plan, table, row_filter, columns)
            if plan.snapshot_id is None:
                return planned, None
            pin = await _Pin.take(
                view.metastore, view.keys, collection.name, plan.snapshot_id, basis
            )
            if pin is not None:
                return planned, pin
        raise errors.Conflict(
            f"reading {collection.name}: the table pointer kept moving while the read pinned "
            f"a snapshot ({self._options.plan_attempts} attempts); try again",
            retryable=True,
        )

    def _open(self, record: TableRecord) -> Table:
        from headrace.table.reader import open_table  # noqa: PLC0415

        return open_table(record.metadata_location, self._options.object_store)

    async def _read_pointers(
        self, collection: str, pchannels: Sequence[str]
    ) -> tuple[PinBasis, TableRecord | None, dict[str, Position]]:
        """The table pointer and the checkpoints, read in one transaction with
        the collection's record (NOT_FOUND if it was dropped meanwhile)."""
        view = self._session.view
        gets = [Get(collection_key(view.keys, collection)), Get(table_key(view.keys, collection))]
        gets += [Get(view.keys.checkpoint(p)) for p in pchannels]
        found = (await view.metastore.txn([], gets)).gets
        collection_kvs, table_kvs, checkpoint_kvs = found[0], found[1], found[2:]
        if not collection_kvs or CollectionRecord.from_json(collection_kvs[0].value).dropped:
            raise errors.NotFound(f"collection {collection} was dropped")
        record = TableRecord.from_json(table_kvs[0].value) if table_kvs else None
        basis = PinBasis(
            table_revision=table_kvs[0].mod_revision if table_kvs else 0,
            collection_revision=collection_kvs[0].mod_revision,
        )
        checkpoints: dict[str, Position] = {}
        for pchannel, kvs in zip(pchannels, checkpoint_kvs, strict=True):
            if kvs:
                checkpoint = CheckpointRecord.from_json(kvs[0].value)
                checkpoints[pchannel] = Position(checkpoint.position, checkpoint.timetick)
        return basis, record, checkpoints

    async def _as_of(self, pchannels: Sequence[str]) -> int:
        """The read's timetick: the one asked for, or for "latest" the largest
        timetick the owners report now (at least every acknowledged message's)."""
        as_of = self._request.as_of
        if as_of != "latest":
            return as_of
        session = self._session
        ticks = await asyncio.gather(*(self._last_timetick(session, p) for p in pchannels))
        return max([tso.compose(tso.now_ms(), 0), *ticks])

    async def _last_timetick(self, session: Session, pchannel: str) -> int:
        deadline = time.monotonic() + self._options.idle_timeout_s
        owner = await session.view.wait_owner(pchannel, deadline)
        manager = ManagerClient(owner.address, session.channels.get(owner.address))
        wals = await manager.list_wals(timeout=self._options.idle_timeout_s)
        status = wals.find(pchannel)
        if status is None:
            raise errors.Unavailable(f"{owner.node} does not report {pchannel} (moving?); retry")
        return status.last_timetick

    # -- the WAL tail -------------------------------------------------------------

    async def _read_tail(self, planned: Planned) -> Tail:
        view = self._session.view
        collection = planned.collection
        reads = [
            self._read_shard(collection, v, planned.plan.starts.get(view.route(v)), planned.as_of)
            for v in collection.vchannels
        ]
        events = [event for shard in await asyncio.gather(*reads) for event in shard]
        return await asyncio.to_thread(fold_tail, events, collection.schema, collection.primary_key)

    async def _read_shard(
        self, collection: Collection, vchannel: str, start: str | None, as_of: int
    ) -> list[TailEvent]:
        """``vchannel``'s inserts and deletes after ``start`` up to ``as_of``."""
        after = None if start is None else ids.parse(start)
        timeout = self._options.idle_timeout_s
        known = {collection.name: collection}
        found: list[TailEvent] = []
        consumer = Consumer(
            self._session,
            vchannel,
            "earliest" if after is None else after,
            TAIL_TYPES,
            ConsumerOptions(ready_timeout=timeout),
        )
        try:
            async with consumer:
                while True:
                    entry = await consumer.next(timeout=timeout)
                    if entry is None:
                        raise errors.Unavailable(
                            f"reading the WAL tail of {vchannel} up to timetick {as_of}: no "
                            f"message for {timeout:g}s (last seen {consumer.last_id})"
                        )
                    message = entry.message
                    if after is not None and not after < entry.id:
                        continue
                    if message.timetick > as_of:
                        return found
                    if message.type is MessageType.TIME_TICK:
                        if message.timetick >= as_of:
                            return found
                        continue
                    data = messages.parse(message, known)
                    if isinstance(data, messages.Insert):
                        found.append(TailInsert(data.rows, message.timetick))
                    elif isinstance(data, messages.Delete):
                        found.append(TailDelete(data.keys.combine_chunks(), message.timetick))
        except errors.Truncated as exc:
            raise errors.Truncated(
                f"reading {collection.name} as of timetick {as_of} needs {vchannel}'s WAL "
                f"after {start or 'its beginning'}, which is truncated ({exc}); read a later "
                "as_of",
                earliest=exc.earliest,
            ) from None


def _plan(
    table: Table | None, checkpoints: dict[str, Position], pchannels: Sequence[str], as_of: int
) -> ReadPlan:
    from headrace.table.reader import history  # noqa: PLC0415

    if table is None:
        return plan_read([], checkpoints, pchannels, as_of)
    facts, expired_ms = history(table)
    expired_until = tso.compose(expired_ms, tso.MAX_LOGICAL) if expired_ms else 0
    return plan_read(facts, checkpoints, pchannels, as_of, expired_until)


def _columns(collection: Collection, columns: tuple[str, ...] | None) -> tuple[str, ...]:
    names = collection.schema.names
    if columns is None:
        return tuple(names)
    unknown = [c for c in columns if c not in names]
    if unknown or not columns:
        raise errors.InvalidArgument(
            f"columns {list(columns)} of {collection.name}: "
            + (f"no field(s) {unknown}" if unknown else "none asked for")
            + f" (fields: {', '.join(names)})"
        )
    return tuple(n for n in names if n in columns)


class _Pin:
    """A reader pin held under a lease kept alive by a task; :attr:`lost` once
    the lease could not be renewed (files may then be collected)."""

    def __init__(self, metastore: Metastore, lease: int, name: str) -> None:
        self._metastore = metastore
        self._lease = lease
        self.lost: errors.HeadraceError | None = None
        self._task = guarded_task(self._renew(), name, self._failed, logger=log)

    @classmethod
    async def take(
        cls, metastore: Metastore, keys: Keys, collection: str, snapshot_id: int, basis: PinBasis
    ) -> _Pin | None:
        """The pin, or None if the table pointer or the collection's record
        moved since the read planned on ``basis``."""
        lease = await metastore.grant_lease(PIN_TTL_S)
        compares, puts = pin_ops(keys, collection, snapshot_id, lease, basis)
        result = await metastore.txn(compares, puts)
        if not result.succeeded:
            await metastore.revoke_lease(lease)
            return None
        return cls(metastore, lease, f"read-pin-{collection}-{snapshot_id}")

    async def _renew(self) -> None:
        while self.lost is None:
            await asyncio.sleep(PIN_TTL_S / 3)
            await self._keep_alive()

    async def _keep_alive(self) -> None:
        try:
            await self._metastore.keep_alive(self._lease)
        except LeaseExpired:
            self.lost = errors.Unavailable(
                f"the read's pin of its snapshot expired (lease {self._lease:x} not renewed "
                f"within {PIN_TTL_S:g}s): its files may be collected; read again"
            )
        except errors.HeadraceError as exc:
            log.warning("renewing a reader pin: %s", exc)

    async def confirm(self) -> errors.HeadraceError | None:
        """Why the pin is lost, renewing it now to find out; None: it holds
        (or the metastore could not tell)."""
        if self.lost is None:
            await self._keep_alive()
        return self.lost

    async def _failed(self, failure: TaskFailure) -> None:
        self.lost = errors.HeadraceError(f"keeping a reader pin: {failure.describe()}")

    async def release(self) -> None:
        await cancel_and_settle([self._task], what="stopping a reader pin", logger=log)
        with contextlib.suppress(errors.HeadraceError):
            await self._metastore.revoke_lease(self._lease)

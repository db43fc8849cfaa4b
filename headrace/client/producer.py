"""The producer: batched, pipelined, retried appends to the owners of pchannels.

Each pchannel gets a :class:`Lane`: a queue of messages and one Produce
stream to the pchannel's owner at a time, with up to ``max_inflight_batches``
batches on the wire. Messages are stamped with ``producer_id`` and a
``producer_seq`` once, so a retried message is written once (the WAL's dedup
interceptor answers a repeat with the first result). A retryable failure
(NOT_OWNER, FENCED, UNAVAILABLE, a broken stream) sends the unacknowledged
messages again, in their order, to the owner found next; a non-retryable one
(TOO_LARGE, INVALID_ARGUMENT) fails its message at once. A message still not
acknowledged after ``deadline`` seconds fails with the last error seen.

To an owner whose WAL writes message format 2 a lane sends record batches
instead (:mod:`headrace.client.lane`): without the per-message properties,
deduplicated per batch by the producer's batch id (:func:`batch_producer_id`)
and a producer-wide sequence. The sequence starts at the wall clock in
nanoseconds, so a restarted producer with the same ``producer_id`` never
reuses a sequence of its earlier life (it cannot send more than one batch per
nanosecond), and its retries of what it sent are still recognised.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import itertools
import secrets
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from headrace import errors
from headrace.client import arguments
from headrace.client.budget import ByteBudget
from headrace.client.discovery import Owner
from headrace.client.lane import Lane, LaneContext
from headrace.client.routing import fitted, split_by_shard, split_keys_by_shard
from headrace.client.sending import (
    Call,
    Group,
    Indexes,
    Item,
    Outcome,
    ProducerOptions,
    items,
)
from headrace.client.session import Session
from headrace.cluster import ClusterConfig
from headrace.message.types import Message, MessageType
from headrace.table import messages as table_messages
from headrace.table.collections import Collection, CollectionStore
from headrace.table.payloads import Keys, Rows, conform, key_array
from headrace.wal.api import AppendResult


@dataclasses.dataclass(frozen=True, slots=True)
class WriteResult:
    """What ``insert`` or ``delete`` wrote: one acknowledged message per part."""

    collection: str
    rows: int
    """Rows inserted, or keys deleted."""
    results: tuple[AppendResult, ...]
    """In the order the parts were sent (by shard, then by row)."""


class Producer:
    """Sends messages to a cluster; create with :meth:`HeadraceClient.producer`."""

    def __init__(self, session: Session, options: ProducerOptions) -> None:
        self.session = session
        self.options = arguments.instance(options, ProducerOptions, "options")
        self.producer_id = uuid.uuid4().hex
        self._next_seq = 1
        """The next message's own dedup sequence (format 1)."""
        self.batch_producer_id = batch_producer_id(self.options.producer_id)
        self._batch_seq = itertools.count(time.time_ns())
        self.budget = ByteBudget(self.options.max_inflight_bytes)
        self._context = LaneContext(
            session,
            self.options,
            self.producer_id,
            self.settle,
            self.settle_each,
            self.batch_producer_id,
            functools.partial(next, self._batch_seq),
        )
        self._lanes: dict[str, Lane] = {}
        self._routed: ClusterConfig | None = None
        self._routes: dict[str, Lane] = {}
        """The lane of each vchannel sent to under the config ``_routed``."""
        self._collections: dict[str, Collection] = {}
        self._closed = False

    async def __aenter__(self) -> Producer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def send(
        self,
        vchannel: str,
        payload: bytes,
        *,
        type: MessageType = MessageType.INSERT,
        properties: Mapping[str, str] | None = None,
        txn_id: int = 0,
    ) -> AppendResult:
        """Append one message; its result once acknowledged, else its error.

        InvalidArgument at once for an argument of the wrong type or value.
        """
        message = Message(
            arguments.message_type(type),
            arguments.vchannel(vchannel),
            arguments.payload(payload),
            arguments.properties(properties),
            txn_id=arguments.txn_id(txn_id),
        )
        (outcome,) = await self.send_many((message,))
        if isinstance(outcome, errors.HeadraceError):
            raise outcome
        return outcome

    async def send_many(self, messages: Iterable[Message]) -> list[Outcome]:
        """Append messages; one result or error per message, in their order.

        Messages of one vchannel are written in the order given. A message
        that is not a well-formed :class:`Message` gets its InvalidArgument as
        its outcome and is not sent; the others are.
        """
        if self._closed:
            raise errors.Closed("the producer is closed")
        batch = arguments.messages(messages)
        group = Group(len(batch))
        deadline = time.monotonic() + self.options.deadline
        view = self.session.view
        budget = self.budget
        lanes: dict[str, Lane] = {}
        # Items admitted and not yet pushed, per lane: pushed once per call,
        # or before any wait (the budget is freed only by their answers).
        taken: dict[Lane, list[Item]] = {}
        try:
            for item in self._items(batch, group, deadline):
                vchannel = item.messages[0].vchannel
                lane = lanes.get(vchannel)
                if lane is None:
                    if view.config is None:
                        _push(taken)
                        await view.wait_route(vchannel, deadline)
                    lane = lanes[vchannel] = self._lane_of(vchannel)
                if not budget.try_acquire(item.size):
                    _push(taken)
                    await budget.acquire(item.size)
                held = taken.get(lane)
                if held is None:
                    taken[lane] = [item]
                else:
                    held.append(item)
        finally:
            _push(taken)
        return await group.future

    async def insert(self, collection: str | Collection, rows: Rows) -> WriteResult:
        """Insert ``rows`` (a pyarrow Table or RecordBatch of the collection's schema).

        Rows go to the shard of their primary key (:mod:`headrace.client.routing`),
        cut into messages of at most ``max_rows_bytes``, without a segment (the
        node assigns it). Rows that do not fit the schema are INVALID_ARGUMENT
        naming the field, and nothing is sent. If a message fails, its error is
        raised; the other messages of the call may have been written.
        """
        if not isinstance(rows, pa.Table | pa.RecordBatch):
            raise errors.InvalidArgument(
                f"rows must be a pyarrow Table or RecordBatch, got a {type(rows).__name__}"
            )
        target = await self._collection(collection)
        table = conform(target, rows)  # InvalidArgument naming the field, before any send
        parts = split_by_shard(table, target.primary_key, target.spec.shards)
        batch = [
            message
            for shard, part in parts.items()
            for message in fitted(
                part,
                self.options.max_rows_bytes,
                functools.partial(table_messages.insert_request, target, target.vchannels[shard]),
            )
        ]
        return await self._write(target, table.num_rows, batch)

    async def delete(self, collection: str | Collection, keys: Keys) -> WriteResult:
        """Delete the rows of primary keys ``keys`` (a pyarrow array or a list).

        Each key goes to the same shard as its inserts. Keys of the wrong type
        or holding nulls are INVALID_ARGUMENT and nothing is sent.
        """
        target = await self._collection(collection)
        array = key_array(target, keys)
        pk = target.primary_key

        def build(vchannel: str, part: pa.Table) -> Message:
            return table_messages.delete(target, vchannel, part.column(0).combine_chunks())

        batch = [
            message
            for shard, part in split_keys_by_shard(array, target.spec.shards).items()
            for message in fitted(
                pa.Table.from_arrays([part], names=[pk]),
                self.options.max_rows_bytes,
                functools.partial(build, target.vchannels[shard]),
            )
        ]
        return await self._write(target, len(array), batch)

    async def _collection(self, collection: str | Collection) -> Collection:
        """The recorded collection, read once per producer; NOT_FOUND if there is
        none or it was dropped."""
        name = collection.name if isinstance(collection, Collection) else collection
        if not isinstance(name, str):
            raise errors.InvalidArgument(
                f"collection must be a name or a Collection, got a {type(name).__name__}"
            )
        found = self._collections.get(name)
        if found is None:
            view = self.session.view
            found = await CollectionStore(view.metastore, view.keys).get(name)
            if found.dropped is not None:
                raise errors.NotFound(f"collection {name} was dropped")
            self._collections[name] = found
        return found

    async def _write(self, target: Collection, rows: int, batch: list[Message]) -> WriteResult:
        outcomes = await self.send_many(batch)
        for outcome in outcomes:
            if isinstance(outcome, errors.HeadraceError):
                if outcome.code is errors.ErrorCode.NOT_FOUND:
                    # Dropped meanwhile (or the node does not know it): read it again next time.
                    self._collections.pop(target.name, None)
                raise outcome
        results = tuple(o for o in outcomes if isinstance(o, AppendResult))
        return WriteResult(target.name, rows, results)

    def _lane_of(self, vchannel: str) -> Lane:
        """The lane of ``vchannel``'s pchannel under the cluster's config,
        remembered for as long as the config is the same."""
        config = self.session.view.config
        if config is not self._routed:
            self._routed, self._routes = config, {}
        lane = self._routes.get(vchannel)
        if lane is None:
            if len(self._routes) >= _ROUTES_MAX:
                self._routes.clear()
            lane = self._routes[vchannel] = self._lane(self.session.view.route(vchannel))
        return lane

    def _lane(self, pchannel: str) -> Lane:
        lane = self._lanes.get(pchannel)
        if lane is None:
            lane = self._lanes[pchannel] = Lane(self._context, pchannel)
        return lane

    def _items(self, batch: list[Message], group: Group, deadline: float) -> list[Item]:
        """The well-formed messages of a call as items (:func:`items`); each
        other one gets its InvalidArgument as its outcome."""
        if arguments.common(batch):
            good: list[Message] = batch
            at: Indexes = range(len(batch))
        else:
            good, at = [], []
            for index, candidate in enumerate(batch):
                try:
                    good.append(arguments.message(candidate))
                except errors.InvalidArgument as exc:
                    group.settle(index, exc)
                    continue
                at.append(index)
        call = Call(group, self.producer_id, self._next_seq, deadline)
        self._next_seq += len(good)
        return items(good, at, call, self.options)

    def settle(self, item: Item, outcomes: Sequence[Outcome] | errors.HeadraceError) -> None:
        """Report ``item``'s outcomes (one each, or one error for all) and give
        back its bytes."""
        self.budget.release(item.size)
        item.group.settle_run(item.indexes, outcomes)

    def settle_each(self, items: Sequence[Item], outcomes: Sequence[Outcome]) -> None:
        """Report the one outcome of each of ``items`` (of one message each),
        and give back their bytes at once."""
        self.budget.release(sum(item.size for item in items))
        for item, outcome in zip(items, outcomes, strict=True):
            item.group.settle(item.indexes[0], outcome)

    async def flush(self) -> None:
        """Wait until every message sent so far has its outcome."""
        await asyncio.gather(*(lane.idle() for lane in list(self._lanes.values())))

    async def close(self) -> None:
        """Flush, then end every stream."""
        if self._closed:
            return
        self._closed = True
        try:
            await self.flush()
        finally:
            lanes, self._lanes = list(self._lanes.values()), {}
            await asyncio.gather(*(lane.close() for lane in lanes))

    def owners(self) -> dict[str, Owner | None]:
        """The owner each pchannel's stream is connected to (for status output)."""
        return {p: lane.owner for p, lane in self._lanes.items()}


def _push(taken: dict[Lane, list[Item]]) -> None:
    """Push each lane's taken items to it, in order; ``taken`` is emptied."""
    for lane, held in taken.items():
        lane.push(held)
    taken.clear()


_ROUTES_MAX = 1 << 16
"""Vchannels whose lanes a producer remembers (it forgets them all past this)."""


def batch_producer_id(name: str | None) -> int:
    """The 64-bit producer id of record batches: a stable hash of ``name``, or
    a random one for None (never 0, which means "no dedup")."""
    if name is None:
        return secrets.randbits(64) or 1
    digest = hashlib.blake2b(name.encode(), digest_size=8, person=b"headrace-prod").digest()
    return int.from_bytes(digest, "little") or 1


__all__ = ["Group", "Producer", "ProducerOptions", "WriteResult", "batch_producer_id"]

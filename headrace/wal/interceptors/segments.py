"""Collections in the WAL: schema checks, growing segments and seals (Milvus's
"shard" interceptor).

For a message carrying ``headrace.collection`` (:mod:`headrace.table.messages`):

* **INSERT / DELETE**: the collection is looked up through the node's
  :class:`CollectionHooks` (cached there), the payload is decoded and checked
  against the schema; a failure fails that message alone with
  INVALID_ARGUMENT naming the field, before anything is written. Unknown
  collection: NOT_FOUND; a vchannel that is not one of its shards, or a
  message inside a transaction: INVALID_ARGUMENT. A collection dropped on
  this vchannel (a DROP_COLLECTION in the log, and no CREATE_COLLECTION since):
  NOT_FOUND saying so.
* **INSERT** gets ``headrace.segment`` = the growing segment of its
  (collection, vchannel), opened when none grows. Segment ids are TSO values
  (the cluster's timestamp oracle): unique and increasing over every owner and
  restart of every pchannel, so never reused (an id the WAL reserved but did
  not use is simply skipped).
* **Seals**: a trigger seals **every growing segment of the pchannel at once**
  (one FLUSH per segment, consecutive in the log), so the last seal of the
  group is a position where nothing grows: a flush range ending there holds
  the seal of every segment with rows in it. Triggers: a segment reaching
  :attr:`SegmentPolicy.max_rows` / ``max_bytes`` (right after that insert),
  a segment idle for ``idle_s`` or older than ``lifetime_s`` (checked by the
  WAL's timetick chores, at most every ``check_interval_s``), and a **flush
  request** (FLUSH with a collection and no segment), which is replaced by the
  seals: its result is the last seal's position. If nothing grows, the request
  is replaced by one *marker* seal of a fresh, empty segment on its vchannel,
  so it still has a position (readers ignore a seal of a segment without
  rows). A producer's FLUSH naming a segment is refused: only the WAL seals.
* **DROP_COLLECTION** (carrying ``headrace.collection``): the collection's
  growing segment on that vchannel is sealed just before it, and later
  inserts, deletes and flush requests there are refused (NOT_FOUND) until a
  CREATE_COLLECTION on the vchannel. Both make the lookup cache forget the
  name. What is dropped is known from the log the open reads; beyond
  it, the collection record in the metastore is the authority.
* Once a group of seals that leaves nothing growing is acknowledged, its last
  position is handed to :meth:`CollectionHooks.record_seal` (the node writes
  the ``SealRecord`` under its term). A failed record is retried by the chores
  (a flush request waiting on it gets the error and may be retried). A seal
  whose append failed (outcome unknown) stops the WAL's writing: it is reopened
  and rebuilds its segments from the log, never guessing whether the seal is in.

**Recovery**: segment state is rebuilt when the WAL opens, from a position
where nothing before matters to the last record, in the same read as the
dedup window (:mod:`headrace.wal.rebuild`): segments with inserts and no seal
are still growing and **keep their ids** (the new owner goes on filling them;
sealing them at open instead would cut a small segment at every handoff for
nothing). That position (:func:`scan_start`) is the later of the flush
checkpoint (:meth:`CollectionHooks.checkpoint`: the end of a flush range, where
nothing grew) and :data:`SEGMENTS_FROM`, which the WAL's own ticks and fences
carry: where its oldest growing segment starts, or its last record when
nothing grows. So a pchannel without collection data (no checkpoint ever) is
not read from its beginning at each open; only after a crash (the last record
is data, no tick names the position) and with no checkpoint is it read whole.

Collection data inside transactions is refused: a transaction is delivered
at its commit, which could fall after a seal of the segment its inserts name.

:class:`SegmentTable` is the pure state; :class:`SegmentInterceptor` does the
lookups, the id reservations and the writing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable
from typing import Protocol

from headrace import errors
from headrace.message import codec, ids
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.table.collections import Collection
from headrace.table.names import COLLECTION, SEGMENT, is_flush_request
from headrace.tso import TimestampAllocator, physical_ms
from headrace.wal.api import AppendResult
from headrace.wal.interceptors.chain import AppendContext, Handler
from headrace.wal.progress import OpaqueSummary

log = logging.getLogger(__name__)

SEGMENTS_FROM = "segments_from"
"""Property of the WAL's own ticks and fences: where a rebuild of its growing
segments may start reading (inclusive)."""

_SEGMENT_PROPERTY_BYTES = 6 + len(SEGMENT) + 20
"""What stamping a segment id adds to an encoded message, at most."""


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentPolicy:
    """When the WAL seals its growing segments (all of them at once)."""

    max_rows: int = 1_000_000
    max_bytes: int = 64 * 1024 * 1024
    """Insert payload bytes of one segment."""
    idle_s: float = 60.0
    """A segment without an insert for this long."""
    lifetime_s: float = 15.0
    """A segment opened this long ago. It bounds how long an insert waits for
    its seal, hence its flush: 15 s keeps ``flush_lag_p99_s`` under 30 s at
    10 MB/s over 4 shards (BENCHMARKS.md; with 600 s only the 64 MiB size
    trigger fired there, every ~27 s per shard: p99 34 s)."""
    check_interval_s: float = 1.0
    """How often the timetick chores look at idle time and lifetime."""

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_bytes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise errors.InvalidArgument(
                    f"segment policy {name} must be a positive integer, got {value!r}"
                )
        for name in ("idle_s", "lifetime_s", "check_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise errors.InvalidArgument(
                    f"segment policy {name} must be a positive number, got {value!r}"
                )


class CollectionHooks(Protocol):
    """What the WAL needs from the node for collections (the WAL itself never
    touches the metastore)."""

    async def collection(self, name: str) -> Collection:
        """The recorded collection (cached); NotFound if there is none."""

    def forget(self, name: str) -> None:
        """Drop ``name`` from the cache (it was dropped or created)."""

    async def checkpoint(self, pchannel: str) -> MessageID | None:
        """The pchannel's flush checkpoint; None: no flush yet (the whole log)."""

    async def opaque_summary(self, pchannel: str) -> OpaqueSummary | None:
        """What the previous owner knew of the pchannel's opaque records
        (None: nothing usable), to seed retention's view of the history the
        open does not read."""

    async def record_seal(
        self, pchannel: str, term: int, position: MessageID, timetick: int
    ) -> None:
        """Record that nothing grows at ``position`` (the owner's SealRecord)."""


@dataclasses.dataclass(slots=True)
class Growing:
    segment_id: int
    collection: str
    vchannel: str
    rows: int
    bytes: int
    opened: float
    """Seconds (wall clock) of its first insert."""
    last_insert: float
    since: MessageID | None
    """A position at or before its first insert (None: the log's beginning)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SealOrder:
    collection: str
    vchannel: str
    segment_id: int

    def message(self) -> Message:
        return Message(
            MessageType.FLUSH,
            self.vchannel,
            b"",
            {COLLECTION: self.collection, SEGMENT: str(self.segment_id)},
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Arrival:
    """An insert as the segment table sees it."""

    collection: str
    vchannel: str
    rows: int
    size: int
    """Payload bytes."""
    at: float
    """Wall-clock seconds."""
    since: MessageID | None = None
    """A position at or before this insert's (the WAL's last id when decided)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Assigned:
    segment_id: int
    full: bool
    """The segment reached a size limit: seal everything after this insert."""


class SegmentTable:
    """Growing segments of one pchannel, by vchannel (pure bookkeeping)."""

    def __init__(self, policy: SegmentPolicy) -> None:
        self.policy = policy
        self.growing: dict[str, Growing] = {}
        self.dropped: set[str] = set()
        """Vchannels whose collection was dropped (and not created again)."""

    def assign(self, insert: Arrival, *, new_id: int) -> Assigned:
        """Put an insert into the growing segment of its vchannel (opening one
        with ``new_id`` if none grows)."""
        vchannel, now = insert.vchannel, insert.at
        segment = self.growing.get(vchannel)
        if segment is None or segment.collection != insert.collection:
            segment = Growing(new_id, insert.collection, vchannel, 0, 0, now, now, insert.since)
            self.growing[vchannel] = segment
        segment.rows += insert.rows
        segment.bytes += insert.size
        segment.last_insert = max(segment.last_insert, now)
        full = segment.rows >= self.policy.max_rows or segment.bytes >= self.policy.max_bytes
        return Assigned(segment.segment_id, full)

    def seal_all(self) -> list[SealOrder]:
        """Seal every growing segment (in vchannel order)."""
        orders = [
            SealOrder(s.collection, s.vchannel, s.segment_id)
            for _, s in sorted(self.growing.items())
        ]
        self.growing.clear()
        return orders

    def drop(self, collection: str, vchannel: str) -> list[SealOrder]:
        """A DROP_COLLECTION on ``vchannel``: seal its segment there."""
        self.dropped.add(vchannel)
        segment = self.growing.get(vchannel)
        if segment is None or segment.collection != collection:
            return []
        del self.growing[vchannel]
        return [SealOrder(collection, vchannel, segment.segment_id)]

    def create(self, vchannel: str) -> None:
        """A CREATE_COLLECTION on ``vchannel``: it takes data again."""
        self.dropped.discard(vchannel)

    def due(self, now: float) -> str | None:
        """Why the growing segments must be sealed now (time triggers), or None."""
        policy = self.policy
        for segment in self.growing.values():
            if now - segment.opened >= policy.lifetime_s:
                return f"segment {segment.segment_id} reached its lifetime of {policy.lifetime_s} s"
            if now - segment.last_insert >= policy.idle_s:
                return f"segment {segment.segment_id} was idle for {policy.idle_s} s"
        return None

    def read_from(self, last: MessageID | None) -> MessageID | None:
        """Where a rebuild of this state may start reading, ``last`` being the
        log's last record (None: from the beginning)."""
        if not self.growing:
            return last
        start: MessageID | None = last
        for segment in self.growing.values():
            if segment.since is None:
                return None
            if start is None or segment.since < start:
                start = segment.since
        return start

    def replay_record(self, mid: MessageID, msg: Message) -> None:
        """:meth:`replay` a record of the open's tail read."""
        properties = msg.properties
        if properties and COLLECTION in properties:
            self.replay(msg, rows_in(msg.payload) if msg.type is MessageType.INSERT else 0, mid)

    def replay(self, msg: Message, rows: int, mid: MessageID | None = None) -> None:
        """Take in one message read back from the log (recovery, in log order)."""
        name = msg.properties.get(COLLECTION)
        if name is None:
            return
        kind, vchannel = msg.type, msg.vchannel
        if kind is MessageType.CREATE_COLLECTION:
            self.create(vchannel)
        elif kind is MessageType.DROP_COLLECTION:
            self.drop(name, vchannel)
        elif kind in (MessageType.INSERT, MessageType.FLUSH):
            segment_id = segment_of(msg)
            if segment_id is None:
                return
            current = self.growing.get(vchannel)
            if kind is MessageType.FLUSH:
                if current is not None and current.segment_id == segment_id:
                    del self.growing[vchannel]
                return
            seconds = physical_ms(msg.timetick) / 1000.0
            if current is None or current.segment_id != segment_id:
                self.growing[vchannel] = Growing(
                    segment_id, name, vchannel, 0, 0, seconds, seconds, mid
                )
            self.assign(
                Arrival(name, vchannel, rows, len(msg.payload), seconds, mid), new_id=segment_id
            )


def scan_start(checkpoint: MessageID | None, last: Message) -> MessageID | None:
    """Where the open's read for the segments starts (None: the beginning):
    the later of the checkpoint and the :data:`SEGMENTS_FROM` of the log's
    last record, if it is a tick or fence naming one (pure)."""
    hint: MessageID | None = None
    value = last.properties.get(SEGMENTS_FROM) if last.type.is_system else None
    if value:
        try:
            hint = ids.parse(value)
        except errors.InvalidArgument:
            hint = None
    if hint is None or (checkpoint is not None and hint < checkpoint):
        return checkpoint
    return hint


def segment_of(msg: Message) -> int | None:
    """The segment id a message names, None if none (or not a valid one)."""
    value = msg.properties.get(SEGMENT, "")
    if not value.isdigit() or not 0 < int(value) < 10**20:
        return None
    return int(value)


def rows_in(payload: bytes) -> int:
    """Rows of an Insert payload read back from the log (0 if it holds none)."""
    from headrace.table.payloads import decode  # noqa: PLC0415 - pyarrow for collection data only

    try:
        return int(decode(payload, "insert").num_rows)
    except errors.InvalidArgument:
        return 0


@dataclasses.dataclass(frozen=True, slots=True)
class _Checked:
    """What the checks found out about one collection message."""

    collection: Collection | None
    rows: int = 0
    error: errors.HeadraceError | None = None


@dataclasses.dataclass(slots=True)
class _SealGroup:
    contexts: list[AppendContext]
    complete: bool
    """Nothing grows after its last seal: its position may be recorded."""
    request: AppendContext | None = None
    """The flush request the group replaces."""


_DATA = frozenset((MessageType.INSERT, MessageType.DELETE, MessageType.FLUSH))
_SCHEMA = frozenset((MessageType.CREATE_COLLECTION, MessageType.DROP_COLLECTION))
_NEW_SEGMENT = frozenset((MessageType.INSERT, MessageType.FLUSH))
"""Messages that may take a new segment id (an insert opening one, a marker seal)."""


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentContext:
    """What the interceptor needs from its WAL."""

    pchannel: str
    term: int
    max_message_bytes: int
    tso: TimestampAllocator
    fail: Callable[[errors.HeadraceError], None]
    """Stops the WAL's writing (it is reopened and rebuilt from the log)."""
    clock: Callable[[], float]
    """Wall-clock seconds (idle time and lifetime; recovery uses the TSO's)."""
    last_id: Callable[[], MessageID | None]
    """The WAL's last acknowledged record."""


class SegmentInterceptor:
    """The chain stage for collection messages; the innermost before the appender."""

    def __init__(self, table: SegmentTable, hooks: CollectionHooks, wal: SegmentContext) -> None:
        self.table = table
        self._hooks = hooks
        self._tso = wal.tso
        self._pchannel, self._term = wal.pchannel, wal.term
        self._max_bytes = wal.max_message_bytes
        self._clock = wal.clock
        self._fail = wal.fail
        self._last_id = wal.last_id
        """Stops the WAL's writing (it is reopened and rebuilt from the log)."""
        self._ids: deque[int] = deque()
        """Segment ids reserved from the TSO, not used yet."""
        self._unrecorded: AppendResult | None = None
        """The last complete seal whose record could not be written yet."""
        self._next_check = 0.0

    # -- the chain ---------------------------------------------------------

    async def __call__(self, batch: list[AppendContext], call_next: Handler) -> None:
        names: set[str] = set()
        new_segments = 0
        for ctx in batch:
            msg = ctx.message
            properties = msg.properties
            if properties and COLLECTION in properties:
                name = properties[COLLECTION]
                names.add(name)
                if msg.type in _SCHEMA:
                    # A definition may change under the name only by a drop
                    # and a create: look it up afresh.
                    self._hooks.forget(name)
                elif msg.type in _NEW_SEGMENT:
                    new_segments += 1
            elif msg.type is MessageType.CREATE_COLLECTION:
                self.table.create(msg.vchannel)
        if not names:
            await call_next(batch)
            return
        collections = await self._resolve(names)
        checked = [self._check(ctx, collections) for ctx in batch]
        await self._reserve(new_segments)
        # No suspension from here until call_next queues the batch: the
        # segment state changes in the same order as the log.
        forward: list[AppendContext] = []
        groups: list[_SealGroup] = []
        for ctx, found in zip(batch, checked, strict=True):
            self._decide(ctx, found, forward, groups)
        if forward:
            await call_next(forward)
        await self._settle_groups(groups)

    async def _resolve(self, names: set[str]) -> dict[str, Collection | errors.HeadraceError]:
        found: dict[str, Collection | errors.HeadraceError] = {}
        for name in sorted(names):
            try:
                found[name] = await self._hooks.collection(name)
            except errors.HeadraceError as exc:
                found[name] = exc
        return found

    def _check(
        self, ctx: AppendContext, collections: dict[str, Collection | errors.HeadraceError]
    ) -> _Checked | None:
        """The stateless checks of a collection message (None: not one)."""
        msg = ctx.message
        name = msg.properties.get(COLLECTION) if msg.properties else None
        if name is None or (msg.type not in _DATA and msg.type not in _SCHEMA):
            return None
        collection = collections[name]
        if isinstance(collection, errors.HeadraceError):
            if msg.type in _SCHEMA and isinstance(collection, errors.NotFound):
                return _Checked(None)  # a DDL of a collection without record: left to its writer
            return _Checked(None, error=collection)
        if collection.dropped is not None and msg.type in _DATA:
            return _Checked(
                None,
                error=errors.NotFound(
                    f"collection {name} was dropped: it takes no {msg.type.name}"
                ),
            )
        if msg.vchannel not in collection.vchannels:
            return _Checked(
                None,
                error=errors.InvalidArgument(
                    f"{msg.type.name} of collection {name} on {msg.vchannel!r}, which is not "
                    f"one of its shards ({', '.join(collection.vchannels)})"
                ),
            )
        if msg.txn_id and msg.type in _DATA:
            return _Checked(
                None,
                error=errors.InvalidArgument(
                    f"{msg.type.name} of collection {name}: collection data cannot be part of "
                    "a transaction (a transaction is delivered at its commit, which may fall "
                    "after the seal of the segment its rows belong to)"
                ),
            )
        # pyarrow is loaded by the first collection message, not by every node.
        from headrace.table.payloads import check_keys, check_rows, decode  # noqa: PLC0415

        if msg.type is MessageType.INSERT:
            try:
                rows = decode(msg.payload, "insert")
            except errors.InvalidArgument as exc:
                return _Checked(None, error=exc)
            error = check_rows(collection, rows)
            if error is None and ctx.size + _SEGMENT_PROPERTY_BYTES > self._max_bytes:
                error = errors.MessageTooLarge(
                    f"insert into {name}: {ctx.size} bytes leave no room for the segment id "
                    "the WAL adds; send fewer rows per message"
                )
            return _Checked(collection, rows.num_rows, error)
        if msg.type is MessageType.DELETE:
            try:
                keys = decode(msg.payload, "delete")
            except errors.InvalidArgument as exc:
                return _Checked(None, error=exc)
            return _Checked(collection, error=check_keys(collection, keys))
        if msg.type is MessageType.FLUSH and not is_flush_request(msg):
            return _Checked(
                None,
                error=errors.InvalidArgument(
                    f"FLUSH of {name} names segment {msg.properties[SEGMENT]!r}: seals are "
                    "written by the WAL; send a flush request (no headrace.segment) instead"
                ),
            )
        return _Checked(collection)

    async def _reserve(self, count: int) -> None:
        """Have at least ``count`` segment ids reserved."""
        while len(self._ids) < count:
            missing = count - len(self._ids)
            first = await self._tso.allocate(missing)
            self._ids.extend(range(first, first + missing))

    def _decide(
        self,
        ctx: AppendContext,
        found: _Checked | None,
        forward: list[AppendContext],
        groups: list[_SealGroup],
    ) -> None:
        if found is None:
            forward.append(ctx)
            return
        if found.error is not None:
            ctx.fail(found.error)
            return
        msg, table = ctx.message, self.table
        name = msg.properties[COLLECTION]
        if msg.type is MessageType.CREATE_COLLECTION:
            table.create(msg.vchannel)
            forward.append(ctx)
            return
        if msg.type is MessageType.DROP_COLLECTION:
            # Marked dropped at once: the DDL holds the vchannel's lock until
            # it is written, so nothing of the vchannel is decided meanwhile.
            seals = _contexts(table.drop(name, msg.vchannel))
            if seals:
                forward.extend(seals)
                groups.append(_SealGroup(seals, complete=not table.growing))
            forward.append(ctx)
            return
        if msg.vchannel in table.dropped:
            ctx.fail(
                errors.NotFound(
                    f"collection {name} was dropped on {msg.vchannel}: it takes no "
                    f"{msg.type.name} until it is created again"
                )
            )
            return
        if msg.type is MessageType.INSERT:
            assert found.collection is not None
            arrival = Arrival(
                name, msg.vchannel, found.rows, len(msg.payload), self._clock(), self._last_id()
            )
            assigned = table.assign(arrival, new_id=self._ids[0])
            if assigned.segment_id == self._ids[0]:
                self._ids.popleft()
            stamped = dataclasses.replace(
                msg, properties={**msg.properties, SEGMENT: str(assigned.segment_id)}
            )
            ctx.message = stamped
            ctx.size = codec.encoded_size(stamped)
            forward.append(ctx)
            if assigned.full:
                seals = _contexts(table.seal_all())
                forward.extend(seals)
                groups.append(_SealGroup(seals, complete=True))
            return
        if msg.type is MessageType.FLUSH:
            orders = table.seal_all() or [SealOrder(name, msg.vchannel, self._ids.popleft())]
            seals = _contexts(orders)
            forward.extend(seals)
            groups.append(_SealGroup(seals, complete=True, request=ctx))
            return
        forward.append(ctx)

    async def _settle_groups(
        self, groups: list[_SealGroup], record_within: float | None = None
    ) -> None:
        last_complete: AppendResult | None = None
        failure: errors.HeadraceError | None = None
        for group in groups:
            error = next((c.error for c in group.contexts if c.result is None), None)
            if error is not None or any(c.result is None for c in group.contexts):
                failure = error or errors.HeadraceError("a seal was not settled")
                continue
            last = group.contexts[-1].result
            assert last is not None
            if group.request is not None:
                group.request.result = last
            if group.complete:
                last_complete = last
        if failure is not None:
            self._fail(
                errors.Unavailable(
                    f"a seal of {self._pchannel} failed ({failure.message}); the WAL stops "
                    "writing and is reopened, rebuilding its segments from the log"
                )
            )
            for group in groups:
                if group.request is not None and group.request.result is None:
                    group.request.fail(failure)
        if last_complete is None:
            return
        error = await self._record(last_complete, record_within)
        if error is not None:
            for group in groups:
                if group.request is not None and group.request.result is not None:
                    group.request.result = None
                    group.request.fail(
                        errors.Unavailable(
                            f"the seals are written (last at {last_complete.id}) but the seal "
                            f"record of {self._pchannel} is not: {error.message}; retry the flush"
                        )
                    )

    async def _record(
        self, seal: AppendResult, within: float | None = None
    ) -> errors.HeadraceError | None:
        """Record ``seal`` (or remember it for the chores to retry), giving up
        after ``within`` seconds if given."""
        newest = self._unrecorded
        if newest is None or newest.id < seal.id:
            newest = seal
        try:
            async with asyncio.timeout(within):
                await self._hooks.record_seal(
                    self._pchannel, self._term, newest.id, newest.timetick
                )
        except TimeoutError:
            self._unrecorded = newest
            return errors.Unavailable(
                f"recording the seal of {self._pchannel} at {newest.id} took more than {within:g} s"
            )
        except errors.HeadraceError as exc:
            self._unrecorded = newest
            log.warning("recording the seal of %s at %s failed: %s", self._pchannel, seal.id, exc)
            return exc
        self._unrecorded = None
        return None

    def tick_properties(self) -> dict[str, str]:
        """What the WAL's ticks and fences say about its segments."""
        start = self.table.read_from(self._last_id())
        return {} if start is None else {SEGMENTS_FROM: str(start.record_id())}

    # -- capabilities (see .chain) -----------------------------------------

    def stats(self) -> dict[str, object]:
        return {"growing_segments": len(self.table.growing)}

    def chore_due_s(self) -> float | None:
        """Seconds until :meth:`chore` looks again (None: nothing grows and no
        seal record waits)."""
        if not self.table.growing and self._unrecorded is None:
            return None
        return max(0.0, self._next_check - self._clock())

    # -- the timetick chore ------------------------------------------------

    async def chore(self, write: Handler) -> None:
        """Seal on idle time or lifetime; retry an unwritten seal record.

        ``write`` is the appender: the seals are queued right after the
        decision, with no suspension in between. A seal record is given
        ``check_interval_s`` here: the chores run before each timetick, which
        a slow metastore must not hold back."""
        now = self._clock()
        if now < self._next_check:
            return
        bound = self.table.policy.check_interval_s
        self._next_check = now + bound
        reason = self.table.due(now)
        if reason is not None:
            log.info("sealing the growing segments of %s: %s", self._pchannel, reason)
            seals = _contexts(self.table.seal_all())
            await write(seals)
            await self._settle_groups([_SealGroup(seals, complete=True)], bound)
        elif self._unrecorded is not None:
            await self._record(self._unrecorded, bound)


def _contexts(orders: list[SealOrder]) -> list[AppendContext]:
    built = []
    for order in orders:
        msg = order.message()
        built.append(AppendContext(msg, codec.encoded_size(msg)))
    return built

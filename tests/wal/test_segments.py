"""Collections in the WAL: schema checks, segment assignment, seals, recovery.

The pure :class:`SegmentTable` first, then the interceptor in a real framework
WAL on the memory backend, with the node's hooks replaced by :class:`Hooks`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.table import messages, names
from headrace.table.collections import Collection, CollectionSpec, Dropped
from headrace.table.messages import COLLECTION, SEGMENT
from headrace.table.payloads import encode_keys, encode_rows
from headrace.tso import LocalTSO, compose
from headrace.wal.api import AppendResult, WALState
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.segments import (
    SEGMENTS_FROM,
    Arrival,
    SealOrder,
    SegmentPolicy,
    SegmentTable,
    scan_start,
    segment_of,
)
from headrace.wal.memory import MemoryBackend, MemoryMessageID, MemoryStore
from headrace.wal.progress import OpaqueSummary
from spark_apps.shard import fold
from tests.node.harness import until
from tests.wal.delegating import CountingBackend
from tests.wal.test_framework import HookedBackend, backend_log

P = "p"
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
ORDERS = Collection(CollectionSpec("orders", SCHEMA, "pk", shards=2), 1)
USERS = Collection(CollectionSpec("users", SCHEMA, "pk", shards=1), 2)
QUIET = 3_600_000.0
"""A timetick interval of an hour: no chores during a test."""


def rows(pks: Sequence[int]) -> pa.Table:
    return pa.table(
        {"pk": pa.array(pks, pa.int64()), "name": [f"n{p}" for p in pks]}, schema=SCHEMA
    )


def insert(collection: Collection, shard: int, pks: Sequence[int], **extra: str) -> Message:
    return Message(
        MessageType.INSERT,
        collection.vchannels[shard],
        encode_rows(rows(pks)),
        {COLLECTION: collection.name, **extra},
    )


def flush(collection: Collection = ORDERS, shard: int = 0) -> Message:
    return messages.flush_request(collection, collection.vchannels[shard])


def ddl(kind: MessageType, collection: Collection, shard: int = 0) -> Message:
    return Message(kind, collection.vchannels[shard], b"", {COLLECTION: collection.name})


@dataclasses.dataclass
class Hooks:
    """The node's side, in memory."""

    collections: dict[str, Collection] = dataclasses.field(
        default_factory=lambda: {"orders": ORDERS, "users": USERS}
    )
    checkpoint_at: MessageID | None = None
    summary: OpaqueSummary | None = None
    """The previous owner's summary of the opaque records."""
    seals: list[tuple[str, int, MessageID, int]] = dataclasses.field(default_factory=list)
    forgotten: list[str] = dataclasses.field(default_factory=list)
    refuse_records: errors.HeadraceError | None = None
    stall: asyncio.Event | None = None
    """While set to an unset event, recording a seal hangs (a stuck metastore)."""
    lookups: int = 0
    recorded: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    async def collection(self, name: str) -> Collection:
        self.lookups += 1
        found = self.collections.get(name)
        if found is None:
            raise errors.NotFound(f"no collection {name!r}")
        return found

    def forget(self, name: str) -> None:
        self.forgotten.append(name)

    async def checkpoint(self, pchannel: str) -> MessageID | None:
        return self.checkpoint_at

    async def opaque_summary(self, pchannel: str) -> OpaqueSummary | None:
        return self.summary

    async def record_seal(
        self, pchannel: str, term: int, position: MessageID, timetick: int
    ) -> None:
        if self.stall is not None:
            await self.stall.wait()
        if self.refuse_records is not None:
            raise self.refuse_records
        self.seals.append((pchannel, term, position, timetick))
        self.recorded.set()


@dataclasses.dataclass
class Bed:
    store: MemoryStore = dataclasses.field(default_factory=MemoryStore)
    tso: LocalTSO = dataclasses.field(default_factory=LocalTSO)
    hooks: Hooks = dataclasses.field(default_factory=Hooks)

    async def open(
        self, term: int = 1, policy: SegmentPolicy | None = None, interval_ms: float = QUIET
    ) -> WAL:
        options = WALOptions(timetick_interval_ms=interval_ms, segments=policy or SegmentPolicy())
        return await WAL.open(
            MemoryBackend(self.store),
            P,
            term,
            tso=self.tso,
            options=options,
            collections=self.hooks,
        )

    async def log(self) -> list[LogEntry]:
        return await backend_log(MemoryBackend(self.store), P)

    async def data(self) -> list[LogEntry]:
        """The log without the WAL's own ticks and fences."""
        return [e for e in await self.log() if not e.message.type.is_system]


def seals_in(entries: list[LogEntry]) -> list[tuple[str, int]]:
    return [
        (e.message.vchannel, int(e.message.properties[SEGMENT]))
        for e in entries
        if e.message.type is MessageType.FLUSH
    ]


def stamped(result: AppendResult | errors.HeadraceError, entries: list[LogEntry]) -> int:
    assert isinstance(result, AppendResult), result
    (entry,) = [e for e in entries if e.id == result.id]
    segment = segment_of(entry.message)
    assert segment is not None
    return segment


# -- the pure table ------------------------------------------------------------


def arrival(vchannel: str, n: int = 1, at: float = 0.0, size: int = 10) -> Arrival:
    return Arrival(vchannel.rpartition("-")[0], vchannel, n, size, at)


def test_inserts_fill_one_segment_per_vchannel_until_sealed() -> None:
    table = SegmentTable(SegmentPolicy(max_rows=10))
    assert table.assign(arrival("orders-0", 3), new_id=7).segment_id == 7
    assert table.assign(arrival("orders-0", 3), new_id=8).segment_id == 7
    assert table.assign(arrival("orders-1", 3), new_id=9).segment_id == 9
    assert table.seal_all() == [
        SealOrder("orders", "orders-0", 7),
        SealOrder("orders", "orders-1", 9),
    ]
    assert table.growing == {}
    assert table.assign(arrival("orders-0", 1), new_id=10).segment_id == 10


@pytest.mark.parametrize(
    ("policy", "n", "size", "full"),
    [
        (SegmentPolicy(max_rows=5), 4, 1, False),
        (SegmentPolicy(max_rows=5), 5, 1, True),
        (SegmentPolicy(max_bytes=100), 1, 99, False),
        (SegmentPolicy(max_bytes=100), 1, 100, True),
    ],
)
def test_a_segment_is_full_at_its_row_or_byte_limit(
    policy: SegmentPolicy, n: int, size: int, full: bool
) -> None:
    table = SegmentTable(policy)
    assert table.assign(arrival("orders-0", n, size=size), new_id=1).full is full


def test_idle_time_and_lifetime_are_due_from_the_first_and_last_insert() -> None:
    table = SegmentTable(SegmentPolicy(idle_s=10, lifetime_s=25))
    assert table.due(1000.0) is None  # nothing grows
    table.assign(arrival("orders-0", at=100.0), new_id=1)
    assert table.due(109.0) is None
    assert "idle" in (table.due(110.0) or "")
    table.assign(arrival("orders-0", at=108.0), new_id=2)
    table.assign(arrival("orders-0", at=116.0), new_id=3)
    assert table.due(124.0) is None
    assert "lifetime" in (table.due(125.0) or "")


def test_a_drop_seals_its_segment_and_closes_the_vchannel_until_a_create() -> None:
    table = SegmentTable(SegmentPolicy())
    table.assign(arrival("orders-0"), new_id=1)
    table.assign(arrival("users-0"), new_id=2)
    assert table.drop("orders", "orders-0") == [SealOrder("orders", "orders-0", 1)]
    assert list(table.growing) == ["users-0"]
    assert table.dropped == {"orders-0"}
    table.create("orders-0")
    assert table.dropped == set()


@pytest.mark.parametrize(
    "bad",
    [
        {"max_rows": 0},
        {"max_bytes": -1},
        {"idle_s": 0},
        {"lifetime_s": -2.0},
        {"check_interval_s": True},
        {"max_rows": 1.5},
    ],
)
def test_a_bad_policy_is_refused_naming_the_setting(bad: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidArgument, match=next(iter(bad))):
        SegmentPolicy(**bad)  # type: ignore[arg-type]


def replayed(log: list[Message]) -> dict[str, tuple[int, int]]:
    table = SegmentTable(SegmentPolicy())
    for msg in log:
        table.replay(msg, len(msg.payload))
    return {v: (s.segment_id, s.rows) for v, s in table.growing.items()}


def test_replay_keeps_segments_with_inserts_and_no_seal() -> None:
    def ins(vchannel: str, segment: int) -> Message:
        name = vchannel.rpartition("-")[0]
        return Message(
            MessageType.INSERT,
            vchannel,
            b"xx",
            {COLLECTION: name, SEGMENT: str(segment)},
            timetick=compose(1000, 0),
        )

    def seal(vchannel: str, segment: int) -> Message:
        return SealOrder(vchannel.rpartition("-")[0], vchannel, segment).message()

    log = [
        ins("orders-0", 5),
        ins("orders-1", 6),
        seal("orders-0", 5),
        seal("orders-1", 6),
        ins("orders-0", 9),
        ins("orders-0", 9),
        Message(MessageType.INSERT, "opaque", b"zz", {}),
        ins("users-0", 11),
        seal("users-0", 12),  # a marker seal of an empty segment changes nothing
        ddl(MessageType.DROP_COLLECTION, USERS),
    ]
    assert replayed(log) == {"orders-0": (9, 4)}


# -- through a WAL ---------------------------------------------------------------


async def test_inserts_get_the_growing_segment_of_their_vchannel() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        results = await wal.append_many(
            [
                insert(ORDERS, 0, [1, 2]),
                insert(ORDERS, 1, [3]),
                insert(ORDERS, 0, [4], **{SEGMENT: "42"}),  # a producer's id is replaced
                insert(USERS, 0, [5]),
            ]
        )
        second = await wal.append(insert(ORDERS, 1, [6]))
    finally:
        await wal.close()
    entries = await bed.log()
    ids = [stamped(r, entries) for r in results]
    assert ids[0] == ids[2] != ids[1]
    assert len(set(ids)) == 3
    assert stamped(second, entries) == ids[1]
    assert 42 not in ids


async def test_a_bad_message_is_refused_alone_naming_the_field_and_nothing_of_it_is_written() -> (
    None
):
    bed = Bed()
    wal = await bed.open()
    wrong_type = pa.table({"pk": pa.array(["a"]), "name": ["x"]})
    good_before = insert(ORDERS, 0, [1])
    good_after = Message(
        MessageType.DELETE, "orders-1", encode_keys(ORDERS, [2]), {COLLECTION: "orders"}
    )
    bad = [
        Message(MessageType.INSERT, "orders-0", encode_rows(wrong_type), {COLLECTION: "orders"}),
        Message(MessageType.INSERT, "orders-0", b"not arrow", {COLLECTION: "orders"}),
        Message(
            MessageType.INSERT,
            "orders-0",
            encode_rows(pa.table({"pk": pa.array([1], pa.int64()), "extra": [1]})),
            {COLLECTION: "orders"},
        ),
        Message(
            MessageType.DELETE,
            "orders-0",
            encode_rows(pa.table({"pk": pa.array(["k"])})),
            {COLLECTION: "orders"},
        ),
        Message(MessageType.INSERT, "orders-7", encode_rows(rows([1])), {COLLECTION: "orders"}),
        Message(MessageType.INSERT, "ghost-0", encode_rows(rows([1])), {COLLECTION: "ghost"}),
        messages.seal(ORDERS, "orders-0", 5),
    ]
    try:
        results = await wal.append_many([good_before, *bad, good_after])
    finally:
        await wal.close()
    assert isinstance(results[0], AppendResult)
    assert isinstance(results[-1], AppendResult)
    refused = results[1:-1]
    expected = [
        (errors.InvalidArgument, "field 'pk' has type string"),
        (errors.InvalidArgument, "not an Arrow IPC stream"),
        (errors.InvalidArgument, "unexpected field 'extra'"),
        (errors.InvalidArgument, "primary key 'pk' has type int64"),
        (errors.InvalidArgument, "not one of its shards"),
        (errors.NotFound, "ghost"),
        (errors.InvalidArgument, "seals are written by the WAL"),
    ]
    for outcome, (kind, text) in zip(refused, expected, strict=True):
        assert isinstance(outcome, kind), outcome
        assert text in outcome.message
    written = [r.id for r in results if isinstance(r, AppendResult)]
    assert [e.id for e in await bed.data()] == written
    assert len(written) == 2


async def test_collection_data_in_a_transaction_is_refused() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        begun = await wal.append(Message(MessageType.BEGIN_TXN, "orders-0"))
        body = dataclasses.replace(insert(ORDERS, 0, [1]), txn_id=begun.txn_id)
        (outcome,) = await wal.append_many([body])
    finally:
        await wal.close()
    assert isinstance(outcome, errors.InvalidArgument)
    assert "transaction" in outcome.message


async def test_opaque_messages_are_left_alone_and_cost_no_lookup() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        await wal.append_many(
            [
                Message(MessageType.INSERT, "logs", b"raw", {"k": "v"}),
                Message(MessageType.INSERT, "logs", b"r2"),
            ]
        )
    finally:
        await wal.close()
    assert bed.hooks.lookups == 0
    assert [e.message.properties for e in await bed.data()] == [{"k": "v"}, {}]


async def test_a_flush_request_is_replaced_by_seals_of_every_growing_segment() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        written = await wal.append_many(
            [insert(ORDERS, 0, [1]), insert(ORDERS, 1, [2]), insert(USERS, 0, [3])]
        )
        done = await wal.append(flush(ORDERS, 1))
        after = await wal.append(insert(ORDERS, 0, [4]))
    finally:
        await wal.close()
    entries = await bed.data()
    segments = {
        e.message.vchannel: stamped(r, entries) for r, e in zip(written, entries[:3], strict=True)
    }
    seals = [e for e in entries if e.message.type is MessageType.FLUSH]
    assert seals_in(seals) == sorted(segments.items())
    assert done.id == seals[-1].id  # the request's position is the last seal
    assert not any(names.is_flush_request(e.message) for e in entries)
    assert bed.hooks.seals == [(P, 1, done.id, done.timetick)]
    assert stamped(after, entries) not in segments.values()  # a new segment


async def test_a_flush_request_with_nothing_growing_writes_a_marker_seal() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        first = await wal.append(flush(USERS))
        second = await wal.append(flush(USERS))
    finally:
        await wal.close()
    entries = await bed.data()
    assert [e.id for e in entries] == [first.id, second.id]
    markers = seals_in(entries)
    assert [v for v, _ in markers] == ["users-0", "users-0"]
    assert markers[0][1] != markers[1][1]  # a fresh, empty segment each time
    assert [s[2] for s in bed.hooks.seals] == [first.id, second.id]


async def test_a_full_segment_seals_every_growing_segment_right_after_its_insert() -> None:
    bed = Bed()
    wal = await bed.open(policy=SegmentPolicy(max_rows=5))
    try:
        await wal.append_many([insert(USERS, 0, [1]), insert(ORDERS, 0, [1, 2, 3])])
        filling = await wal.append_many([insert(ORDERS, 0, [4, 5]), insert(ORDERS, 1, [6])])
    finally:
        await wal.close()
    entries = await bed.data()
    kinds = [(e.message.type, e.message.vchannel) for e in entries]
    assert kinds == [
        (MessageType.INSERT, "users-0"),
        (MessageType.INSERT, "orders-0"),
        (MessageType.INSERT, "orders-0"),
        (MessageType.FLUSH, "orders-0"),
        (MessageType.FLUSH, "users-0"),
        (MessageType.INSERT, "orders-1"),
    ]
    assert stamped(filling[1], entries) not in {stamped(r, entries) for r in [filling[0]]}
    assert bed.hooks.seals[-1][2] == entries[4].id


async def test_idle_segments_are_sealed_by_the_timetick_chores() -> None:
    bed = Bed()
    policy = SegmentPolicy(idle_s=0.2, lifetime_s=3600, check_interval_s=0.05)
    wal = await bed.open(policy=policy, interval_ms=20)
    try:
        await wal.append_many([insert(ORDERS, 0, [1]), insert(USERS, 0, [2])])
        async with asyncio.timeout(10):
            await bed.hooks.recorded.wait()
    finally:
        await wal.close()
    entries = await bed.data()
    assert seals_in(entries) == [
        ("orders-0", stamped_id(entries, "orders-0")),
        ("users-0", stamped_id(entries, "users-0")),
    ]
    assert (
        bed.hooks.seals[0][2] == [e for e in entries if e.message.type is MessageType.FLUSH][-1].id
    )


def stamped_id(entries: list[LogEntry], vchannel: str) -> int:
    (entry,) = [
        e
        for e in entries
        if e.message.type is MessageType.INSERT and e.message.vchannel == vchannel
    ]
    value = segment_of(entry.message)
    assert value is not None
    return value


async def test_a_lifetime_seal_comes_even_while_inserts_keep_coming() -> None:
    bed = Bed()
    policy = SegmentPolicy(idle_s=3600, lifetime_s=0.3, check_interval_s=0.05)
    wal = await bed.open(policy=policy, interval_ms=20)
    try:
        async with asyncio.timeout(10):
            pk = 0
            while not bed.hooks.seals:
                pk += 1
                await wal.append(insert(ORDERS, 0, [pk]))
                await asyncio.sleep(0.02)
    finally:
        await wal.close()
    assert seals_in(await bed.data())


async def test_a_drop_seals_the_collection_and_refuses_its_data_until_created_again() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        growing = await wal.append(insert(USERS, 0, [1]))
        await wal.append(insert(ORDERS, 0, [1]))
        await wal.append(ddl(MessageType.DROP_COLLECTION, USERS))
        refused = await wal.append_many([insert(USERS, 0, [2]), flush(USERS)])
        await wal.append(ddl(MessageType.CREATE_COLLECTION, USERS))
        again = await wal.append(insert(USERS, 0, [3]))
    finally:
        await wal.close()
    entries = await bed.data()
    kinds = [e.message.type for e in entries]
    assert kinds == [
        MessageType.INSERT,
        MessageType.INSERT,
        MessageType.FLUSH,
        MessageType.DROP_COLLECTION,
        MessageType.CREATE_COLLECTION,
        MessageType.INSERT,
    ]
    assert seals_in(entries) == [("users-0", stamped(growing, entries))]
    for outcome in refused:
        assert isinstance(outcome, errors.NotFound)
        assert "users was dropped on users-0" in outcome.message
    assert stamped(again, entries) != stamped(growing, entries)
    assert bed.hooks.forgotten == ["users", "users"]
    assert bed.hooks.seals == []  # orders-0 still grows: no position where nothing grows


async def test_a_failed_seal_record_fails_the_flush_request_and_is_retried_by_the_chores() -> None:
    bed = Bed()
    bed.hooks.refuse_records = errors.Unavailable("metastore down")
    wal = await bed.open(policy=SegmentPolicy(check_interval_s=0.05), interval_ms=20)
    try:
        await wal.append(insert(ORDERS, 0, [1]))
        (outcome,) = await wal.append_many([flush()])
        assert isinstance(outcome, errors.Unavailable)
        assert "seal record" in outcome.message and "metastore down" in outcome.message
        bed.hooks.refuse_records = None
        async with asyncio.timeout(10):
            await bed.hooks.recorded.wait()
    finally:
        await wal.close()
    (seal,) = [e for e in await bed.data() if e.message.type is MessageType.FLUSH]
    assert bed.hooks.seals[0][2] == seal.id


# -- recovery ----------------------------------------------------------------------


async def test_a_new_owner_continues_the_growing_segments_from_the_checkpoint() -> None:
    bed = Bed()
    wal = await bed.open(term=1)
    first = await wal.append_many([insert(ORDERS, 0, [1]), insert(ORDERS, 1, [2])])
    sealed = await wal.append(flush())
    growing = await wal.append_many([insert(ORDERS, 0, [3, 4]), insert(USERS, 0, [5])])
    await wal.close()
    bed.hooks.checkpoint_at = sealed.id  # a flush of (start, sealed] committed
    wal = await bed.open(term=2)
    try:
        grown = {v: (s.segment_id, s.rows) for v, s in wal._segments.table.growing.items()}  # type: ignore[union-attr]
        more = await wal.append(insert(ORDERS, 0, [6]))
        done = await wal.append(flush(USERS))
    finally:
        await wal.close()
    entries = await bed.log()
    assert grown == {
        "orders-0": (stamped(growing[0], entries), 2),
        "users-0": (stamped(growing[1], entries), 1),
    }
    assert stamped(more, entries) == stamped(growing[0], entries)
    assert {stamped(r, entries) for r in first}.isdisjoint(grown)
    assert bed.hooks.seals[-1] == (P, 2, done.id, done.timetick)
    # the next flush range (checkpoint, last seal] folds on every shard
    in_range = [e for e in entries if sealed.id < e.id <= done.id]
    folded = {
        v: fold(c, v, [e for e in in_range if e.message.vchannel == v])
        for c in (ORDERS, USERS)
        for v in c.vchannels
    }
    assert sorted(folded["orders-0"].segments[0].rows.column("pk").to_pylist()) == [3, 4, 6]
    assert folded["orders-1"].segments == ()
    assert folded["users-0"].segments[0].rows.column("pk").to_pylist() == [5]


async def test_recovery_without_a_checkpoint_reads_the_whole_log() -> None:
    bed = Bed()
    wal = await bed.open(term=1)
    grew = await wal.append(insert(ORDERS, 1, [1]))
    await wal.close()
    wal = await bed.open(term=2)
    try:
        grown = {v: s.segment_id for v, s in wal._segments.table.growing.items()}  # type: ignore[union-attr]
    finally:
        await wal.close()
    assert grown == {"orders-1": stamped(grew, await bed.log())}


# -- a property: every prefix ending at a recorded seal folds --------------------

Op = tuple[str, int, int]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.sampled_from([0, 1, 2]), st.integers(1, 4)),
        st.tuples(st.just("flush"), st.sampled_from([0, 1, 2]), st.just(0)),
        # a new owner; 1: after a flush committed up to the last recorded seal
        st.tuples(st.just("reopen"), st.just(0), st.integers(0, 1)),
    ),
    max_size=25,
)
TARGETS = [(ORDERS, 0), (ORDERS, 1), (USERS, 0)]


async def run_ops(script: list[Op]) -> tuple[Bed, list[tuple[int, MessageID]], set[int]]:
    bed = Bed()
    term = 1
    wal = await bed.open(term=term, policy=SegmentPolicy(max_rows=6))
    pk = 0
    try:
        for kind, target, n in script:
            collection, shard = TARGETS[target]
            if kind == "insert":
                await wal.append(insert(collection, shard, list(range(pk, pk + n))))
                pk += n
            elif kind == "flush":
                await wal.append(flush(collection, shard))
            else:
                await wal.close()
                if n and bed.hooks.seals:
                    bed.hooks.checkpoint_at = bed.hooks.seals[-1][2]
                term += 1
                wal = await bed.open(term=term, policy=SegmentPolicy(max_rows=6))
        growing = {s.segment_id for s in wal._segments.table.growing.values()}  # type: ignore[union-attr]
    finally:
        await wal.close()
    return bed, [(t, pos) for _, t, pos, _ in bed.hooks.seals], growing


@settings(max_examples=60, deadline=None)
@given(ops)
def test_every_recorded_seal_ends_a_range_that_folds(script: list[Op]) -> None:
    bed, recorded, growing = asyncio.run(run_ops(script))
    entries = asyncio.run(bed.log())
    previous: MessageID | None = None
    for _term, position in recorded:
        in_range = [
            e for e in entries if (previous is None or previous < e.id) and e.id <= position
        ]
        for collection, shard in TARGETS:
            vchannel = collection.vchannels[shard]
            fold(collection, vchannel, [e for e in in_range if e.message.vchannel == vchannel])
        previous = position
    # what is after the last recorded seal is exactly what still grows
    tail = [e for e in entries if previous is None or previous < e.id]
    assert {segment_of(e.message) for e in tail if e.message.type is MessageType.INSERT} == growing
    ids = [segment_of(e.message) for e in entries if e.message.type is MessageType.FLUSH]
    assert len(ids) == len(set(ids))  # a segment is sealed once, ids are never reused


async def test_a_seal_whose_append_failed_stops_the_wal_and_the_reopen_rebuilds_from_the_log() -> (
    None
):
    backend = HookedBackend()
    hooks = Hooks()
    options = WALOptions(timetick_interval_ms=QUIET)
    tso = LocalTSO()
    wal = await WAL.open(backend, P, 1, tso=tso, options=options, collections=hooks)
    grew = await wal.append(insert(ORDERS, 0, [1]))
    backend.writers[-1].fail_before = errors.Unavailable("broker hiccup")
    (outcome,) = await wal.append_many([flush()])
    assert isinstance(outcome, errors.Unavailable)
    assert wal.state is WALState.UNAVAILABLE  # never guesses whether the seal is in
    await wal.close()
    wal = await WAL.open(backend, P, 2, tso=tso, options=options, collections=hooks)
    try:
        done = await wal.append(flush())
    finally:
        await wal.close()
    entries = await backend_log(backend, P)
    assert seals_in([e for e in entries if e.message.type is MessageType.FLUSH]) == [
        ("orders-0", stamped(grew, entries))
    ]
    assert hooks.seals == [(P, 2, done.id, done.timetick)]


async def test_a_create_without_the_collection_property_also_reopens_a_dropped_vchannel() -> None:
    bed = Bed()
    wal = await bed.open()
    try:
        await wal.append(ddl(MessageType.DROP_COLLECTION, USERS))
        (refused,) = await wal.append_many([insert(USERS, 0, [1])])
        await wal.append(Message(MessageType.CREATE_COLLECTION, "users-0"))
        (taken,) = await wal.append_many([insert(USERS, 0, [2])])
    finally:
        await wal.close()
    assert isinstance(refused, errors.NotFound)
    assert isinstance(taken, AppendResult)


async def test_dropped_vchannels_are_rebuilt_from_the_log() -> None:
    bed = Bed()
    wal = await bed.open(term=1)
    await wal.append(insert(USERS, 0, [1]))
    await wal.append(ddl(MessageType.DROP_COLLECTION, USERS))
    await wal.close()
    wal = await bed.open(term=2)
    try:
        (refused,) = await wal.append_many([insert(USERS, 0, [2])])
    finally:
        await wal.close()
    assert isinstance(refused, errors.NotFound)
    assert "dropped" in refused.message


async def test_a_stuck_seal_record_does_not_hold_back_the_timeticks() -> None:
    bed = Bed()
    bed.hooks.stall = asyncio.Event()
    policy = SegmentPolicy(idle_s=0.1, check_interval_s=0.05)
    wal = await bed.open(policy=policy, interval_ms=10)
    try:
        await wal.append(insert(ORDERS, 0, [1]))
        await until(lambda: wal.stats()["growing_segments"] == 0)  # sealed
        ticks = wal.last_timetick
        await until(lambda: wal.last_timetick > ticks)  # the chores gave up on the record
        assert bed.hooks.seals == []
        bed.hooks.stall.set()  # the metastore answers again: the chores record it
        async with asyncio.timeout(10):
            await bed.hooks.recorded.wait()
    finally:
        await wal.close()
    (seal,) = [e for e in await bed.data() if e.message.type is MessageType.FLUSH]
    assert bed.hooks.seals[-1][2] == seal.id


# -- where the open reads from ---------------------------------------------------


def test_the_scan_starts_at_the_later_of_checkpoint_and_the_ticks_hint() -> None:
    early, late = MemoryMessageID(3), MemoryMessageID(9)
    tick = Message(MessageType.TIME_TICK, properties={SEGMENTS_FROM: str(late)})
    assert scan_start(None, tick) == late
    assert scan_start(early, tick) == late
    assert scan_start(MemoryMessageID(12), tick) == MemoryMessageID(12)
    data = Message(MessageType.INSERT, "v", b"", {SEGMENTS_FROM: str(late)})  # not the WAL's
    assert scan_start(early, data) == early
    assert scan_start(None, Message(MessageType.TIME_TICK)) is None
    assert (
        scan_start(early, Message(MessageType.FENCE, properties={SEGMENTS_FROM: "junk"})) == early
    )


def test_the_hint_is_the_oldest_growing_segments_start_or_the_last_record() -> None:
    table = SegmentTable(SegmentPolicy())
    assert table.read_from(MemoryMessageID(5)) == MemoryMessageID(5)
    table.assign(dataclasses.replace(arrival("orders-0"), since=MemoryMessageID(7)), new_id=1)
    table.assign(dataclasses.replace(arrival("users-0"), since=MemoryMessageID(4)), new_id=2)
    assert table.read_from(MemoryMessageID(20)) == MemoryMessageID(4)
    table.assign(arrival("orders-1"), new_id=3)  # opened on an empty log
    assert table.read_from(MemoryMessageID(20)) is None


async def reopen_counting(bed: Bed, term: int) -> tuple[WAL, CountingBackend]:
    backend = CountingBackend(MemoryBackend(bed.store))
    options = WALOptions(timetick_interval_ms=QUIET)
    wal = await WAL.open(backend, P, term, tso=bed.tso, options=options, collections=bed.hooks)
    return wal, backend


async def test_an_open_reads_only_from_the_oldest_growing_segment_not_the_whole_log() -> None:
    bed = Bed()
    wal = await bed.open(term=1)
    await wal.append_many([Message(MessageType.INSERT, "logs", b"%d" % i) for i in range(500)])
    await wal.close()
    wal, counting = await reopen_counting(bed, 2)  # nothing grows: the tail alone
    await wal.append_many([Message(MessageType.INSERT, "logs", b"%d" % i) for i in range(500)])
    grew = await wal.append(insert(ORDERS, 0, [1]))
    await wal.append_many([Message(MessageType.INSERT, "logs", b"%d" % i) for i in range(100)])
    await wal.close()
    assert counting.fetched < 10
    wal, counting = await reopen_counting(bed, 3)
    try:
        grown = {v: s.segment_id for v, s in wal._segments.table.growing.items()}  # type: ignore[union-attr]
    finally:
        await wal.close()
    assert grown == {"orders-0": stamped(grew, await bed.log())}
    assert 100 < counting.fetched < 120  # from just before the insert


async def test_a_log_without_hints_or_checkpoint_is_read_whole() -> None:
    bed = Bed()
    wal = await WAL.open(MemoryBackend(bed.store), P, 1, tso=bed.tso, options=WALOptions())
    await wal.append(insert(ORDERS, 0, [1], **{SEGMENT: "77"}))  # a writer without the node
    await wal.append_many([Message(MessageType.INSERT, "logs", b"%d" % i) for i in range(300)])
    await wal.close()
    wal, counting = await reopen_counting(bed, 2)
    try:
        grown = {v: s.segment_id for v, s in wal._segments.table.growing.items()}  # type: ignore[union-attr]
    finally:
        await wal.close()
    assert grown == {"orders-0": 77}
    assert counting.fetched > 300


async def test_a_collection_recorded_as_dropped_refuses_data_the_log_never_showed_dropped() -> None:
    """A WAL opened after the drop (its DROP_COLLECTION below the checkpoint, or on
    another pchannel's shard) still refuses the collection's data: the record's
    ``dropped`` mark decides."""
    bed = Bed()
    bed.hooks.collections["users"] = dataclasses.replace(USERS, dropped=Dropped(at=1.0))
    wal = await bed.open()
    try:
        refused = await wal.append_many([insert(USERS, 0, [1]), flush(USERS)])
        kept = await wal.append(insert(ORDERS, 0, [1]))
    finally:
        await wal.close()
    for outcome in refused:
        assert isinstance(outcome, errors.NotFound)
        assert "users was dropped" in outcome.message
    assert [e.message.type for e in await bed.data()] == [MessageType.INSERT]
    assert kept.id == (await bed.data())[0].id

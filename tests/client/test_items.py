"""How a producer cuts a call's messages into items, checks them per call and
settles them per item (pure parts), and that every message still gets its own
outcome in its place, from a real owner."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions, arguments
from headrace.client.producer import batch_producer_id
from headrace.client.sending import Call, Group, Item, Sealing, budget_size, group, items, seal
from headrace.message import batch
from headrace.message.batch import Limits
from headrace.message.types import Message, MessageType
from headrace.table.messages import COLLECTION
from headrace.wal.api import AppendResult
from headrace.wal.memory.message_id import MemoryMessageID
from tests.client.test_batch_producer import P, format_2_pair, logged
from tests.node.harness import Cluster


def ins(vchannel: str, payload: bytes, txn_id: int = 0) -> Message:
    return Message(MessageType.INSERT, vchannel, payload, txn_id=txn_id)


async def call(count: int, first_seq: int = 100) -> Call:
    await asyncio.sleep(0)  # Group needs a running loop
    return Call(Group(count), "p", first_seq, 0.0)


def shape(found: list[Item]) -> list[tuple[str, list[bytes], list[int]]]:
    return [(i.vchannel, [m.payload for m in i.messages], list(i.indexes)) for i in found]


async def test_a_call_of_one_vchannel_is_one_item() -> None:
    msgs = [ins("a", bytes(10))] * 300
    (item,) = items(msgs, range(300), await call(300), ProducerOptions())
    assert item.indexes == range(300), "outcomes go to one slice of the call's results"
    assert item.seq == 100 and len(item.messages) == 300
    assert item.size == budget_size(msgs) == 300 * (10 + 1 + 96)
    assert item.records == 300 * (batch.RECORD_HEADER_SIZE + 10)


async def test_a_call_of_one_vchannel_is_cut_at_the_batch_bounds() -> None:
    msgs = [ins("a", str(i).encode()) for i in range(10)]
    found = items(msgs, range(10), await call(10), ProducerOptions(max_batch_messages=4))
    assert shape(found) == [
        ("a", [b"0", b"1", b"2", b"3"], [0, 1, 2, 3]),
        ("a", [b"4", b"5", b"6", b"7"], [4, 5, 6, 7]),
        ("a", [b"8", b"9"], [8, 9]),
    ]
    assert [i.seq for i in found] == [100, 104, 108], "each message its own sequence, in order"
    assert [i.indexes for i in found] == [range(0, 4), range(4, 8), range(8, 10)]
    assert sum(i.size for i in found) == budget_size(msgs)
    head = batch.HEADER_SIZE + 1
    by_bytes = items(
        [ins("a", bytes(100))] * 5,
        range(5),
        await call(5),
        ProducerOptions(max_batch_bytes=head + 2 * (batch.RECORD_HEADER_SIZE + 100)),
    )
    assert [len(i.messages) for i in by_bytes] == [2, 2, 1]


async def test_a_call_over_the_batch_bytes_is_cut_by_bytes_without_going_message_by_message() -> (
    None
):
    # 1,100 messages of 1 KiB: over 1 MiB in all, so one item of 1,024 would
    # pass max_batch_bytes. They are cut where the bytes say, each item still
    # one slice of the call's results (a range: settled as a run), in order.
    msgs = [ins("a", bytes(1024))] * 1100
    found = items(msgs, range(1100), await call(1100), ProducerOptions())
    per = (ProducerOptions().max_batch_bytes - batch.HEADER_SIZE - 1) // (
        batch.RECORD_HEADER_SIZE + 1024
    )
    assert [len(i.messages) for i in found] == [per, 1100 - per]
    assert [i.indexes for i in found] == [range(0, per), range(per, 1100)]
    assert [i.seq for i in found] == [100, 100 + per]
    assert [i.records for i in found] == [
        n * (batch.RECORD_HEADER_SIZE + 1024) for n in (per, 1100 - per)
    ]
    assert sum(i.size for i in found) == budget_size(msgs)


@pytest.mark.parametrize(
    "sizes", [[100] * 7, [10, 300, 10, 10, 200, 90, 5, 300], [250] * 3 + [1] * 9]
)
async def test_cutting_by_bytes_in_one_pass_agrees_with_cutting_message_by_message(
    sizes: list[int],
) -> None:
    # Payloads of mixed sizes, a bound of 2-3 records: the cuts of one call of
    # one vchannel are those of the same messages cut one by one (a second
    # vchannel's message, sent last, makes the call take that path).
    head = batch.HEADER_SIZE + 1
    options = ProducerOptions(max_batch_bytes=head + 3 * (batch.RECORD_HEADER_SIZE + 120))
    msgs = [ins("a", bytes(n)) for n in sizes]
    one_pass = items(msgs, range(len(msgs)), await call(len(msgs)), options)
    by_message = items([*msgs, ins("b", b"")], range(len(msgs) + 1), await call(99), options)[:-1]
    assert [len(i.messages) for i in one_pass] == [len(i.messages) for i in by_message]
    assert [list(i.indexes) for i in one_pass] == [list(i.indexes) for i in by_message]
    assert [(i.size, i.records) for i in one_pass] == [(i.size, i.records) for i in by_message]
    assert all(isinstance(i.indexes, range) for i in one_pass)


async def test_a_message_over_the_batch_bytes_still_goes_alone() -> None:
    head = batch.HEADER_SIZE + 1
    options = ProducerOptions(max_batch_bytes=head + batch.RECORD_HEADER_SIZE + 100)
    msgs = [ins("a", bytes(50)), ins("a", bytes(500)), ins("a", bytes(50))]
    found = items(msgs, range(3), await call(3), options)
    assert [list(i.indexes) for i in found] == [[0], [1], [2]]


async def test_items_keep_order_per_vchannel_and_end_at_a_txn_or_a_message_that_goes_alone() -> (
    None
):
    msgs = [
        ins("a", b"1"),
        ins("b", b"2"),
        ins("a", b"3"),
        Message(MessageType.DROP_PARTITION, "a", b"ddl"),
        ins("a", b"4"),
        ins("b", b"5"),
        ins("a", b"t1", txn_id=7),
        ins("a", b"6"),
        Message(MessageType.INSERT, "b", b"c", {COLLECTION: "orders"}),
        ins("b", b"7"),
    ]
    at = [3, 4, 6, 7, 9, 10, 12, 13, 15, 16]  # a call's other messages were bad
    found = items(msgs, at, await call(17), ProducerOptions())
    assert shape(found) == [
        ("a", [b"1", b"3"], [3, 6]),
        ("b", [b"2", b"5"], [4, 10]),
        ("a", [b"ddl"], [7]),
        ("a", [b"4"], [9]),
        ("a", [b"t1"], [12]),
        ("a", [b"6"], [13]),
        ("b", [b"c"], [15]),
        ("b", [b"7"], [16]),
    ]
    assert [i.alone for i in found] == [False, False, True, False, False, False, True, False]
    seqs = [i.seq + k for i in found for k in range(len(i.messages))]
    assert sorted(seqs) == list(range(100, 110)), "every message its own dedup sequence"
    assert sum(i.size for i in found) == sum(len(m.payload) + 1 + 96 for m in msgs)


async def test_an_item_over_the_owners_batch_bound_is_cut_with_its_budget_share() -> None:
    msgs = [ins("a", bytes(100))] * 5
    (item,) = items(msgs, range(5), await call(5), ProducerOptions())
    found = group([item], batch.HEADER_SIZE + 1 + 2 * (batch.RECORD_HEADER_SIZE + 100))
    assert [[len(i.messages) for i in b] for b in found] == [[2], [2], [1]]
    parts = [i for b in found for i in b]
    assert [list(i.indexes) for i in parts] == [[0, 1], [2, 3], [4]]
    assert [i.seq for i in parts] == [100, 102, 104]
    assert sum(i.size for i in parts) == item.size, "the parts give back what the item took"


async def test_a_bad_message_inside_an_item_fails_alone() -> None:
    msgs = [ins("a", b"1"), ins("a", b"x" * 300), ins("a", b"2")]
    (item,) = items(msgs, range(3), await call(3), ProducerOptions())
    sequence = itertools.count(1)
    sealing = Sealing(batch_producer_id("p"), lambda: next(sequence), Limits(200, 4000))
    sealed, failed = seal([item], sealing)
    assert [(list(i.indexes), type(e)) for i, e in failed] == [([1], errors.MessageTooLarge)]
    assert [[list(i.indexes) for i in s.items] for s in sealed] == [[[0]], [[2]]]
    assert [[m.payload for m in batch.messages(s.data)] for s in sealed] == [[b"1"], [b"2"]]
    assert [s.count for s in sealed] == [1, 1]


async def test_a_group_is_settled_an_item_at_a_time() -> None:
    await asyncio.sleep(0)
    outcomes = Group(6)
    first = AppendResult(MemoryMessageID(1), 1, 1)
    second = AppendResult(first.id, 2, 1)
    failed = errors.MessageTooLarge("too large")
    outcomes.settle(0, errors.InvalidArgument("bad"))
    outcomes.settle_run(range(1, 3), [first, second])
    assert not outcomes.future.done()
    outcomes.settle_run([3, 5], failed)
    outcomes.settle_run([4], [second])
    assert outcomes.future.done()
    found = outcomes.future.result()
    assert [type(o).__name__ for o in found] == [
        "InvalidArgument",
        "AppendResult",
        "AppendResult",
        "MessageTooLarge",
        "AppendResult",
        "MessageTooLarge",
    ]
    assert found[1] is first and found[2] is second and found[4] is second


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("not a message", "not a Message"),
        (Message(MessageType.INSERT, "unseen-vchannel", b"x"), "a vchannel not checked yet"),
        (Message(MessageType.INSERT, "a", bytearray(b"x")), "a bytearray payload"),  # type: ignore[arg-type]
        (Message(MessageType.INSERT, "a", b"x", {"k": "v"}), "properties"),
        (Message(MessageType.TIME_TICK, "a", b"x"), "a type the WAL writes"),
        (Message(1, "a", b"x"), "a type given as its code"),  # type: ignore[arg-type]
        (Message(MessageType.INSERT, "a", b"x", txn_id=-1), "a negative txn id"),
        (Message(MessageType.INSERT, "a", b"x", txn_id=True), "a bool txn id"),
    ],
)
def test_a_call_is_checked_as_a_whole_only_when_every_message_is_common(
    bad: object, why: str
) -> None:
    good = Message(MessageType.INSERT, "a", b"x")
    assert arguments.message(good) is good  # remembers the vchannel
    assert arguments.common([good] * 3)
    assert not arguments.common([good, bad, good]), why  # type: ignore[list-item]


async def test_each_message_gets_its_own_result_in_its_place(cluster: Cluster) -> None:
    """Calls mixing vchannels, bad messages and items cut at the bounds: every
    outcome is the result of the message at its index (read back by its id)."""
    await format_2_pair(cluster)
    options = ProducerOptions(max_batch_messages=16, producer_id="placed")
    calls = [
        [
            Message(MessageType.INSERT, ("a", "bb")[(c + i) % 2], f"{c}/{i}".encode())
            if i % 7
            else Message(MessageType.INSERT, "a", f"{c}/{i}")  # type: ignore[arg-type]
            for i in range(12)
        ]
        for c in range(6)
    ]
    async with (
        HeadraceClient(cluster.url, "test") as client,
        client.producer(options) as producer,
    ):
        found = await asyncio.gather(*(producer.send_many(msgs) for msgs in calls))
    stored = {}
    for data, header, msgs in logged(cluster):
        record = cluster.store.channels[P].records.index(data)
        for k, msg in enumerate(msgs):
            stored[(record, k)] = (header.vchannel, msg.payload)
    for msgs, outcomes in zip(calls, found, strict=True):
        assert len(outcomes) == len(msgs)
        for i, (msg, outcome) in enumerate(zip(msgs, outcomes, strict=True)):
            if i % 7 == 0:
                assert isinstance(outcome, errors.InvalidArgument), outcome
                continue
            assert isinstance(outcome, AppendResult), outcome
            key = (outcome.id.record_id().sort_key()[0], outcome.id.index)
            assert stored[key] == (msg.vchannel, msg.payload)
    assert any(len(msgs) > 6 for _d, _h, msgs in logged(cluster)), (
        "a batch holds the items of several calls"
    )


async def test_calls_spread_over_many_vchannels_get_each_result_in_its_place(
    cluster: Cluster,
) -> None:
    """Calls whose messages each go to another vchannel (a record batch of one
    message each), one message too large in the middle: every outcome is the
    result of the message at its index, the large one fails alone, and the
    producer's budget is all given back."""
    await format_2_pair(cluster)
    calls = [
        [Message(MessageType.INSERT, f"s{c}-{i}", f"{c}/{i}".encode()) for i in range(40)]
        for c in range(3)
    ]
    calls[1][17] = Message(MessageType.INSERT, "s1-17", bytes(9 << 20))
    async with (
        HeadraceClient(cluster.url, "test") as client,
        client.producer(ProducerOptions(producer_id="spread")) as producer,
    ):
        found = await asyncio.gather(*(producer.send_many(msgs) for msgs in calls))
        assert producer.budget.used == 0
    stored = {}
    for data, header, msgs in logged(cluster):
        assert header.count == 1
        record = cluster.store.channels[P].records.index(data)
        stored[record] = (header.vchannel, msgs[0].payload)
    for c, (msgs, outcomes) in enumerate(zip(calls, found, strict=True)):
        for i, (msg, outcome) in enumerate(zip(msgs, outcomes, strict=True)):
            if (c, i) == (1, 17):
                assert isinstance(outcome, errors.MessageTooLarge), outcome
                continue
            assert isinstance(outcome, AppendResult), outcome
            assert outcome.id.index == 0
            assert stored[outcome.id.sort_key()[0]] == (msg.vchannel, msg.payload)
    assert len(stored) == 3 * 40 - 1

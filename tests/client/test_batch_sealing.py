"""How a lane groups and seals messages into record batches (pure parts)."""

from __future__ import annotations

import asyncio
import itertools

from headrace import errors
from headrace.client.producer import batch_producer_id
from headrace.client.sending import Group, Item, Sealing, group, record_size, seal
from headrace.message import batch
from headrace.message.batch import Limits
from headrace.message.types import Message, MessageType
from headrace.table.messages import COLLECTION
from headrace.wal.validation import goes_alone


def items(*msgs: Message) -> list[Item]:
    """Each message an item of its own (as a call of several vchannels makes them)."""
    outcomes = Group(len(msgs))
    return [
        Item([m], [i], outcomes, "p", i + 1, len(m.payload), record_size(m), 0.0, goes_alone(m))
        for i, m in enumerate(msgs)
    ]


def shape(batches: list[list[Item]]) -> list[list[bytes]]:
    return [[msg.payload for item in b for msg in item.messages] for b in batches]


def ins(vchannel: str, payload: bytes, txn_id: int = 0) -> Message:
    return Message(MessageType.INSERT, vchannel, payload, txn_id=txn_id)


async def test_messages_group_per_vchannel_in_order_and_alone_where_needed() -> None:
    await asyncio.sleep(0)  # Group needs a running loop
    found = group(
        items(
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
        ),
        1 << 20,
    )
    assert shape(found) == [
        [b"1", b"3"],
        [b"2", b"5"],
        [b"ddl"],
        [b"4"],
        [b"t1"],
        [b"6"],
        [b"c"],
        [b"7"],
    ]


async def test_a_batch_stays_under_the_bound() -> None:
    await asyncio.sleep(0)
    found = group(items(*(ins("a", b"x" * 100) for _ in range(5))), 300)
    assert [len(b) for b in found] == [2, 2, 1]


async def test_sealing_gives_each_batch_the_next_sequence_and_fails_a_bad_message_alone() -> None:
    await asyncio.sleep(0)
    sequence = itertools.count(1000)
    sealing = Sealing(batch_producer_id("p"), lambda: next(sequence), Limits(200, 400))
    sealed, failed = seal(
        items(ins("a", b"1"), ins("a", b"x" * 300), ins("a", b"2"), ins("b", b"3")), sealing
    )
    assert [(item.messages[0].payload[:1], type(e)) for item, e in failed] == [
        (b"x", errors.MessageTooLarge)
    ]
    headers = [batch.verify(s.data) for s in sealed]
    assert [[m.payload for m in batch.messages(s.data)] for s in sealed] == [
        [b"1"],
        [b"2"],
        [b"3"],
    ], "the group failing as a whole is sealed message by message"
    assert [h.producer_id for h in headers] == [batch_producer_id("p")] * 3
    sequences = [h.sequence for h in headers]
    assert sequences == sorted(set(sequences)) and sequences[0] >= 1000


def test_the_batch_producer_id_is_stable_and_never_zero() -> None:
    assert batch_producer_id("orders") == batch_producer_id("orders")
    assert batch_producer_id("orders") != batch_producer_id("orders-2")
    assert batch_producer_id(None) != 0 and batch_producer_id(None) != batch_producer_id(None)


async def test_a_call_spread_over_vchannels_is_sealed_in_order_and_a_bad_message_fails_alone() -> (
    None
):
    await asyncio.sleep(0)
    sequence = itertools.count(50)
    limits = Limits(200, 400)
    sealing = Sealing(batch_producer_id("p"), lambda: next(sequence), limits)
    msgs = [ins(f"v{i}", b"%d" % i) for i in range(6)]
    msgs[3] = ins("v3", b"x" * 300)
    msgs[4] = Message(MessageType.INSERT, "v4", b"4", {"k": "v"})  # encoded the general way
    sealed, failed = seal(items(*msgs), sealing)
    assert [(item.vchannel, type(e)) for item, e in failed] == [("v3", errors.MessageTooLarge)]
    headers = [batch.verify(s.data) for s in sealed]
    assert [h.vchannel for h in headers] == ["v0", "v1", "v2", "v4", "v5"]
    assert [h.sequence for h in headers] == [50, 51, 52, 54, 55], "in order, v3's skipped"
    assert [s.count for s in sealed] == [1] * 5
    for unit, header in zip(sealed, headers, strict=True):
        (item,) = unit.items
        msg = item.messages[0]
        info = batch.BatchInfo(msg.vchannel, sealing.producer_id, header.sequence)
        assert unit.data == batch.encode([msg], info, limits)

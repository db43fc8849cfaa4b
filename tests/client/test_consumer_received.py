"""What a consumer takes from what it received: its own vchannel's messages of
its types, in order, ``limit`` at most per ``next_many``; every message passed
over or taken moves its resume position (``last_id``, ``last_timetick``)."""

from __future__ import annotations

from headrace.client import HeadraceClient
from headrace.client.consumer import Consumer, _Run
from headrace.message import batch
from headrace.message.types import LogEntry, Message, MessageType
from headrace.proto import streaming_pb2 as pb
from headrace.wal.memory import MemoryMessageID as MID


def entry(rid: int, vchannel: str, tt: int, mtype: MessageType = MessageType.INSERT) -> LogEntry:
    return LogEntry(MID(rid), Message(mtype, vchannel, f"{vchannel}{rid}".encode(), timetick=tt))


RECEIVED = [
    entry(1, "x", 10),
    entry(2, "y", 11),
    entry(3, "", 12, MessageType.TIME_TICK),
    entry(4, "x", 13),
    entry(5, "x", 14, MessageType.DELETE),
    entry(6, "x", 15),
    entry(7, "y", 16),
    entry(8, "", 19, MessageType.TIME_TICK),
]


async def test_next_many_takes_its_own_and_moves_the_resume_position_past_the_rest(
    client: HeadraceClient,
) -> None:
    consumer = client.consume("x", types=[MessageType.INSERT])
    consumer._buffer.append(_Run(RECEIVED, own=False))
    first = await consumer.next_many(2, timeout=0)
    assert [e.id for e in first] == [MID(1), MID(4)]
    assert (consumer.last_id, consumer.last_timetick) == (MID(4), 13)
    rest = await consumer.next_many(10, timeout=0)
    assert [e.id for e in rest] == [MID(6)]
    assert (consumer.last_id, consumer.last_timetick) == (MID(8), 19), "the skipped ones count"
    assert not consumer._buffer
    await consumer.close()


async def test_next_and_iteration_take_one_at_a_time(client: HeadraceClient) -> None:
    consumer = client.consume("x")
    consumer._buffer.append(_Run(RECEIVED, own=False))
    taken = [await consumer.next(0) for _ in range(4)]
    assert [e.id for e in taken if e is not None] == [MID(1), MID(4), MID(5), MID(6)]
    assert (consumer.last_id, consumer.last_timetick) == (MID(6), 15)
    assert [str(e.id) for e in left(consumer)] == ["memory:7", "memory:8"]
    await consumer.close()


def batch_item(rid: int, vchannel: str, base_tt: int, count: int) -> pb.ConsumedItem:
    """A record batch of ``count`` messages of ``vchannel`` stored as record ``rid``."""
    messages = [Message(MessageType.INSERT, vchannel, f"{rid}.{i}".encode()) for i in range(count)]
    data = batch.stamped(batch.encode(messages, batch.BatchInfo(vchannel)), base_tt, 1)
    return pb.ConsumedItem(batch=pb.ConsumedBatch(first_id=str(MID(rid)), data=data))


def left(consumer: Consumer) -> list[LogEntry]:
    """What the consumer decoded and has not taken yet."""
    return [e for run in consumer._buffer for e in run.entries[run.at :]]


def payloads(entries: list[LogEntry]) -> list[bytes]:
    return [e.message.payload for e in entries]


async def test_a_response_is_decoded_a_record_batch_at_a_time(client: HeadraceClient) -> None:
    consumer = client.consume("x")
    consumer._undecoded.extend(
        [batch_item(1, "x", 10, 3), batch_item(2, "y", 13, 2), batch_item(3, "x", 15, 2)]
    )
    first = await consumer.next_many(100, timeout=0)
    assert payloads(first) == [b"1.0", b"1.1", b"1.2"], "the first batch, before the rest"
    assert len(consumer._undecoded) == 2, "the later batches wait undecoded"
    assert (consumer.last_id, consumer.last_timetick) == (MID(1).with_index(2), 12)
    second = await consumer.next_many(100, timeout=0)
    assert payloads(second) == [b"3.0", b"3.1"], "another vchannel's batch is passed over"
    assert (consumer.last_id, consumer.last_timetick) == (MID(3).with_index(1), 16)
    assert not consumer._undecoded and not consumer._buffer
    assert await consumer.next_many(100, timeout=0) == []
    await consumer.close()


async def test_next_takes_decoded_messages_before_decoding_the_next_batch(
    client: HeadraceClient,
) -> None:
    consumer = client.consume("x")
    consumer._undecoded.extend([batch_item(1, "x", 10, 2), batch_item(2, "x", 12, 2)])
    taken = [await consumer.next(0) for _ in range(3)]
    assert payloads([e for e in taken if e is not None]) == [b"1.0", b"1.1", b"2.0"]
    assert [e.message.timetick for e in taken if e is not None] == [10, 11, 12]
    assert payloads(left(consumer)) == [b"2.1"] and not consumer._undecoded
    await consumer.close()


async def test_a_batch_all_its_own_is_taken_in_slices_up_to_the_limit(
    client: HeadraceClient,
) -> None:
    consumer = client.consume("x")
    consumer._undecoded.extend([batch_item(1, "x", 10, 5), batch_item(2, "", 15, 2)])
    first = await consumer.next_many(2, timeout=0)
    assert payloads(first) == [b"1.0", b"1.1"]
    assert (consumer.last_id, consumer.last_timetick) == (MID(1).with_index(1), 11)
    assert payloads(await consumer.next_many(1, timeout=0)) == [b"1.2"]
    rest = await consumer.next_many(10, timeout=0)
    assert payloads(rest) == [b"1.3", b"1.4"], "the next batch is not decoded yet"
    assert (consumer.last_id, consumer.last_timetick) == (MID(1).with_index(4), 14)
    assert payloads(await consumer.next_many(10, timeout=0)) == [b"2.0", b"2.1"]
    assert (consumer.last_id, consumer.last_timetick) == (MID(2).with_index(1), 16)
    await consumer.close()


async def test_a_batch_of_types_the_consumer_does_not_all_take_is_filtered_message_by_message(
    client: HeadraceClient,
) -> None:
    kinds = [MessageType.INSERT, MessageType.DELETE, MessageType.INSERT, MessageType.DELETE]
    messages = [Message(kind, "x", b"m%d" % i) for i, kind in enumerate(kinds)]
    data = batch.stamped(batch.encode(messages, batch.BatchInfo("x")), 20, 1)
    item = pb.ConsumedItem(batch=pb.ConsumedBatch(first_id=str(MID(3)), data=data))
    consumer = client.consume("x", types=[MessageType.INSERT])
    consumer._undecoded.append(item)
    assert payloads(await consumer.next_many(1, timeout=0)) == [b"m0"]
    assert (consumer.last_id, consumer.last_timetick) == (MID(3), 20)
    assert payloads(await consumer.next_many(10, timeout=0)) == [b"m2"]
    assert (consumer.last_id, consumer.last_timetick) == (MID(3).with_index(3), 23), "passed over"
    assert not consumer._buffer
    await consumer.close()

"""What a consumer takes from what it received: its own vchannel's messages of
its types, in order, ``limit`` at most per ``next_many``; every message passed
over or taken moves its resume position (``last_id``, ``last_timetick``)."""

from __future__ import annotations

from headrace.client import HeadraceClient
from headrace.message.types import LogEntry, Message, MessageType
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
    consumer._buffer.extend(RECEIVED)
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
    consumer._buffer.extend(RECEIVED)
    taken = [await consumer.next(0) for _ in range(4)]
    assert [e.id for e in taken if e is not None] == [MID(1), MID(4), MID(5), MID(6)]
    assert (consumer.last_id, consumer.last_timetick) == (MID(6), 15)
    assert [str(e.id) for e in consumer._buffer] == ["memory:7", "memory:8"]
    await consumer.close()

"""Consume responses for clients that read record batches: a whole batch goes as
it is stored, messages as before, in log order, within the response's bounds;
the client turns both back into the same log entries."""

from __future__ import annotations

import collections

import pytest

from headrace import errors
from headrace.client.consumer import item_entries
from headrace.message import batch
from headrace.message.records import BatchEntry
from headrace.message.types import LogEntry, Message, MessageType
from headrace.node import convert
from headrace.proto import streaming_pb2 as pb
from headrace.wal.memory import MemoryMessageID as MID


def unit(rid: int, base_tt: int, count: int) -> BatchEntry:
    msgs = [Message(MessageType.INSERT, "v1", b"x" * 100, {"k": str(i)}) for i in range(count)]
    data = bytearray(batch.encode(msgs, batch.BatchInfo("v1")))
    batch.stamp(data, base_tt, 3)
    return BatchEntry(MID(rid), batch.verify(data), bytes(data))


def tick(rid: int, tt: int) -> LogEntry:
    return LogEntry(MID(rid), Message(MessageType.TIME_TICK, timetick=tt, term=3))


def test_items_keep_log_order_and_round_trip() -> None:
    entries: list[LogEntry | BatchEntry] = [unit(1, 10, 3), tick(1, 20), unit(2, 30, 2)]
    carry = collections.deque(entries)
    response = pb.ConsumeResponse()
    packed = convert.pack_items(response.items, carry, 100, 1 << 20)
    size = sum(map(convert.entry_bytes, entries))
    assert packed == convert.Packed(6, 31, size) and not carry
    assert [i.WhichOneof("item") for i in response.items] == ["batch", "message", "batch"]
    wire = pb.ConsumeResponse.FromString(response.SerializeToString())
    got = [e for item in wire.items for e in item_entries(item)]
    expected = [*unit(1, 10, 3).entries(), tick(1, 20), *unit(2, 30, 2).entries()]
    assert got == expected
    assert [str(e.id) for e in got] == [
        "memory:1",
        "memory:1/1",
        "memory:1/2",
        "memory:1",
        "memory:2",
        "memory:2/1",
    ]


def test_bounds_count_messages_and_bytes_but_one_item_always_goes() -> None:
    carry: collections.deque[LogEntry | BatchEntry] = collections.deque(
        [unit(1, 10, 3), unit(2, 20, 3), tick(2, 30)]
    )
    response = pb.ConsumeResponse()
    assert convert.pack_items(response.items, carry, 2, 1 << 20).messages == 3
    assert len(carry) == 2, "the second batch waits for the next response"
    response = pb.ConsumeResponse()
    assert convert.pack_items(response.items, carry, 100, 10).messages == 3, "over the bytes"
    assert len(carry) == 1
    assert convert.messages_in(carry) == 1


def test_a_damaged_batch_from_the_node_is_corrupt_data() -> None:
    good = unit(1, 10, 2)
    data = bytearray(good.data)
    data[-1] ^= 1
    item = pb.ConsumedItem(batch=pb.ConsumedBatch(first_id="memory:1", data=bytes(data)))
    with pytest.raises(errors.CorruptData, match="batch CRC mismatch"):
        item_entries(item)

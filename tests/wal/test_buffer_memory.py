"""The write-ahead buffer's memory: what it keeps alive stays within its bound,
and the bytes it counts cover the Python objects of its entries.

Measured with tracemalloc: the memory allocated while entries are made and
added, and still allocated once every other reference to them is gone, is
what the buffer keeps alive.
"""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest

from headrace.message import batch, codec
from headrace.message.records import BatchEntry
from headrace.message.types import LogEntry, Message, MessageType
from headrace.wal.buffer import START, Item, WriteAheadBuffer
from headrace.wal.memory import MemoryMessageID as MID

TERM = 3
BIG_TT = 1 << 50
"""Timeticks are TSO values: large ints, as in a WAL."""


@contextmanager
def held_bytes() -> Iterator[list[int]]:
    """Bytes allocated inside the block and still allocated after it (and a
    collection), in ``result[0]``."""
    result: list[int] = []
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        yield result
        gc.collect()
        result.append(tracemalloc.get_traced_memory()[0] - before)
    finally:
        tracemalloc.stop()


def batch_entry(i: int, payload: int) -> tuple[Item, int, bool]:
    """A stored record batch of one message of ``payload`` bytes, as the appender
    stamps and keeps it."""
    data = bytearray(
        batch.encode([Message(MessageType.INSERT, "v", bytes(payload))], batch.BatchInfo("v", 7, i))
    )
    batch.stamp(data, BIG_TT + i, TERM)
    return BatchEntry(MID(i), batch.verify(data), bytes(data)), len(data), True


def appended_batch_entry(i: int, payload: int) -> tuple[Item, int, bool]:
    """A record batch of one message as the appender keeps it before any
    reader needed it joined: the producer's bytes and the stamped header."""
    data = batch.encode(
        [Message(MessageType.INSERT, "v", bytes(payload))], batch.BatchInfo("v", 7, i)
    )
    header = batch.verify(data).with_stamp(BIG_TT + i, TERM)
    return BatchEntry(MID(i), header, batch.Stamped(data, header)), len(data), True


def message_entry(i: int, payload: int, properties: dict[str, str]) -> tuple[Item, int, bool]:
    """A format-1 entry: the stamped message, its encoded size."""
    msg = Message(MessageType.INSERT, "v", bytes(payload), properties, BIG_TT + i, TERM)
    return LogEntry(MID(i), msg), codec.encoded_size(msg), True


def tick_entry(i: int) -> tuple[Item, int, bool]:
    """A sync tick that only goes to the buffer, with the dedup rebuild hint."""
    msg = Message(
        MessageType.TIME_TICK, "", b"", {"headrace.dedup_from": str(10**15 + i)}, BIG_TT + i, TERM
    )
    return LogEntry(MID(i), msg), codec.encoded_size(msg), False


def producer_message(i: int) -> tuple[Item, int, bool]:
    props = {"headrace.producer_id": str(10**17 + 5), "headrace.producer_seq": str(i)}
    return message_entry(i, 64, props)


KINDS: dict[str, Callable[[int], tuple[Item, int, bool]]] = {
    "sync tick": tick_entry,
    "message, no properties": lambda i: message_entry(i, 64, {}),
    "message with a producer's dedup properties": producer_message,
    "record batch of one small message": lambda i: batch_entry(i, 16),
    "record batch of 16 KiB": lambda i: batch_entry(i, 16 * 1024),
    "record batch of one small message, stamp not joined": lambda i: appended_batch_entry(i, 16),
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_bytes_counted_cover_what_the_entries_hold(kind: str) -> None:
    make = KINDS[kind]
    buf = WriteAheadBuffer(1 << 40, START)
    n = 2000
    with held_bytes() as held:
        for start in range(0, n, 100):
            buf.extend([make(i) for i in range(start, start + 100)])
    assert buf.size_entries == n
    assert held[0] <= buf.size_bytes, f"counted {buf.size_bytes} for {held[0]} held"
    assert buf.size_bytes <= 2 * held[0], f"counted {buf.size_bytes}, far above {held[0]} held"


@pytest.mark.parametrize(
    ("kind", "payload"),
    [("batches", 64 * 1024), ("batches", 1024), ("messages", 16 * 1024)],
)
def test_evicted_entries_are_released(kind: str, payload: int) -> None:
    bound = 1 << 20
    buf = WriteAheadBuffer(bound, START)
    with held_bytes() as held:
        for i in range(8 * bound // payload):
            made = batch_entry(i, payload) if kind == "batches" else message_entry(i, payload, {})
            buf.extend([made])
    assert buf.size_bytes <= bound
    assert held[0] <= bound * 5 // 4, f"{held[0]} bytes kept alive by a buffer of {bound}"
    read = buf.read(buf.first_seq, 1 << 20)
    assert read is not None and len(read) == buf.size_entries, "the retained entries stay readable"

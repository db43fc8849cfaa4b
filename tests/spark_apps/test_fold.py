"""The flush task's pure part: a shard's messages -> sealed segments and deletes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from headrace import errors
from headrace.message.types import LogEntry, Message, MessageType
from headrace.table import messages
from headrace.table.collections import Collection, CollectionSpec
from headrace.wal.memory import MemoryMessageID
from spark_apps.shard import fold
from spark_apps.wal_range import Bounds

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("s", pa.string())])
C = Collection(CollectionSpec("c", SCHEMA, "pk", shards=1), 1)
V = "c-0"


def rows(pks: list[int]) -> pa.Table:
    return pa.table({"pk": pa.array(pks, pa.int64()), "s": [f"s{p}" for p in pks]})


def entries(*built: Message) -> list[LogEntry]:
    """Message i+1 at memory:i+1 with timetick 10*(i+1)."""
    return [
        LogEntry(MemoryMessageID(i + 1), m.with_stamp(10 * (i + 1), 1)) for i, m in enumerate(built)
    ]


def test_deletes_apply_to_rows_before_them_only() -> None:
    folded = fold(
        C,
        V,
        entries(
            messages.insert(C, V, 1, rows([1, 2, 3])),
            messages.delete(C, V, [2, 9]),
            messages.insert(C, V, 1, rows([2, 4])),  # re-inserted after its delete: kept
            messages.insert(C, V, 2, rows([5])),
            messages.delete(C, V, [5]),
            messages.seal(C, V, 1),
            messages.seal(C, V, 2),
        ),
    )
    assert [(s.segment_id, s.start, s.end) for s in folded.segments] == [
        (1, "memory:1", "memory:6"),
        (2, "memory:4", "memory:7"),
    ]
    assert folded.segments[0].rows["pk"].to_pylist() == [1, 2, 3, 4]
    assert folded.segments[1].rows.num_rows == 0
    assert [(d.position, d.keys) for d in folded.deletes] == [
        ("memory:2", (2, 9)),
        ("memory:5", (5,)),
    ]
    assert [s.seal_timetick for s in folded.segments] == [60, 70]
    assert folded.timetick == 70
    assert folded.segments[0].rows.schema.equals(SCHEMA)


def test_a_segment_not_sealed_in_the_range_is_refused() -> None:
    with pytest.raises(errors.CorruptData, match=r"segment\(s\) \[2\].*not sealed"):
        fold(
            C,
            V,
            entries(
                messages.insert(C, V, 1, rows([1])),
                messages.seal(C, V, 1),
                messages.insert(C, V, 2, rows([2])),
            ),
        )


def test_an_insert_into_a_sealed_segment_is_refused() -> None:
    with pytest.raises(errors.CorruptData, match="sealed at memory:2"):
        fold(
            C,
            V,
            entries(
                messages.insert(C, V, 1, rows([1])),
                messages.seal(C, V, 1),
                messages.insert(C, V, 1, rows([2])),
            ),
        )


def test_opaque_messages_and_empty_seals_are_ignored() -> None:
    folded = fold(C, V, entries(Message(MessageType.INSERT, V, b"x"), messages.seal(C, V, 3)))
    assert folded.segments == ()
    assert folded.deletes == ()


def test_bounds() -> None:
    bounds = Bounds(MemoryMessageID(3), MemoryMessageID(9))
    assert bounds.ahead(MemoryMessageID(3))
    assert not bounds.ahead(MemoryMessageID(4))
    assert not Bounds(None, MemoryMessageID(9)).ahead(MemoryMessageID(0))

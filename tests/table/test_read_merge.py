"""The snapshot read's merge (table part + WAL tail) and snapshot choice, pure.

A model log of inserts (a key with a version) and deletes, each at a
timetick, is cut at a checkpoint: what comes before is the table (the state
the flushes left), what comes after is the tail. The merge must give the
state after the whole log, each key once, whatever the cut, however much of
the log before the cut the tail repeats (a row both in a just-committed file
and in the tail), and however the table is split into batches.
"""

from __future__ import annotations

import dataclasses
import itertools

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.table.merge import (
    TableRows,
    TailDelete,
    TailInsert,
    fold_tail,
    has_duplicates,
    merge,
)
from headrace.table.snapshots import Position, SnapshotFacts, plan_read

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("v", pa.int64())])


@dataclasses.dataclass(frozen=True)
class Op:
    key: int
    version: int | None
    """None: a delete."""


def state(ops: list[Op]) -> dict[int, int]:
    rows: dict[int, int] = {}
    for op in ops:
        if op.version is None:
            rows.pop(op.key, None)
        else:
            rows[op.key] = op.version
    return rows


def as_table(rows: dict[int, int]) -> pa.Table:
    return pa.table({"pk": list(rows), "v": list(rows.values())}, schema=SCHEMA)


def events(ops: list[Op], first_tick: int) -> list[TailInsert | TailDelete]:
    """One message per op, consecutive inserts of one tick merged into one
    message (several rows, the last of a key winning)."""
    found: list[TailInsert | TailDelete] = []
    for tick, op in enumerate(ops, start=first_tick):
        if op.version is None:
            found.append(TailDelete(pa.array([op.key], pa.int64()), tick))
        else:
            found.append(TailInsert(as_table({op.key: op.version}), tick))
    return found


def result(table: pa.Table) -> dict[int, int]:
    keys = table.column("pk").to_pylist()
    assert len(keys) == len(set(keys)), f"a key twice: {sorted(keys)}"
    return dict(zip(keys, table.column("v").to_pylist(), strict=True))


ops_strategy = st.lists(
    st.builds(Op, st.integers(0, 15), st.one_of(st.none(), st.integers(0, 1000))),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops_strategy, data=st.data())
def test_merge_gives_the_state_after_the_whole_log(ops: list[Op], data: st.DataObject) -> None:
    cut = data.draw(st.integers(0, len(ops)), label="checkpoint")
    repeat = data.draw(st.integers(0, cut), label="tail repeats from")
    table = as_table(state(ops[:cut]))
    tail = fold_tail(events(ops[repeat:], repeat), SCHEMA, "pk")
    expected = state(ops)
    assert result(merge([table], tail, "pk", SCHEMA)) == expected

    # The same file by file, the table split anywhere.
    sizes = data.draw(st.lists(st.integers(1, 5), max_size=10), label="file sizes")
    files, offset = [], 0
    for size in [*sizes, table.num_rows]:
        files.append(table.slice(offset, size))
        offset += size
    assert result(merge(files, tail, "pk", SCHEMA)) == expected
    admitted = TableRows(tail, "pk")
    parts = [admitted.admit(f) for f in files]
    assert result(pa.concat_tables([*parts, tail.rows])) == expected


@settings(max_examples=200, deadline=None)
@given(ops=ops_strategy, data=st.data())
def test_a_key_in_several_files_counts_once_as_its_newest_row(
    ops: list[Op], data: st.DataObject
) -> None:
    """Inserts of keys the table holds, without deletes (each flush adds its
    rows, none removes the older ones; the committed part here has inserts
    only): the files come newest first, within a file the last row of a key
    is its newest. The newest version is read."""
    flushes = data.draw(st.lists(st.integers(0, len(ops)), max_size=4), label="flush points")
    cuts = sorted({0, *flushes, len(ops)})
    tail_from = data.draw(st.sampled_from(cuts), label="checkpoint")
    # Each flush's file: its inserts in log order, nothing deleted from older files.
    files = [
        as_rows([op for op in ops[a:b] if op.version is not None])
        for a, b in itertools.pairwise(cuts)
        if b <= tail_from
    ]
    files.reverse()
    tail = fold_tail(events(ops[tail_from:], tail_from), SCHEMA, "pk")
    committed: dict[int, int] = {}
    for op in ops[:tail_from]:
        if op.version is not None:
            committed[op.key] = op.version
    expected = state_with(committed, ops[tail_from:])
    assert result(merge(files, tail, "pk", SCHEMA)) == expected


def as_rows(ops: list[Op]) -> pa.Table:
    return pa.table({"pk": [op.key for op in ops], "v": [op.version for op in ops]}, schema=SCHEMA)


def state_with(start: dict[int, int], ops: list[Op]) -> dict[int, int]:
    rows = dict(start)
    for op in ops:
        if op.version is None:
            rows.pop(op.key, None)
        else:
            rows[op.key] = op.version
    return rows


def test_the_last_row_of_a_key_in_one_message_wins_and_equal_ticks_keep_order() -> None:
    rows = pa.table({"pk": [1, 2, 1], "v": [10, 20, 11]}, schema=SCHEMA)
    tail = fold_tail([TailInsert(rows, 5), TailDelete(pa.array([2], pa.int64()), 6)], SCHEMA, "pk")
    assert result(tail.rows) == {1: 11}
    assert sorted(tail.touched.to_pylist()) == [1, 2]
    # Out of tick order in the list: the ticks decide, not the list order.
    late_insert = fold_tail(
        [TailInsert(as_table({3: 1}), 9), TailDelete(pa.array([3], pa.int64()), 8)], SCHEMA, "pk"
    )
    assert result(late_insert.rows) == {3: 1}


def test_string_keys_and_an_empty_tail() -> None:
    schema = pa.schema([pa.field("id", pa.string(), nullable=False), pa.field("v", pa.int64())])
    table = pa.table({"id": ["a", "b"], "v": [1, 2]}, schema=schema)
    assert merge([table], fold_tail([], schema, "id"), "id", schema).equals(table)
    tail = fold_tail([TailDelete(pa.array(["a"]), 3)], schema, "id")
    assert merge([table], tail, "id", schema).column("id").to_pylist() == ["b"]
    assert merge([], tail, "id", schema).num_rows == 0


# -- which snapshot ----------------------------------------------------------


def snap(sid: int, pchannel: str = "", position: str = "", tick: int = 0) -> SnapshotFacts:
    if not pchannel:
        return SnapshotFacts(sid)
    return SnapshotFacts(sid, pchannel, Position(position, tick))


HISTORY = [
    snap(1, "p0", "local:10", 100),
    snap(2, "p1", "local:7", 150),
    # One flush of p0: a delete snapshot then an append snapshot, one summary.
    snap(3, "p0", "local:20", 200),
    snap(4, "p0", "local:20", 200),
    snap(5),  # a compaction: no checkpoint of its own
    snap(6, "p1", "local:30", 300),
]
NOW = {"p0": Position("local:20", 200), "p1": Position("local:30", 300)}


@pytest.mark.parametrize(
    ("as_of", "snapshot", "starts"),
    [
        (10**9, 6, {"p0": "local:20", "p1": "local:30"}),
        (300, 6, {"p0": "local:20", "p1": "local:30"}),
        (299, 5, {"p0": "local:20", "p1": "local:7"}),
        (200, 5, {"p0": "local:20", "p1": "local:7"}),
        (199, 2, {"p0": "local:10", "p1": "local:7"}),
        (120, 1, {"p0": "local:10", "p1": None}),
        (99, None, {"p0": None, "p1": None}),
    ],
)
def test_the_snapshot_of_a_read(as_of: int, snapshot: int | None, starts: dict) -> None:
    plan = plan_read(HISTORY, NOW, ["p0", "p1"], as_of)
    assert (plan.snapshot_id, plan.starts) == (snapshot, starts), plan.why


def test_never_the_first_half_of_a_flush_commit() -> None:
    """Snapshot 3 (the delete of a flush whose append is snapshot 4) is never
    chosen, even as the newest by as_of: it lacks the commit's new files."""
    plan = plan_read(HISTORY[:4], NOW, ["p0", "p1"], 250)
    assert plan.snapshot_id == 4
    chosen = {plan_read(HISTORY, NOW, ["p0", "p1"], t).snapshot_id for t in range(0, 400, 5)}
    assert 3 not in chosen


def test_expired_history_is_only_trusted_after_its_commit_time() -> None:
    retained = HISTORY[2:]  # 1 and 2 expired; 3's commit time as a timetick is 180
    plan = plan_read(retained, NOW, ["p0", "p1"], 250, expired_until=180)
    assert plan.snapshot_id == 5
    assert plan.starts == {"p0": "local:20", "p1": None}
    assert plan_read(retained, NOW, ["p0", "p1"], 170, expired_until=180).snapshot_id is None


def test_no_table_reads_the_whole_log_or_from_the_checkpoint() -> None:
    assert plan_read([], {}, ["p0"], 5) == plan_read([], {}, ["p0"], 5)
    plan = plan_read([], {"p0": Position("local:3", 4)}, ["p0", "p1"], 5)
    assert (plan.snapshot_id, plan.starts) == (None, {"p0": "local:3", "p1": None})


@pytest.mark.parametrize(
    ("chunks", "twice"),
    [
        ([[]], False),
        ([[5]], False),
        ([[3, 1, 2], [9, 4]], False),
        ([[3, 1, 2], [9, 1]], True),
        ([[7, 7]], True),
        ([["b", "a"], ["c"]], False),
        ([["b", "a"], ["b"]], True),
    ],
)
def test_has_duplicates(chunks: list[list[object]], twice: bool) -> None:
    assert has_duplicates(pa.chunked_array(chunks)) is twice

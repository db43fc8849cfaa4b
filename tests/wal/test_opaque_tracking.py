"""The WAL notes where opaque records lie (retention holds back only them).

Opaque: neither the WAL's own tick or fence nor a message naming a
collection. Noted per acknowledged batch on both append paths (plain
messages and the interceptor chain); history from before the open is opaque
unless the open's tail scan read it.
"""

from __future__ import annotations

from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.api import AppendResult
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.interceptors.backpressure import note_opaque
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.memory.message_id import MemoryMessageID as Id
from headrace.wal.progress import OpaqueSpan, Progress
from tests.wal.test_segments import ORDERS, QUIET, Hooks, P, insert

OPTIONS = WALOptions(timetick_interval_ms=QUIET)


def covers(spans: tuple[OpaqueSpan, ...] | list[OpaqueSpan], rid: MessageID) -> bool:
    return any((s.first is None or s.first <= rid) and rid <= s.last for s in spans)


def opaque(payload: bytes = b"log line", **properties: str) -> Message:
    return Message(MessageType.INSERT, "logs-0", payload, properties)


async def test_only_opaque_records_are_noted_on_both_append_paths() -> None:
    store = MemoryStore()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=LocalTSO(), options=OPTIONS)
    try:
        assert wal.progress.opaque.spans == ()  # an empty log has no history
        collection = [await wal.append(insert(ORDERS, 0, [i])) for i in range(3)]
        assert wal.progress.opaque.spans == ()  # collection data is not opaque
        plain = await wal.append(opaque())
        keyed = await wal.append(opaque(producer_id="p1", producer_seq="1"))
        (flush,) = await wal.append_many(
            [Message(MessageType.FLUSH, "orders-0", b"", {"headrace.collection": "orders"})]
        )
    finally:
        await wal.close()
    spans = wal.progress.opaque.spans
    assert covers(spans, plain.id) and covers(spans, keyed.id)
    assert not any(covers(spans, r.id) for r in collection)
    assert spans[0].first == plain.id
    assert spans[-1].timetick >= keyed.timetick
    assert not isinstance(flush, Exception)
    assert spans[-1].last == keyed.id  # the FLUSH after it is collection data


async def test_history_before_the_open_counts_as_opaque() -> None:
    store = MemoryStore()
    tso = LocalTSO()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=tso, options=OPTIONS)
    await wal.append(insert(ORDERS, 0, [1]))
    await wal.close()
    last = wal.last_id
    assert last is not None
    wal = await WAL.open(MemoryBackend(store), P, 2, tso=tso, options=OPTIONS)
    try:
        (span,) = wal.progress.opaque.spans
    finally:
        await wal.close()
    # no tail scan read it: everything up to the log's last record at open
    assert span.first is None and span.last == last and span.bytes == 0


async def test_the_opens_tail_scan_notes_the_opaque_records_it_reads() -> None:
    store = MemoryStore()
    tso = LocalTSO()
    hooks = Hooks()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=tso, options=OPTIONS, collections=hooks)
    before = await wal.append(insert(ORDERS, 0, [1]))
    lines = [await wal.append(opaque()) for _ in range(2)]
    after = await wal.append(insert(ORDERS, 0, [2]))
    await wal.close()
    wal = await WAL.open(MemoryBackend(store), P, 2, tso=tso, options=OPTIONS, collections=hooks)
    try:
        spans = wal.progress.opaque.spans
    finally:
        await wal.close()
    assert all(covers(spans, line.id) for line in lines)
    # the scan read from the start of the log (no checkpoint): no unread
    # history, and it knows the collection data around the opaque records
    assert [(s.first, s.last) for s in spans] == [(lines[0].id, lines[1].id)]
    assert not covers(spans, before.id) and not covers(spans, after.id)


async def test_history_below_where_the_tail_scan_starts_counts_as_opaque() -> None:
    store = MemoryStore()
    tso = LocalTSO()
    hooks = Hooks()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=tso, options=OPTIONS, collections=hooks)
    early = await wal.append(insert(ORDERS, 0, [1]))
    flushed = await wal.append(insert(ORDERS, 0, [2]))
    later = await wal.append(insert(ORDERS, 0, [3]))
    await wal.close()
    hooks.checkpoint_at = flushed.id  # the scan starts at the checkpoint
    wal = await WAL.open(MemoryBackend(store), P, 2, tso=tso, options=OPTIONS, collections=hooks)
    try:
        spans = wal.progress.opaque.spans
    finally:
        await wal.close()
    (unread,) = spans
    assert unread.first is None and unread.last == flushed.id
    assert unread.timetick == flushed.timetick  # as young as the first record read
    assert covers(spans, early.id) and not covers(spans, later.id)


def settled(msg: Message, seq: int, timetick: int) -> AppendContext:
    return AppendContext(msg, 10, AppendResult(Id(seq), timetick, 1))


def test_a_batch_is_noted_from_its_oldest_to_its_youngest_opaque_record() -> None:
    """Dedup hits answer with an earlier record's result anywhere in the
    batch; collection data and unsettled messages are not opaque records."""
    progress = Progress()
    batch = [
        settled(insert(ORDERS, 0, [1]), 9, 90),  # collection data below: not noted
        settled(opaque(), 10, 100),
        settled(opaque(), 11, 110),
        settled(opaque(producer_id="p", producer_seq="1"), 3, 30),  # a dedup hit
        AppendContext(opaque(), 10),  # refused: no result
        settled(insert(ORDERS, 0, [2]), 12, 120),
    ]
    note_opaque(progress, batch, plain=False)
    assert progress.opaque.spans == (OpaqueSpan(Id(3), Id(11), 110, 0),)
    plain = Progress()
    note_opaque(plain, [AppendContext(opaque(), 10), *batch[1:3]], plain=True)
    assert plain.opaque.spans == (OpaqueSpan(Id(10), Id(11), 110, 0),)

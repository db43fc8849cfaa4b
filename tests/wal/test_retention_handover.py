"""A new owner inherits what the previous one knew of the opaque records.

The owner's retention record carries an
:class:`~headrace.wal.progress.OpaqueSummary`; a WAL opening on the next owner
takes the history below its tail scan's start from it when it is complete and
known at least up to that start, and counts that history as opaque otherwise.
"""

from __future__ import annotations

import dataclasses

import pytest

from headrace import tso
from headrace.message import ids
from headrace.message.types import Message, MessageType
from headrace.table.messages import COLLECTION
from headrace.tso import LocalTSO
from headrace.wal.buffer import Position
from headrace.wal.framework import WAL
from headrace.wal.memory.backend import MemoryBackend, MemoryStore
from headrace.wal.memory.message_id import MemoryMessageID as Id
from headrace.wal.progress import (
    OpaqueSpan,
    OpaqueSummary,
    RetentionOptions,
    Sample,
    inherited,
    summarize,
    widened_start,
)
from headrace.wal.rebuild import History
from headrace.wal.retention import Checkpointed, Inputs, RetentionRecord, decide
from tests.wal.test_opaque_tracking import OPTIONS, opaque
from tests.wal.test_segments import ORDERS, Hooks, P, insert

NOW_MS = 1_800_000_000_000
MINUTE_MS = 60_000
DEFAULT = RetentionOptions(margin_s=0, margin_bytes=0)
"""The default retention (opaque data kept 7 days), no safety margin."""
START = Id(60)
"""Where the new owner's tail scan starts: the checkpoint."""
TAIL = Id(100)


def tick(minutes_ago: float) -> int:
    return tso.compose(int(NOW_MS - minutes_ago * MINUTE_MS), 0)


def data(collection: bool) -> Message:
    properties = {COLLECTION: "orders"} if collection else {}
    return Message(MessageType.INSERT, "orders-0" if collection else "logs-0", b"x", properties)


def reopened(summary: OpaqueSummary | None, *, opaque_at: int | None = None) -> list[OpaqueSpan]:
    """The opaque history a new owner's open notes: its scan reads the
    records from :data:`START` to :data:`TAIL` (collection data, but for an
    opaque one at ``opaque_at``)."""
    history = History(START, lambda rid, msg: None)
    for seq in range(START.seq, TAIL.seq + 1):
        history.observe(Id(seq), dataclasses.replace(data(seq != opaque_at), timetick=tick(1)))
    return history.spans(Position(TAIL, tick(1)), Id(0), summary)


def after_handoff(opaque: list[OpaqueSpan], now_ms: int = NOW_MS) -> Inputs:
    """The new owner's first pass: samples from its open, the checkpoint below them."""
    return Inputs(
        checkpoint=Checkpointed(START, tick(30)),
        collections=("orders",),
        samples=(Sample(TAIL, tick(1), 0), Sample(Id(110), tick(0.5), 500)),
        appended_bytes=500,
        now_ms=now_ms,
        options=DEFAULT,
        opaque=opaque,
    )


COLLECTION_ONLY = OpaqueSummary(TAIL, complete=True, youngest=None)


def test_a_collection_only_pchannel_is_truncated_below_the_checkpoint_after_a_handoff() -> None:
    decision = decide(after_handoff(reopened(COLLECTION_ONLY)))
    assert decision.below == START, decision.reason
    assert "the checkpoint" in decision.reason


def test_without_a_summary_the_unread_history_is_kept() -> None:
    decision = decide(after_handoff(reopened(None)))
    assert decision.below is None
    assert "unread history" in decision.reason


@pytest.mark.parametrize(
    "summary",
    [
        pytest.param(dataclasses.replace(COLLECTION_ONLY, known_until=Id(59)), id="gap"),
        pytest.param(dataclasses.replace(COLLECTION_ONLY, complete=False), id="incomplete"),
    ],
)
def test_a_summary_that_does_not_cover_the_unread_history_is_conservative(
    summary: OpaqueSummary,
) -> None:
    assert inherited(summary, START) is None
    spans = reopened(summary)
    assert spans[0].first is None and spans[0].last == START  # unread, as young as START
    decision = decide(after_handoff(spans))
    assert decision.below is None
    assert "unread history" in decision.reason


def test_an_inherited_opaque_record_holds_back_until_it_ages() -> None:
    summary = OpaqueSummary(TAIL, True, OpaqueSpan(Id(20), Id(30), tick(10), 0))
    spans = reopened(summary)
    assert spans == [OpaqueSpan(Id(20), Id(30), tick(10), 0)]
    young = decide(after_handoff(spans))
    assert young.below is None
    assert "opaque records memory:20..memory:30" in young.reason
    seven_days_ms = int(DEFAULT.max_age_s or 0) * 1000
    aged = decide(after_handoff(spans, now_ms=NOW_MS + seven_days_ms))
    assert aged.below == START, aged.reason


def test_the_scan_still_notes_the_opaque_records_it_reads_above_the_summary() -> None:
    spans = reopened(COLLECTION_ONLY, opaque_at=80)
    assert [(s.first, s.last) for s in spans] == [(Id(80), Id(80))]
    decision = decide(after_handoff(spans))
    assert decision.below == START, decision.reason  # nothing opaque below the checkpoint


def test_summarize_merges_into_one_conservative_span() -> None:
    spans = [OpaqueSpan(Id(5), Id(7), 70, 300), OpaqueSpan(Id(40), Id(41), 410, 900)]
    summary = summarize(spans, TAIL)
    assert summary == OpaqueSummary(TAIL, True, OpaqueSpan(Id(5), Id(41), 410, 0))
    assert summarize([], TAIL) == COLLECTION_ONLY
    unread = summarize([OpaqueSpan(None, Id(3), 30, 0), *spans], TAIL)
    assert not unread.complete


@pytest.mark.parametrize(
    "summary",
    [
        COLLECTION_ONLY,
        OpaqueSummary(TAIL, True, OpaqueSpan(Id(5), Id(41), 410, 0)),
        OpaqueSummary(TAIL, False, OpaqueSpan(None, Id(41), 410, 0)),
    ],
)
def test_the_retention_record_carries_the_summary(summary: OpaqueSummary) -> None:
    record = RetentionRecord(pchannel=P, node="node-a", term=1).with_summary(summary)
    assert RetentionRecord.from_json(record.to_json()).opaque_summary() == summary


def test_a_record_without_a_readable_summary_gives_none() -> None:
    bare = RetentionRecord(pchannel=P, node="node-a", term=1)
    assert bare.opaque_summary() is None
    broken = bare.with_summary(COLLECTION_ONLY).model_copy(update={"known_until": "nonsense"})
    assert broken.opaque_summary() is None
    mixed = bare.with_summary(
        OpaqueSummary(TAIL, True, OpaqueSpan(Id(5), Id(41), 410, 0))
    ).model_copy(update={"opaque_last": "kafka:41"})
    assert mixed.opaque_summary() is None


def test_a_summary_of_another_backend_covers_nothing() -> None:
    other = OpaqueSummary(ids.parse("kafka:1000"), complete=True, youngest=None)
    assert inherited(other, START) is None
    assert reopened(other)[0].first is None  # the history stays unread


async def test_a_reopened_wal_seeds_its_history_from_the_previous_owners_summary() -> None:
    store = MemoryStore()
    clock = LocalTSO()
    hooks = Hooks()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=clock, options=OPTIONS, collections=hooks)
    line = await wal.append(opaque())
    await wal.append(insert(ORDERS, 0, [1]))
    flushed = await wal.append(insert(ORDERS, 0, [2]))
    await wal.append(insert(ORDERS, 0, [3]))
    assert wal.last_id is not None
    hooks.summary = summarize(wal.progress.opaque.spans, wal.last_id)
    await wal.close()
    hooks.checkpoint_at = flushed.id  # the scan starts at the checkpoint
    wal = await WAL.open(MemoryBackend(store), P, 2, tso=clock, options=OPTIONS, collections=hooks)
    try:
        spans = wal.progress.opaque.spans
    finally:
        await wal.close()
    # the opaque record below the scan, as the previous owner knew it; no unread history
    assert [(s.first, s.last, s.timetick) for s in spans] == [(line.id, line.id, line.timetick)]


def test_the_open_reads_back_to_a_summary_that_stops_short_of_its_scan() -> None:
    summary = OpaqueSummary(Id(40), complete=True, youngest=None)
    assert widened_start(START, summary) == Id(40)
    # Nothing to widen: no scan start, no summary, an incomplete one, one that covers it.
    assert widened_start(None, summary) is None
    assert widened_start(START, None) == START
    assert widened_start(START, dataclasses.replace(summary, complete=False)) == START
    assert widened_start(START, OpaqueSummary(Id(70), complete=True, youngest=None)) == START


async def test_records_appended_after_the_last_summary_are_read_not_held_as_unread() -> None:
    """The previous owner was killed one housekeeping pass after its last
    summary: what it appended since lies below the new scan's start. The new
    owner reads it (exactly: one opaque record there is found) instead of
    holding the whole history back as unread for the retention period."""
    store = MemoryStore()
    clock = LocalTSO()
    hooks = Hooks()
    wal = await WAL.open(MemoryBackend(store), P, 1, tso=clock, options=OPTIONS, collections=hooks)
    await wal.append(insert(ORDERS, 0, [1]))
    assert wal.last_id is not None
    hooks.summary = summarize(wal.progress.opaque.spans, wal.last_id)  # the last pass
    late = await wal.append(opaque())
    await wal.append(insert(ORDERS, 0, [2]))
    flushed = await wal.append(insert(ORDERS, 0, [3]))
    await wal.close()
    hooks.checkpoint_at = flushed.id  # the scan starts past the summary
    wal = await WAL.open(MemoryBackend(store), P, 2, tso=clock, options=OPTIONS, collections=hooks)
    try:
        spans = wal.progress.opaque.spans
    finally:
        await wal.close()
    assert [(s.first, s.last, s.timetick) for s in spans] == [(late.id, late.id, late.timetick)]

"""The pure truncation decision, the position log and the back-pressure verdict."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace import errors, tso
from headrace.message.types import Message, MessageType
from headrace.table.messages import COLLECTION
from headrace.wal.api import AppendResult
from headrace.wal.interceptors.backpressure import BackPressureInterceptor, Pressure, pressure
from headrace.wal.interceptors.chain import AppendContext
from headrace.wal.memory.message_id import MemoryMessageID as Id
from headrace.wal.progress import (
    FlushState,
    OpaqueLog,
    OpaqueSpan,
    PositionLog,
    Progress,
    RetentionOptions,
    Sample,
    flushed_bytes,
)
from headrace.wal.retention import Checkpointed, Inputs, decide

NOW_MS = 1_800_000_000_000
MINUTE_MS = 60_000
OPTS = RetentionOptions(max_age_s=3600, max_bytes=None, margin_s=60, margin_bytes=0)


def tick(minutes_ago: float) -> int:
    return tso.compose(int(NOW_MS - minutes_ago * MINUTE_MS), 0)


def samples(*points: tuple[int, float, int]) -> tuple[Sample, ...]:
    """``(id, minutes ago, bytes)`` each."""
    return tuple(Sample(Id(i), tick(ago), size) for i, ago, size in points)


# one sample every 10 minutes over the last 100, 1000 bytes apart; tail id 100
LOG = samples(*((i * 10, 100 - i * 10, i * 1000) for i in range(11)))
TOTAL = 10_000


def everywhere(log: tuple[Sample, ...]) -> tuple[OpaqueSpan, ...]:
    """Every record of ``log`` is opaque: the records up to each sample, as
    young as it (what the rule assumed before the WAL tracked opaque data)."""
    first = OpaqueSpan(None, log[0].id, log[0].timetick, log[0].bytes)
    rest = (
        OpaqueSpan(Id(before.id.seq + 1), s.id, s.timetick, s.bytes)
        for before, s in itertools.pairwise(log)
    )
    return (first, *rest)


def opaque_at(i: int, ago: float, size: int) -> OpaqueSpan:
    return OpaqueSpan(Id(i), Id(i), tick(ago), size)


def inputs(**changes: object) -> Inputs:
    base = Inputs(
        checkpoint=None,
        collections=(),
        samples=LOG,
        appended_bytes=TOTAL,
        now_ms=NOW_MS,
        options=OPTS,
        opaque=everywhere(LOG),
    )
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


CASES = [
    pytest.param(
        inputs(collections=("orders",)),
        None,
        "collection orders has a shard here and no checkpoint yet",
        id="collection-without-checkpoint-keeps-everything",
    ),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=None)),
        None,
        "kept forever",
        id="no-retention-bound-keeps-everything",
    ),
    pytest.param(inputs(), Id(40), "retention", id="age: the newest sample older than 1 h"),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=None, max_bytes=2500)),
        Id(70),
        "retention",
        id="bytes: the newest sample followed by 2500 bytes or more",
    ),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=3600, max_bytes=2500)),
        Id(70),
        "retention",
        id="age or bytes: whichever reaches further",
    ),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=200 * 60)),
        None,
        "unread history before the WAL opened (up to memory:0) below every position is not "
        "past the retention bound",
        id="nothing old enough",
    ),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=1, margin_s=95 * 60)),
        Id(0),
        "retention",
        id="margin in time holds the point back",
    ),
    pytest.param(
        inputs(options=dataclasses.replace(OPTS, max_age_s=1, margin_s=0, margin_bytes=20_000)),
        None,
        "safety margin",
        id="margin in bytes keeps everything",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(25), tick(75)),
            options=dataclasses.replace(OPTS, max_age_s=1),
        ),
        Id(25),
        "the checkpoint",
        id="never past the checkpoint: the checkpoint itself",
    ),
    pytest.param(
        inputs(collections=("orders",), checkpoint=Checkpointed(Id(95), tick(5))),
        Id(40),
        "retention",
        id="checkpoint ahead of retention: retention bounds",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(95), tick(0.5)),
            options=dataclasses.replace(OPTS, max_age_s=1),
        ),
        Id(90),
        "retention",
        id="checkpoint inside the margin: the last sample below it",
    ),
    pytest.param(
        inputs(
            checkpoint=Checkpointed(Id(95), tick(0.5)),
            options=dataclasses.replace(OPTS, max_age_s=1),
        ),
        Id(90),
        "retention",
        id="a checkpoint without collections does not bound",
    ),
    pytest.param(
        inputs(
            samples=LOG[3:],
            collections=("orders",),
            checkpoint=Checkpointed(Id(25), tick(200)),
            options=dataclasses.replace(OPTS, max_age_s=1),
        ),
        Id(25),
        "the checkpoint",
        id="checkpoint before this WAL's first sample (a restart): the checkpoint",
    ),
    pytest.param(
        inputs(
            samples=LOG[3:],
            collections=("orders",),
            checkpoint=Checkpointed(Id(25), tick(0.5)),
            options=dataclasses.replace(OPTS, max_age_s=1),
        ),
        None,
        "below every position",
        id="checkpoint young and before every sample: keep everything",
    ),
    pytest.param(inputs(samples=()), None, "no known position", id="no samples yet"),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(margin_bytes=0),
            opaque=(),
        ),
        Id(85),
        "the checkpoint",
        id="collection-only pchannel: below the checkpoint, default 7-day retention",
    ),
    pytest.param(
        inputs(options=RetentionOptions(margin_bytes=0), opaque=()),
        Id(90),
        "no opaque data below",
        id="neither collections nor opaque data: only the margin",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=None, margin_bytes=0),
            opaque=(),
        ),
        Id(85),
        "the checkpoint",
        id="no retention bound and no opaque data: the checkpoint",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(margin_bytes=0),
            opaque=(opaque_at(35, 65, 3500),),
        ),
        Id(30),
        "opaque record memory:35 holds back what follows",
        id="an opaque record holds back the points above it",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=3600, margin_bytes=0),
            opaque=(opaque_at(35, 65, 3500),),
        ),
        Id(85),
        "the checkpoint",
        id="until it is past the retention age",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=None, max_bytes=6000, margin_bytes=0),
            opaque=(opaque_at(35, 65, 3500),),
        ),
        Id(85),
        "the checkpoint",
        id="or followed by max_bytes",
    ),
    pytest.param(
        inputs(
            samples=LOG[1:],
            options=RetentionOptions(max_age_s=None, margin_bytes=0),
            opaque=(opaque_at(5, 95, 500),),
        ),
        None,
        "opaque data is kept forever (no retention age or bytes): opaque record memory:5",
        id="no retention bound: opaque data below every point keeps everything",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(margin_bytes=0),
            opaque=(opaque_at(95, 5, 9500),),
        ),
        Id(85),
        "the checkpoint",
        id="an opaque record above the candidate does not hold it back",
    ),
    pytest.param(
        inputs(options=RetentionOptions(margin_bytes=0), opaque=(opaque_at(90, 10, 9000),)),
        Id(90),
        "no opaque data below",
        id="an opaque record at the point is kept with it",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(margin_bytes=0),
            opaque=(OpaqueSpan(None, Id(0), tick(100), 0),),
        ),
        None,
        "unread history before the WAL opened (up to memory:0) below every position is not "
        "past the retention bound (older than 604800 s)",
        id="history before the open holds back until the retention period",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=3600, margin_bytes=0),
            opaque=(OpaqueSpan(None, Id(0), tick(100), 0),),
        ),
        Id(85),
        "the checkpoint",
        id="history before the open goes once past the retention age",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=3600, margin_bytes=0),
            opaque=(opaque_at(15, 85, 1500), opaque_at(55, 45, 5500)),
        ),
        Id(50),
        "opaque record memory:55 holds back what follows",
        id="two opaque records: the younger one holds back only what is above it",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(15)),
            options=RetentionOptions(max_age_s=3600, margin_bytes=0),
            opaque=(opaque_at(15, 85, 1500).merge(opaque_at(55, 45, 5500)),),
        ),
        Id(10),
        "opaque records memory:15..memory:55 holds back what follows",
        id="merged into one span: held back from its first record, as young as its last",
    ),
    pytest.param(
        inputs(
            collections=("orders",),
            checkpoint=Checkpointed(Id(85), tick(-0.01)),
            options=dataclasses.replace(OPTS, max_age_s=None, max_bytes=1, margin_s=0),
        ),
        Id(85),
        "the checkpoint",
        id="a timetick a little ahead of the clock is of age 0, not negative",
    ),
]


@pytest.mark.parametrize(("case", "below", "reason"), CASES)
def test_decide(case: Inputs, below: Id | None, reason: str) -> None:
    decision = decide(case)
    assert decision.below == below, decision.reason
    assert reason in decision.reason


records = st.lists(
    st.tuples(st.integers(0, 30), st.integers(1, 500), st.booleans()), min_size=1, max_size=40
)


@settings(max_examples=500, deadline=None)
@given(
    steps=records,
    every=st.integers(1, 6),
    spans=st.integers(2, 12),
    checkpoint_at=st.one_of(st.none(), st.integers(0, 39)),
    collections=st.booleans(),
    max_age=st.one_of(st.none(), st.integers(1, 600)),
    max_bytes=st.one_of(st.none(), st.integers(1, 5000)),
    margin_s=st.one_of(st.just(0), st.integers(0, 300)),
    margin_bytes=st.one_of(st.just(0), st.integers(0, 3000)),
)
def test_the_point_breaks_no_rule(  # noqa: PLR0917 - one argument per strategy
    steps: list[tuple[int, int, bool]],
    every: int,
    spans: int,
    checkpoint_at: int | None,
    collections: bool,
    max_age: int | None,
    max_bytes: int | None,
    margin_s: int,
    margin_bytes: int,
) -> None:
    """Whatever the log (some records opaque), its sampling, the merging of
    its opaque spans (an :class:`OpaqueLog` of ``spans`` spans) and the
    checkpoint, the point is at or below the checkpoint when a collection
    lives here, outside the margin (judged on the record at the point), and
    every opaque record it drops (below it) is past the retention bound,
    judged on that record's true age and following bytes."""
    ms, total = NOW_MS - 20 * 60_000, 0
    log: list[Sample] = []  # every record: id i, its tick, the bytes up to it
    opaque = OpaqueLog(capacity=spans, coalesce_s=0)
    opaque_ids: list[int] = []
    for s_step, size, is_opaque in steps:
        ms, total = ms + s_step * 1000, total + size
        record = Sample(Id(len(log)), tso.compose(min(ms, NOW_MS), 0), total)
        log.append(record)
        if is_opaque:
            opaque_ids.append(record.id.seq)
            opaque.note(OpaqueSpan(record.id, record.id, record.timetick, record.bytes))
    sampled = [*log[::every], log[-1]] if (len(log) - 1) % every else log[::every]
    checkpoint = None
    if checkpoint_at is not None and checkpoint_at < len(log):
        record = log[checkpoint_at]
        checkpoint = Checkpointed(record.id, record.timetick)
    if collections and checkpoint is None:
        kept = decide(Inputs(None, ("c",), sampled, total, NOW_MS, OPTS, opaque.spans))
        assert kept.below is None
        return
    options = RetentionOptions(
        max_age_s=max_age, max_bytes=max_bytes, margin_s=margin_s, margin_bytes=margin_bytes
    )
    decision = decide(
        Inputs(
            checkpoint,
            ("c",) if collections else (),
            sampled,
            total,
            NOW_MS,
            options,
            opaque.spans,
        )
    )
    if decision.below is None:
        return
    if collections:
        assert checkpoint is not None
        assert decision.below <= checkpoint.position
    at = log[decision.below.seq]
    assert (NOW_MS - tso.physical_ms(at.timetick)) / 1000 >= margin_s
    assert total - at.bytes >= margin_bytes
    for i in opaque_ids:
        if i >= decision.below.seq:
            break
        lost = log[i]
        age_s = (NOW_MS - tso.physical_ms(lost.timetick)) / 1000
        after = total - lost.bytes
        assert (max_age is not None and age_s >= max_age) or (
            max_bytes is not None and after >= max_bytes
        ), (lost, decision.reason)


def test_position_log_thins_the_older_half() -> None:
    now = [0.0]
    log = PositionLog(capacity=8, min_gap_s=1.0, clock=lambda: now[0])
    for i in range(1, 30):
        now[0] += 0.5  # every other one is within the gap
        log.note(Sample(Id(i), i, i * 10))
    ids = [s.id for s in log.samples]
    assert len(ids) <= 8
    assert ids == sorted(ids)
    assert ids[-1] == Id(29)  # the newest is always fine grained
    log.note(Sample(Id(29), 99, 999), force=True)  # not after the last: ignored
    assert log.samples[-1].bytes == 290


def covered(span: OpaqueSpan, noted: OpaqueSpan) -> bool:
    """``span`` stands for ``noted`` conservatively: it reaches at least as
    low, is at least as young and counts at least as many bytes."""
    assert noted.first is not None
    low = span.first is None or span.first <= noted.first
    return (
        low
        and span.last >= noted.last
        and span.timetick >= noted.timetick
        and (span.bytes >= noted.bytes)
    )


def test_opaque_log_coalesces_within_its_gap_and_merges_conservatively_when_full() -> None:
    now = [0.0]
    log = OpaqueLog(capacity=4, coalesce_s=1.0, clock=lambda: now[0])
    noted = []
    for i in range(1, 30):
        now[0] += 0.6  # every other one is within the gap of the span before
        span = OpaqueSpan(Id(i * 10), Id(i * 10 + 5), i, i * 100)
        noted.append(span)
        log.note(span)
    spans = log.spans
    assert len(spans) <= 4
    assert spans[-1].last == Id(295) and spans[-1].timetick == 29
    for span in noted:
        assert any(covered(kept, span) for kept in spans), span
    # acknowledged out of order: merged into the last span, never lost
    now[0] += 10
    log.note(OpaqueSpan(Id(1), Id(2), 30, 3000))
    assert covered(log.spans[-1], OpaqueSpan(Id(1), Id(2), 30, 3000))
    log.note_history([OpaqueSpan(None, Id(0), 0, 0)])
    assert log.spans[0].first is None and len(log.spans) <= 4


@pytest.mark.parametrize("capacity", [2, 3, 5])
def test_opaque_log_never_exceeds_its_capacity(capacity: int) -> None:
    log = OpaqueLog(capacity=capacity, coalesce_s=0)
    for i in range(40):
        log.note(OpaqueSpan(Id(i), Id(i), i, i))
        assert len(log.spans) <= capacity
    assert log.spans[-1] == OpaqueSpan(Id(39), Id(39), 39, 39)
    assert log.spans[0].first == Id(0)  # merged, never dropped


def test_a_merged_span_reaches_from_start_of_the_log_if_either_does() -> None:
    merged = OpaqueSpan(Id(5), Id(6), 9, 60).merge(OpaqueSpan(None, Id(1), 2, 0))
    assert merged == OpaqueSpan(None, Id(6), 9, 60)


def test_unflushed_bytes_count_from_the_sample_at_or_after_the_checkpoint() -> None:
    progress = Progress(PositionLog(min_gap_s=0))
    for i in range(1, 6):
        progress.appended(Id(i * 10), i, 100)
    assert progress.unflushed_bytes() == 500  # no checkpoint: everything
    assert flushed_bytes(progress.positions.samples, Id(35)) == 400
    assert flushed_bytes(progress.positions.samples, Id(30)) == 300
    progress.set_flush(FlushState(("orders",), Id(35)))
    assert progress.carries_collections
    assert progress.unflushed_bytes() == 100  # counted from the next sample: never held back
    progress.set_flush(FlushState(("orders",), Id(5)))  # before every sample
    assert progress.unflushed_bytes() == 400
    progress.set_flush(FlushState(("orders",), Id(50)))  # at the tail
    assert progress.unflushed_bytes() == 0


@pytest.mark.parametrize(
    ("unflushed", "verdict"),
    [
        (0, Pressure()),
        (1000, Pressure()),
        (1500, Pressure(delay_s=0.25)),
        (1999, Pressure(delay_s=0.5 * 999 / 1000)),
        (2000, Pressure(refuse=True)),
        (10**9, Pressure(refuse=True)),
    ],
)
def test_pressure(unflushed: int, verdict: Pressure) -> None:
    options = RetentionOptions(soft_bytes=1000, hard_bytes=2000, max_delay_s=0.5)
    assert pressure(unflushed, options) == verdict


@pytest.mark.parametrize(
    "changes",
    [
        {"soft_bytes": 10, "hard_bytes": 5},
        {"max_age_s": 0},
        {"max_bytes": -1},
        {"margin_s": -1},
        {"pass_interval_s": 0},
        {"hard_bytes": True},
    ],
)
def test_bad_options_are_refused_with_the_option_named(changes: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        RetentionOptions(**changes)  # type: ignore[arg-type]
    assert next(iter(changes)) in caught.value.message


def data(collection: bool = True, kind: MessageType = MessageType.INSERT) -> AppendContext:
    properties = {COLLECTION: "orders"} if collection else {}
    return AppendContext(Message(kind, "orders-0", b"rows", properties), 100)


class Chain:
    """The rest of the chain: records what reached it and settles it."""

    def __init__(self) -> None:
        self.passed: list[AppendContext] = []
        self.slept: list[float] = []

    async def next(self, batch: list[AppendContext]) -> None:
        self.passed.extend(batch)
        for ctx in batch:
            ctx.result = AppendResult(Id(1), 1, 1)

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def interceptor(
    unflushed: int, *, collections: bool = True
) -> tuple[BackPressureInterceptor, Chain]:
    progress = Progress(PositionLog(min_gap_s=0))
    progress.appended(Id(1), 1, unflushed)
    progress.set_flush(FlushState(("orders",) if collections else (), None))
    chain = Chain()
    options = RetentionOptions(soft_bytes=1000, hard_bytes=2000, max_delay_s=0.5)
    return BackPressureInterceptor("p", progress, options, chain.sleep), chain


async def test_collection_data_waits_in_proportion_past_the_soft_watermark() -> None:
    bp, chain = interceptor(1500)
    batch = [data(), data(collection=False)]
    await bp(batch, chain.next)
    assert chain.slept == [0.25]
    assert chain.passed == batch


@pytest.mark.parametrize(
    ("unflushed", "collections", "batch"),
    [
        pytest.param(1500, True, [data(collection=False)], id="opaque data only"),
        pytest.param(1500, False, [data()], id="pchannel without collections"),
        pytest.param(900, True, [data()], id="below the soft watermark"),
    ],
)
async def test_no_delay(unflushed: int, collections: bool, batch: list[AppendContext]) -> None:
    bp, chain = interceptor(unflushed, collections=collections)
    await bp(batch, chain.next)
    assert chain.slept == []
    assert chain.passed == batch


async def test_past_the_hard_watermark_only_collection_data_is_refused() -> None:
    bp, chain = interceptor(2000)
    insert, delete = data(), data(kind=MessageType.DELETE)
    opaque, seal = data(collection=False), data(kind=MessageType.FLUSH)
    await bp([insert, opaque, delete, seal], chain.next)
    assert chain.passed == [opaque, seal]
    for refused in (insert, delete):
        assert isinstance(refused.error, errors.FlushBehind)
        assert refused.error.retryable
    assert "2000 bytes after its checkpoint (none yet)" in str(insert.error)
    assert chain.slept == []


_NOTES = st.lists(
    st.tuples(
        st.integers(0, 40),  # first id
        st.integers(0, 3),  # ids the span covers past its first
        st.integers(0, 50),  # timetick
        st.integers(0, 500),  # bytes
        st.sampled_from([0.0, 0.3, 1.5]),  # seconds since the previous note
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_NOTES, st.integers(2, 5))
def test_note_range_keeps_the_spans_note_would(
    notes: list[tuple[int, int, int, int, float]], capacity: int
) -> None:
    """The appender's shortcut (a span above the last one extends it) leaves
    exactly the spans that noting the same spans one by one leaves."""
    clocks = [0.0], [0.0]
    fast = OpaqueLog(capacity=capacity, coalesce_s=1.0, clock=lambda: clocks[0][0])
    slow = OpaqueLog(capacity=capacity, coalesce_s=1.0, clock=lambda: clocks[1][0])
    for first, width, timetick, size, gap in notes:
        for clock in clocks:
            clock[0] += gap
        fast.note_range(Id(first), Id(first + width), timetick, size)
        slow.note(OpaqueSpan(Id(first), Id(first + width), timetick, size))
        assert fast.spans == slow.spans


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from([0.0, 0.02, 0.06]), max_size=30))
def test_position_offer_keeps_the_samples_note_would(gaps: list[float]) -> None:
    clocks = [0.0], [0.0]
    fast = PositionLog(capacity=4, min_gap_s=0.05, clock=lambda: clocks[0][0])
    slow = PositionLog(capacity=4, min_gap_s=0.05, clock=lambda: clocks[1][0])
    for i, gap in enumerate(gaps):
        for clock in clocks:
            clock[0] += gap
        fast.offer(Id(i), i * 10, i * 100)
        slow.note(Sample(Id(i), i * 10, i * 100))
        assert fast.samples == slow.samples

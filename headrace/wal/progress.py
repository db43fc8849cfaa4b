"""What a WAL knows of its own log for retention and back-pressure.

:class:`PositionLog` samples the log as the appender acknowledges batches:
``(id, timetick, bytes)``, where ``bytes`` counts the encoded bytes this WAL
appended since it opened, up to and including the record ``id``. Samples are
taken at most every :attr:`PositionLog.min_gap_s`; when the log is full, every
other sample of its older half is dropped, so recent positions stay fine
grained (the checkpoint is normally recent) and old ones coarse. Records
written before this WAL opened lie below the first sample (taken at open with
``bytes`` 0).

:class:`Progress` is one WAL's live view: the byte counter, the samples, and
the flush state the node's housekeeping pass last learned from the metastore
(:class:`FlushState`). The back-pressure interceptor reads it on every append.

:class:`OpaqueLog` notes where opaque records are (records of no collection
that the WAL did not write itself: retention holds only them back), one
:class:`OpaqueSpan` per append batch, coalesced within
:attr:`OpaqueLog.coalesce_s`; when full, neighbours of its older half are
merged, conservatively (a merged span covers both and keeps the younger
timetick and the larger byte count). History from before the WAL opened that
the open did not read is noted as a span from the start of the log, as young
as the oldest record the open did read, unless the previous owner's
:class:`OpaqueSummary` covers it (:func:`inherited`).

:class:`RetentionOptions` is the one options object of retention, truncation
and back-pressure.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence

from headrace import errors, slots
from headrace.message.ids import MessageID

DAY_S = 86_400.0
MIB = 1 << 20


@dataclasses.dataclass(frozen=True, slots=True)
class RetentionOptions:
    """Retention of opaque data, the truncation safety margin, the flush
    back-pressure watermarks, and how often the owner node applies them.

    ``max_age_s`` / ``max_bytes``: a record may be truncated once it is older
    than ``max_age_s`` or once ``max_bytes`` newer bytes follow it (like a
    Kafka topic's ``retention.ms`` / ``retention.bytes``); None: no bound of
    that kind (both None: opaque data is kept forever). Only opaque records
    are governed by them: a point with no opaque record below it is not held
    back (see :mod:`headrace.wal.retention`).
    ``margin_s`` / ``margin_bytes``: never truncate a record younger than
    ``margin_s`` or followed by fewer than ``margin_bytes``.
    ``soft_bytes`` / ``hard_bytes``: unflushed bytes of a pchannel carrying
    collection data past which its collection appends are delayed (up to
    ``max_delay_s``) / refused with FLUSH_BEHIND.
    """

    max_age_s: float | None = 7 * DAY_S
    max_bytes: int | None = None
    margin_s: float = 60.0
    margin_bytes: int = 16 * MIB
    soft_bytes: int = 1024 * MIB
    hard_bytes: int = 4096 * MIB
    max_delay_s: float = 1.0
    pass_interval_s: float = 10.0

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name in ("max_age_s", "max_bytes"):
            value = getattr(self, name)
            if value is not None and (_not_number(value) or value <= 0):
                problems.append(f"{name} must be positive or None, got {value!r}")
        for name in ("margin_s", "margin_bytes", "max_delay_s"):
            value = getattr(self, name)
            if _not_number(value) or value < 0:
                problems.append(f"{name} must be a number of at least 0, got {value!r}")
        for name in ("soft_bytes", "hard_bytes", "pass_interval_s"):
            value = getattr(self, name)
            if _not_number(value) or value <= 0:
                problems.append(f"{name} must be positive, got {value!r}")
        if not problems and self.soft_bytes > self.hard_bytes:
            problems.append(
                f"soft_bytes ({self.soft_bytes}) must not exceed hard_bytes ({self.hard_bytes})"
            )
        if problems:
            raise errors.InvalidArgument("retention options: " + "; ".join(problems))


def _not_number(value: object) -> bool:
    return isinstance(value, bool) or not isinstance(value, int | float)


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    """A position of the log: the record ``id``, its ``timetick``, and the
    bytes this WAL appended up to and including it."""

    id: MessageID
    timetick: int
    bytes: int


class PositionLog:
    """Samples of the log, in id order (see the module docstring)."""

    def __init__(
        self,
        *,
        capacity: int = 4096,
        min_gap_s: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 4:
            raise errors.InvalidArgument(f"a position log holds at least 4 samples, not {capacity}")
        self.capacity = capacity
        self.min_gap_s = min_gap_s
        self._clock = clock
        self._samples: list[Sample] = []
        self._last_noted = float("-inf")

    def note(self, sample: Sample, *, force: bool = False) -> None:
        """Keep ``sample`` unless one was kept less than ``min_gap_s`` ago."""
        now = self._clock()
        if not force and now - self._last_noted < self.min_gap_s:
            return
        self._keep(sample, now)

    def offer(self, id: MessageID, timetick: int, bytes: int) -> None:
        """:meth:`note` of ``Sample(id, timetick, bytes)``, built only if it is
        kept (one offer per acknowledged append, most of them dropped)."""
        now = self._clock()
        if now - self._last_noted < self.min_gap_s:
            return
        self._keep(Sample(id, timetick, bytes), now)

    def _keep(self, sample: Sample, now: float) -> None:
        samples = self._samples
        if samples and sample.id <= samples[-1].id:
            return
        self._last_noted = now
        samples.append(sample)
        if len(samples) > self.capacity:
            half = len(samples) // 2
            self._samples = samples[:half:2] + samples[half:]

    @property
    def samples(self) -> Sequence[Sample]:
        return tuple(self._samples)


@dataclasses.dataclass(frozen=True, slots=True)
class OpaqueSpan:
    """Opaque records lie in ``[first, last]`` (``first`` None: possibly from
    the start of the log on); the youngest of them has a timetick of at most
    ``timetick``, and at most ``bytes`` were counted up to it (so the bytes
    after it are at least the appended bytes less ``bytes``)."""

    first: MessageID | None
    last: MessageID
    timetick: int
    bytes: int

    def merge(self, other: OpaqueSpan) -> OpaqueSpan:
        """A span covering both (conservative: the younger timetick, more bytes)."""
        # One comparison per id, not min()/max(): ids order through __lt__ alone
        # (one span is merged per acknowledged append).
        mine, theirs = self.first, other.first
        first = None if mine is None or theirs is None else theirs if theirs < mine else mine
        last = other.last if self.last < other.last else self.last
        return OpaqueSpan(
            first,
            last,
            max(self.timetick, other.timetick),
            max(self.bytes, other.bytes),
        )

    def describe(self) -> str:
        if self.first is None:
            return f"unread history before the WAL opened (up to {self.last})"
        if self.first == self.last:
            return f"opaque record {self.first}"
        return f"opaque records {self.first}..{self.last}"


_SET_SPAN = slots.setters(OpaqueSpan)
"""In field order: first, last, timetick, bytes."""


def _span(first: MessageID | None, last: MessageID, timetick: int, bytes: int) -> OpaqueSpan:
    """``OpaqueSpan(first, last, timetick, bytes)`` built through its slots (one
    per acknowledged append)."""
    span: OpaqueSpan = object.__new__(OpaqueSpan)
    set_first, set_last, set_timetick, set_bytes = _SET_SPAN
    set_first(span, first)
    set_last(span, last)
    set_timetick(span, timetick)
    set_bytes(span, bytes)
    return span


class OpaqueLog:
    """Where opaque records lie, a bounded list of spans (see the module docstring)."""

    def __init__(
        self,
        *,
        capacity: int = 1024,
        coalesce_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if capacity < 2:
            raise errors.InvalidArgument(f"an opaque log holds at least 2 spans, not {capacity}")
        self.capacity = capacity
        self.coalesce_s = coalesce_s
        self._clock = clock
        self._spans: list[OpaqueSpan] = []
        self._last_noted = float("-inf")

    def note(self, span: OpaqueSpan) -> None:
        """Keep ``span``, merged into the last one when that one was noted
        less than ``coalesce_s`` ago or does not lie wholly below it (batches
        may be acknowledged out of order)."""
        self._note(span, self._clock())

    def note_range(self, first: MessageID, last: MessageID, timetick: int, bytes: int) -> None:
        """:meth:`note` of ``OpaqueSpan(first, last, timetick, bytes)``. The
        common case, a span lying wholly above the last one within
        ``coalesce_s`` (one producer's next append), extends the last span
        with one id comparison and no merge (the merge's outcome: its first
        id, the new last id, the larger timetick and byte count)."""
        now = self._clock()
        spans = self._spans
        if spans and now - self._last_noted < self.coalesce_s:
            tail = spans[-1]
            if tail.last < first:
                spans[-1] = _span(
                    tail.first,
                    last,
                    timetick if timetick > tail.timetick else tail.timetick,
                    bytes if bytes > tail.bytes else tail.bytes,
                )
                return
        self._note(_span(first, last, timetick, bytes), now)

    def _note(self, span: OpaqueSpan, now: float) -> None:
        spans = self._spans
        if spans and (
            now - self._last_noted < self.coalesce_s
            or span.first is None
            or spans[-1].last >= span.first
        ):
            spans[-1] = spans[-1].merge(span)
            return
        self._last_noted = now
        spans.append(span)
        if len(spans) > self.capacity:
            half = max(2, len(spans) // 2)
            merged = [
                spans[i].merge(spans[i + 1]) if i + 1 < half else spans[i]
                for i in range(0, half, 2)
            ]
            self._spans = merged + spans[half:]

    def note_history(self, spans: Sequence[OpaqueSpan]) -> None:
        """Opaque records from before the WAL opened (in id order), placed
        before anything noted since; not coalesced by time."""
        self._spans = list(spans) + self._spans
        while len(self._spans) > self.capacity:
            self._spans[:2] = [self._spans[0].merge(self._spans[1])]

    @property
    def spans(self) -> Sequence[OpaqueSpan]:
        return tuple(self._spans)


@dataclasses.dataclass(frozen=True, slots=True)
class OpaqueSummary:
    """What an owner knows of a pchannel's opaque records, handed to the next
    owner through its retention record: everything at or below
    ``known_until`` is known to it (its appends, its open's scan, or what it
    inherited); ``complete``: from the log's earliest record (no unread
    history); ``youngest``: one span covering every opaque record it knows
    of, as young as the youngest (None: there is none). One span is
    conservative: on a pchannel of mixed data it holds back everything above
    its first record until its youngest ages."""

    known_until: MessageID
    complete: bool
    youngest: OpaqueSpan | None


def summarize(spans: Sequence[OpaqueSpan], known_until: MessageID) -> OpaqueSummary:
    """The summary of a WAL's opaque spans up to its tail ``known_until`` (pure)."""
    complete = all(span.first is not None for span in spans)
    youngest: OpaqueSpan | None = None
    for span in spans:
        youngest = span if youngest is None else youngest.merge(span)
    if youngest is not None:
        youngest = dataclasses.replace(youngest, bytes=0)
    return OpaqueSummary(known_until, complete, youngest)


def widened_start(start: MessageID | None, summary: OpaqueSummary | None) -> MessageID | None:
    """Where a new owner's open reads from for retention (pure): its scan's
    ``start``, or earlier, down to the previous owner's ``known_until`` when
    that complete summary stops short of ``start``. The records between were
    appended after the previous owner's last summary (one housekeeping pass,
    e.g. just before it was killed); reading them makes the history below
    ``start`` known instead of unread, which would hold truncation back for
    the whole retention period."""
    if (
        start is None
        or summary is None
        or not summary.complete
        or summary.known_until.backend != start.backend
        or summary.known_until >= start
    ):
        return start
    return summary.known_until


def inherited(summary: OpaqueSummary | None, start: MessageID) -> list[OpaqueSpan] | None:
    """The opaque history below ``start`` (where a new owner's scan began)
    that ``summary`` accounts for, None if it does not cover it (pure): it
    must be complete and known at least up to ``start`` (records appended
    after the previous owner's last summary may lie below ``start``), of the
    same backend. The span counts 0 bytes: those before the open are not counted, so
    ``max_bytes`` errs on keeping more."""
    if (
        summary is None
        or not summary.complete
        or summary.known_until.backend != start.backend  # it tells nothing of this log
        or summary.known_until < start
    ):
        return None
    return [] if summary.youngest is None else [summary.youngest]


@dataclasses.dataclass(frozen=True, slots=True)
class FlushState:
    """What the owner's housekeeping pass last learned about a pchannel's flush.

    ``collections``: collections with a shard on the pchannel (empty: it
    carries only opaque vchannels). ``checkpoint``: the flush checkpoint, None
    if nothing was flushed yet.
    """

    collections: tuple[str, ...] = ()
    checkpoint: MessageID | None = None


class Progress:
    """One WAL's byte counter, samples and flush state."""

    def __init__(self, log: PositionLog | None = None, opaque: OpaqueLog | None = None) -> None:
        self.positions = log if log is not None else PositionLog()
        self.opaque = opaque if opaque is not None else OpaqueLog()
        self.appended_bytes = 0
        self.flush = FlushState()
        self._flushed_bytes = 0
        """Bytes at the checkpoint as far as the samples tell (see :func:`flushed_bytes`)."""

    def appended(self, last_id: MessageID, timetick: int, size: int) -> None:
        """The appender acknowledged ``size`` more bytes ending at ``last_id``."""
        self.appended_bytes += size
        self.positions.offer(last_id, timetick, self.appended_bytes)

    def opaque_appended(self, first: MessageID, last: MessageID, timetick: int) -> None:
        """Opaque records of one acknowledged batch lie in ``[first, last]``,
        the youngest at ``timetick``; the bytes counted now are at least those
        up to it."""
        self.opaque.note_range(first, last, timetick, self.appended_bytes)

    def set_flush(self, state: FlushState) -> None:
        """What the housekeeping pass learned; samples noted later all lie
        above the checkpoint, so the bytes at the checkpoint are computed once."""
        self.flush = state
        self._flushed_bytes = flushed_bytes(self.positions.samples, state.checkpoint)

    @property
    def carries_collections(self) -> bool:
        return bool(self.flush.collections)

    def unflushed_bytes(self) -> int:
        """Bytes appended after the checkpoint, as far as this WAL counted them."""
        return max(0, self.appended_bytes - self._flushed_bytes)


def flushed_bytes(samples: Sequence[Sample], checkpoint: MessageID | None) -> int:
    """The bytes counted up to the first sample at or after ``checkpoint``
    (pure); 0 without a checkpoint.

    The appended bytes less this are the unflushed bytes, under-estimated by
    at most the bytes between the checkpoint and that sample (one sampling
    gap: the housekeeping pass notes the tail before asking, so there always
    is one), and counting only what this WAL appended (everything, when the
    checkpoint lies before the first sample). An under-estimate, not an
    over-estimate: a checkpoint landing between two distant samples must
    release back-pressure, never hold it forever.
    """
    if checkpoint is None:
        return 0
    index = bisect.bisect_left([s.id for s in samples], checkpoint)
    return samples[index].bytes if index < len(samples) else (samples[-1].bytes if samples else 0)

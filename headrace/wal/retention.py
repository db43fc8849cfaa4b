"""Where a pchannel may be truncated: a pure decision, and its status record.

:func:`decide` takes what the owner knows of one pchannel (the flush
checkpoint, the collections with a shard on it, the sampled positions of its
WAL, the time and the :class:`~headrace.wal.progress.RetentionOptions`) and
answers the position to truncate below, or to keep everything, with the
reason. The rules:

* **Collections**: with a collection on the pchannel, nothing at or after the
  flush checkpoint is truncated; with no checkpoint yet, nothing at all.
* **Opaque retention**: vchannels of no collection are opaque logs, kept like a
  Kafka topic: an opaque record may go once it is older than ``max_age_s`` or
  once ``max_bytes`` newer bytes follow it (neither set: kept forever). A
  point is held back only by the youngest opaque record below it, as far as
  the WAL's :class:`~headrace.wal.progress.OpaqueSpan` list tells (history
  from before the WAL opened that the open did not read counts as opaque,
  unless the previous owner's summary in its :class:`RetentionRecord`
  covers it);
  with no opaque record below a point, retention does not hold it back.
* **Margin**: a truncation point is at least ``margin_s`` old and followed by
  at least ``margin_bytes``.
* Points are only the WAL's sampled positions and the checkpoint itself, whose
  ages (timeticks) and following bytes are known; bytes are lower bounds
  (records before the WAL opened are not counted), so every rule errs on
  keeping more.

The point is the highest candidate that every rule allows; the backend drops
records below it (``Backend.truncate``: whole segments on the local backend,
``delete_records`` on Kafka, the subscription's cursor on Pulsar) and keeps the
point itself.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence

import pydantic

from headrace import errors, tso
from headrace.cluster import JsonRecord, Keys
from headrace.message import ids
from headrace.message.ids import MessageID
from headrace.wal.progress import OpaqueSpan, OpaqueSummary, RetentionOptions, Sample


@dataclasses.dataclass(frozen=True, slots=True)
class Checkpointed:
    """The flush checkpoint: the last flushed record and its timetick."""

    position: MessageID
    timetick: int


@dataclasses.dataclass(frozen=True, slots=True)
class Inputs:
    """What the owner knows of one pchannel at ``now_ms`` (wall-clock ms)."""

    checkpoint: Checkpointed | None
    collections: tuple[str, ...]
    """Collections with a shard on the pchannel."""
    samples: Sequence[Sample]
    """The WAL's sampled positions, in id order; the last is the tail."""
    appended_bytes: int
    now_ms: int
    options: RetentionOptions
    opaque: Sequence[OpaqueSpan]
    """Where opaque records lie (see :class:`~headrace.wal.progress.OpaqueLog`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Truncation:
    """The decision: truncate below ``below``, or (``below`` None) keep everything."""

    below: MessageID | None
    reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class _Point:
    id: MessageID
    timetick: int
    bytes_after: int
    """A lower bound of the bytes appended after the record."""


def decide(inputs: Inputs) -> Truncation:
    """The position to truncate below, or keep everything with the reason (pure)."""
    options = inputs.options
    if inputs.collections and inputs.checkpoint is None:
        return Truncation(
            None, f"collection {inputs.collections[0]} has a shard here and no checkpoint yet"
        )
    points = _points(inputs)
    if not points:
        return Truncation(None, "the WAL has no known position yet")
    below = _OpaqueBelow(inputs.opaque)
    allowed = [p for p in points if _retention_allows(below.youngest(p.id), inputs)]
    if not allowed:
        holder = below.youngest(min(p.id for p in points))
        held = holder.describe() if holder is not None else "opaque data"
        if options.max_age_s is None and options.max_bytes is None:
            return Truncation(
                None,
                f"opaque data is kept forever (no retention age or bytes): {held} lies "
                "below every position",
            )
        return Truncation(
            None,
            f"{held} below every position is not past the retention bound ({_bound_text(options)})",
        )
    allowed = [p for p in allowed if _margin_allows(p, inputs)]
    if not allowed:
        return Truncation(
            None,
            f"nothing retention allows is outside the safety margin "
            f"({options.margin_s:g} s, {options.margin_bytes} bytes)",
        )
    checkpoint = inputs.checkpoint
    if inputs.collections and checkpoint is not None:
        allowed = [p for p in allowed if p.id <= checkpoint.position]
        if not allowed:
            return Truncation(
                None,
                f"the checkpoint {checkpoint.position} of collection "
                f"{inputs.collections[0]} is below every position retention and the "
                "margin allow",
            )
    best = max(allowed, key=lambda p: p.id)
    why = "retention" if below.youngest(best.id) is not None else "no opaque data below"
    if inputs.collections and checkpoint is not None and best.id == checkpoint.position:
        why = "the checkpoint"
    reason = f"below {best.id} ({why}, margin kept)"
    above = [p.id for p in points if p.id > best.id]
    holder = below.youngest(min(above)) if above else None
    if holder is not None and not _retention_allows(holder, inputs):
        reason += f"; {holder.describe()} holds back what follows"
    return Truncation(best.id, reason)


class _OpaqueBelow:
    """The youngest opaque span reaching below a point, by bisection over
    the spans sorted by their first id (spans from the start of the log reach
    below every point)."""

    def __init__(self, spans: Sequence[OpaqueSpan]) -> None:
        unread: OpaqueSpan | None = None
        known: list[tuple[MessageID, OpaqueSpan]] = []
        for span in spans:
            if span.first is None:
                unread = span if unread is None else unread.merge(span)
            else:
                known.append((span.first, span))
        known.sort(key=lambda pair: pair[0])
        self._firsts = [first for first, _ in known]
        youngest: list[OpaqueSpan] = []
        running = unread
        for _, span in known:
            running = span if running is None else _younger(running, span)
            youngest.append(running)
        self._youngest = youngest
        self._unread = unread

    def youngest(self, point: MessageID) -> OpaqueSpan | None:
        """The youngest span with a record possibly below ``point`` (ages and
        bytes of several are combined conservatively), None if none has."""
        index = bisect.bisect_left(self._firsts, point)
        return self._youngest[index - 1] if index else self._unread


def _younger(a: OpaqueSpan, b: OpaqueSpan) -> OpaqueSpan:
    """The span of the two with the younger record, its bytes at least both's."""
    young = a if a.timetick >= b.timetick else b
    return dataclasses.replace(young, bytes=max(a.bytes, b.bytes))


def _points(inputs: Inputs) -> list[_Point]:
    samples = inputs.samples
    total = inputs.appended_bytes
    points = [_Point(s.id, s.timetick, total - s.bytes) for s in samples]
    checkpoint = inputs.checkpoint
    if checkpoint is not None and samples:
        ids = [s.id for s in samples]
        above = bisect.bisect_left(ids, checkpoint.position)
        if above < len(samples) and samples[above].id != checkpoint.position:
            # The bytes at the checkpoint are at most those at the next sample.
            after = total - samples[above].bytes
            points.append(_Point(checkpoint.position, checkpoint.timetick, after))
    return points


def _age_s(timetick: int, now_ms: int) -> float:
    """Seconds since ``timetick``; 0 for a timetick ahead of the clock (the
    TSO may hand out times a little ahead)."""
    return max(0, now_ms - tso.physical_ms(timetick)) / 1000.0


def _retention_allows(holder: OpaqueSpan | None, inputs: Inputs) -> bool:
    """Whether the youngest opaque record below a point (``holder``, None:
    none) is past the retention bound."""
    if holder is None:
        return True
    options = inputs.options
    old = (
        options.max_age_s is not None
        and _age_s(holder.timetick, inputs.now_ms) >= options.max_age_s
    )
    big = (
        options.max_bytes is not None and inputs.appended_bytes - holder.bytes >= options.max_bytes
    )
    return old or big


def _margin_allows(point: _Point, inputs: Inputs) -> bool:
    options = inputs.options
    return (
        _age_s(point.timetick, inputs.now_ms) >= options.margin_s
        and point.bytes_after >= options.margin_bytes
    )


def _bound_text(options: RetentionOptions) -> str:
    parts = []
    if options.max_age_s is not None:
        parts.append(f"older than {options.max_age_s:g} s")
    if options.max_bytes is not None:
        parts.append(f"{options.max_bytes} newer bytes")
    return " or ".join(parts)


class RetentionRecord(JsonRecord):
    """What the owner's housekeeping pass last saw of a pchannel, for
    ``headrace status``: the checkpoint, the unflushed bytes (as the WAL
    counts them, see :mod:`headrace.wal.progress`), the position the backend
    was last truncated below (empty: never by this owner) and why it keeps
    what it keeps; and, for the next owner, what it knows of the opaque
    records (:class:`~headrace.wal.progress.OpaqueSummary`)."""

    pchannel: str
    node: str
    term: int
    checkpoint: str = ""
    unflushed_bytes: int = 0
    truncated_below: str = ""
    reason: str = ""
    collections: list[str] = pydantic.Field(default_factory=list)
    at_ms: int = 0
    known_until: str = ""
    """The owner's :class:`~headrace.wal.progress.OpaqueSummary` (empty: none):
    everything at or below this position is known to it."""
    complete: bool = False
    """Its knowledge reaches back to the log's earliest record."""
    opaque_first: str = ""
    """The span of every opaque record it knows of (empty: there is none)."""
    opaque_last: str = ""
    opaque_timetick: int = 0
    """The timetick of the youngest of them."""

    def with_summary(self, summary: OpaqueSummary) -> RetentionRecord:
        """This record carrying ``summary``."""
        span = summary.youngest
        return self.model_copy(
            update={
                "known_until": str(summary.known_until),
                "complete": summary.complete,
                "opaque_first": "" if span is None or span.first is None else str(span.first),
                "opaque_last": "" if span is None else str(span.last),
                "opaque_timetick": 0 if span is None else span.timetick,
            }
        )

    def opaque_summary(self) -> OpaqueSummary | None:
        """The summary it carries, None if it carries none or an unreadable one
        (the next owner then keeps the history it does not read)."""
        if not self.known_until:
            return None
        try:
            known_until = ids.parse(self.known_until)
            span = None
            if self.opaque_last:
                first = ids.parse(self.opaque_first) if self.opaque_first else None
                span = OpaqueSpan(first, ids.parse(self.opaque_last), self.opaque_timetick, 0)
        except errors.InvalidArgument:
            return None
        backends = {known_until.backend} | (
            set() if span is None else {i.backend for i in (span.first, span.last) if i}
        )
        if len(backends) > 1:
            return None
        complete = self.complete and (span is None or span.first is not None)
        return OpaqueSummary(known_until, complete, span)


def retention_key(keys: Keys, pchannel: str) -> str:
    return f"{keys.root}/retention/{pchannel}"


def retention_prefix(keys: Keys) -> str:
    return f"{keys.root}/retention/"

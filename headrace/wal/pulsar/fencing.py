"""The term stamp every Pulsar message carries, and the fencing decisions (pure).

Each message has one property ``headrace``:

* data: ``d:<term>:<writer nonce>``
* fence record: ``f:<term>:<writer nonce>:<id of the last data message or ->``

A writer that takes the topic (an ``ExclusiveWithFencing`` producer fences the
previous one) writes one fence record with its term, so the highest term is
the term of the topic's last message, and ``last_record`` finds the last data
message through the fence record's pointer without scanning backwards.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence

from headrace import errors
from headrace.wal.pulsar.message_id import PulsarMessageID

PROPERTY = "headrace"


class Kind(enum.Enum):
    DATA = "d"
    FENCE = "f"


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp:
    kind: Kind
    term: int
    nonce: int
    prev: PulsarMessageID | None = None
    """For fence records: the last data message before it."""

    def properties(self) -> dict[str, str]:
        text = f"{self.kind.value}:{self.term}:{self.nonce}"
        if self.kind is Kind.FENCE:
            text += ":" + (self.prev.value_str() if self.prev is not None else "-")
        return {PROPERTY: text}


FOREIGN = Stamp(Kind.DATA, 0, 0)
"""Stamp of a message some other producer wrote: data of term 0."""


def stamp_of(properties: dict[str, str]) -> Stamp:
    text = properties.get(PROPERTY)
    if text is None:
        return FOREIGN
    kind, _, rest = text.partition(":")
    term, _, rest = rest.partition(":")
    nonce, _, prev = rest.partition(":")
    try:
        if kind == Kind.DATA.value and not prev:
            return Stamp(Kind.DATA, int(term), int(nonce))
        if kind == Kind.FENCE.value and prev:
            pointer = None if prev == "-" else PulsarMessageID.parse_value(prev)
            return Stamp(Kind.FENCE, int(term), int(nonce), pointer)
    except (ValueError, errors.InvalidArgument):
        pass
    raise errors.CorruptData(f"malformed headrace message property {text[:80]!r}")


def fence_check(
    pchannel: str, term: int, nonce: int, last: Stamp | None, *, reacquire: bool
) -> errors.Fenced | None:
    """The Fenced error to raise if ``term`` may not write after ``last``, else None.

    A lower term than the last message's is always fenced. On first open the
    same term may take over (the newer opener of a term wins); when a writer
    lost its producer and wants it back (``reacquire``), a message of its own
    term by another writer means that writer won.
    """
    if last is None:
        return None
    if last.term > term or (reacquire and last.term == term and last.nonce != nonce):
        return errors.Fenced(
            f"pchannel {pchannel}: term {term} is fenced, the topic already holds term {last.term}",
            term=term,
            current_term=last.term,
        )
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Overtaken:
    """A writer's fence record landed after a record it may not follow."""

    fenced: errors.Fenced
    restore: Stamp
    """The fence record that puts the overtaking term back at the topic's end."""


def overtaken(
    pchannel: str,
    term: int,
    nonce: int,
    before_fence: Sequence[tuple[PulsarMessageID, Stamp]],
    prev: PulsarMessageID | None,
    *,
    reacquire: bool,
) -> Overtaken | None:
    """Whether a record stored before this writer's fence (after the last data
    message it saw, ``prev``) belongs to a term that fences it (pure).

    The look at the topic's end before fencing cannot see a message whose
    persistence was still under way (a send in flight, or queued by a client
    across a broker restart); such a message lands before the fence. If one of
    them is of a higher term, this writer is fenced, and the restore record
    (that term's stamp, pointing at the last data message) keeps "the last
    message carries the highest term" true for every later opener.
    """
    last_data = prev
    winner: Stamp | None = None
    for mid, stamp in before_fence:
        if stamp.kind is Kind.DATA:
            last_data = mid
        fences = fence_check(pchannel, term, nonce, stamp, reacquire=reacquire) is not None
        if fences and (winner is None or stamp.term >= winner.term):
            winner = stamp
    if winner is None:
        return None
    fenced = errors.Fenced(
        f"pchannel {pchannel}: term {term} is fenced, term {winner.term} wrote to the topic "
        "while this writer was taking it",
        term=term,
        current_term=winner.term,
    )
    return Overtaken(fenced, Stamp(Kind.FENCE, winner.term, winner.nonce, last_data))

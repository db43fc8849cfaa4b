"""The term stamp every broker record carries, and the fencing decisions (pure).

Each backend encodes a :class:`Stamp` its own way (a Kafka record header, a
Pulsar message property); the meaning is the same:

* a data record carries the writer's term and nonce (the nonce tells two
  writers of the same term apart);
* a fence record, written by a writer that just took the topic, carries its
  term and nonce and points at the last data record before it.

So the highest term is always the term of the topic's last record, and the
last data record is found through the fence record's pointer without scanning
back.
"""

from __future__ import annotations

import dataclasses
import enum
import secrets
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from headrace import errors
from headrace.message.ids import MessageID

I = TypeVar("I", bound=MessageID)  # noqa: E741

NONCE_BITS = 63
"""Writer nonces fit every encoding (a signed or unsigned 64-bit field, decimal text)."""


class Kind(enum.Enum):
    DATA = "data"
    FENCE = "fence"


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp(Generic[I]):
    kind: Kind
    term: int
    nonce: int
    prev: I | None = None
    """For fence records: the last data record before it, None if there is none."""


FOREIGN: Stamp[Any] = Stamp(Kind.DATA, 0, 0)
"""Stamp of a record some other producer wrote without one: data of term 0."""


def new_nonce() -> int:
    return secrets.randbits(NONCE_BITS)


def fence_check(
    pchannel: str, term: int, nonce: int, last: Stamp[Any] | None, *, reacquire: bool
) -> errors.Fenced | None:
    """The Fenced error to raise if ``term`` may not write after ``last``, else None.

    A lower term than the last record's is always fenced. On first open the
    same term may take over (the newer opener of a term wins); when a writer
    lost its producer and wants it back (``reacquire``), a record of its own
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
class Overtaken(Generic[I]):
    """A writer's fence record landed after a record it may not follow."""

    fenced: errors.Fenced
    restore: Stamp[I]
    """The fence record that puts the overtaking term back at the topic's end."""


def overtaken(
    pchannel: str,
    term: int,
    nonce: int,
    before_fence: Sequence[tuple[I, Stamp[I]]],
    prev: I | None,
    *,
    reacquire: bool,
) -> Overtaken[I] | None:
    """Whether a record stored before this writer's fence (after the last data
    record it saw, ``prev``) belongs to a term that fences it.

    The look at the topic's end before fencing cannot see a record whose
    persistence was still under way (a send in flight, or queued by a client
    across a broker restart); such a record lands before the fence. If one of
    them is of a higher term, this writer is fenced, and the restore record
    (that term's stamp, pointing at the last data record) keeps "the last
    record carries the highest term" true for every later opener.
    """
    last_data = prev
    winner: Stamp[I] | None = None
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

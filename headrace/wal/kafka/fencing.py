"""The term stamp every Kafka record carries, and the fencing decisions (pure).

Each record has one header ``headrace`` with a fixed binary stamp::

    0  1  format version (1)
    1  1  kind: 1 data, 2 fence record
    2  8  term of the writer (u64, big endian)
    10 8  writer nonce (u64): tells two writers of the same term apart
    18 8  fence records only: offset of the last data record before it, or -1

A writer that takes the pchannel (``init_transactions`` fences the producer
epoch) writes one fence record with its term, so the highest term is always
the term of the topic's last committed record, and ``last_record`` finds the
last data record through the fence record's pointer without scanning back.
"""

from __future__ import annotations

import dataclasses
import enum
import struct

from headrace import errors

HEADER_NAME = "headrace"
_VERSION = 1
_DATA = struct.Struct(">BBQQ")
_FENCE = struct.Struct(">BBQQq")


class Kind(enum.IntEnum):
    DATA = 1
    FENCE = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Stamp:
    kind: Kind
    term: int
    nonce: int
    prev: int = -1
    """For fence records: offset of the last data record before it, -1 if none."""

    def header(self) -> Headers:
        """The record headers that carry this stamp."""
        return [(HEADER_NAME, self.encode())]

    def encode(self) -> bytes:
        if self.kind is Kind.FENCE:
            return _FENCE.pack(_VERSION, self.kind, self.term, self.nonce, self.prev)
        return _DATA.pack(_VERSION, self.kind, self.term, self.nonce)


FOREIGN = Stamp(Kind.DATA, 0, 0)
"""Stamp of a record some other producer wrote without a header: data of term 0."""


def decode(value: bytes | None) -> Stamp:
    """Parse a stamp; a missing header reads as :data:`FOREIGN`."""
    if value is None:
        return FOREIGN
    if len(value) == _DATA.size and value[0] == _VERSION and value[1] == Kind.DATA:
        _, _, term, nonce = _DATA.unpack(value)
        return Stamp(Kind.DATA, term, nonce)
    if len(value) == _FENCE.size and value[0] == _VERSION and value[1] == Kind.FENCE:
        _, _, term, nonce, prev = _FENCE.unpack(value)
        return Stamp(Kind.FENCE, term, nonce, prev)
    raise errors.CorruptData(f"malformed headrace record header ({len(value)} bytes)")


HeaderValue = str | bytes | None
Headers = dict[str, HeaderValue] | list[tuple[str, HeaderValue]]


def stamp_of(headers: Headers | None) -> Stamp:
    """The stamp among a record's headers (as confluent-kafka returns them)."""
    items = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in items:
        if name == HEADER_NAME:
            return decode(value.encode() if isinstance(value, str) else value)
    return FOREIGN


def fence_check(
    pchannel: str, term: int, nonce: int, last: Stamp | None, *, reacquire: bool
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

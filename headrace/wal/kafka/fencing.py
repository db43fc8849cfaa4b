"""How a Kafka record carries its term stamp (:mod:`headrace.wal.brokers.stamps`; pure).

Each record has one header ``headrace`` with a fixed binary stamp::

    0  1  format version (1)
    1  1  kind: 1 data, 2 fence record
    2  8  term of the writer (u64, big endian)
    10 8  writer nonce (u64): tells two writers of the same term apart
    18 8  fence records only: offset of the last data record before it, or -1
    18 8  chained data records (kind 3) only: the offset the record must land at

A writer that takes the pchannel writes one fence record with its term; the
decisions on stamps are the toolkit's
(:func:`headrace.wal.brokers.stamps.fence_check`). A transactional writer's
data records are kind 1 (the broker fences its producer epoch); a chained
writer's (:mod:`headrace.wal.kafka.chain`, logs of message format 2) are kind
3: each names the offset right after its writer's previous record, and counts
only where it landed there (:class:`Admission`).
"""

from __future__ import annotations

import dataclasses
import struct

from headrace import errors
from headrace.wal.brokers.stamps import FOREIGN, Kind, Stamp
from headrace.wal.kafka.message_id import KafkaMessageID

HEADER_NAME = "headrace"
_VERSION = 1
_DATA = struct.Struct(">BBQQ")
_FENCE = struct.Struct(">BBQQq")
_CHAINED_CODE = 3
_CODES = {Kind.DATA: 1, Kind.FENCE: 2}
KafkaStamp = Stamp[KafkaMessageID]
HeaderValue = str | bytes | None
Headers = dict[str, HeaderValue] | list[tuple[str, HeaderValue]]


def header(stamp: KafkaStamp) -> Headers:
    """The record headers that carry ``stamp``."""
    return [(HEADER_NAME, encode(stamp))]


def encode(stamp: KafkaStamp) -> bytes:
    code = _CODES[stamp.kind]
    if stamp.kind is Kind.FENCE:
        prev = -1 if stamp.prev is None else stamp.prev.offset
        return _FENCE.pack(_VERSION, code, stamp.term, stamp.nonce, prev)
    return _DATA.pack(_VERSION, code, stamp.term, stamp.nonce)


def chained_header(stamp: KafkaStamp, at: int) -> Headers:
    """The headers of a chained data record with ``stamp`` that must land at offset ``at``."""
    return [(HEADER_NAME, _FENCE.pack(_VERSION, _CHAINED_CODE, stamp.term, stamp.nonce, at))]


@dataclasses.dataclass(frozen=True, slots=True)
class Placed:
    """A record's stamp, and for a chained data record the offset it must land at."""

    stamp: KafkaStamp
    at: int | None = None


def decode(value: bytes | None) -> KafkaStamp:
    """Parse a stamp; a missing header reads as :data:`FOREIGN`."""
    return decode_placed(value).stamp


def decode_placed(value: bytes | None) -> Placed:
    """Parse a stamp and, for a chained record, its offset; no header is :data:`FOREIGN`."""
    if value is None:
        return Placed(FOREIGN)
    if len(value) == _FENCE.size and value[0] == _VERSION and value[1] == _CHAINED_CODE:
        _, _, term, nonce, at = _FENCE.unpack(value)
        if at < 0:
            raise errors.CorruptData(f"malformed headrace record header (offset {at})")
        return Placed(Stamp(Kind.DATA, term, nonce), at)
    return Placed(_decode_stamp(value))


def _decode_stamp(value: bytes) -> KafkaStamp:
    if len(value) == _DATA.size and value[0] == _VERSION and value[1] == _CODES[Kind.DATA]:
        _, _, term, nonce = _DATA.unpack(value)
        return Stamp(Kind.DATA, term, nonce)
    if len(value) == _FENCE.size and value[0] == _VERSION and value[1] == _CODES[Kind.FENCE]:
        _, _, term, nonce, prev = _FENCE.unpack(value)
        if prev < -1:
            raise errors.CorruptData(f"malformed headrace record header (offset {prev})")
        return Stamp(Kind.FENCE, term, nonce, None if prev == -1 else KafkaMessageID(prev))
    raise errors.CorruptData(f"malformed headrace record header ({len(value)} bytes)")


def stamp_of(headers: Headers | None) -> KafkaStamp:
    """The stamp among a record's headers (as confluent-kafka returns them)."""
    return placed_of(headers).stamp


def placed_of(headers: Headers | None) -> Placed:
    """The stamp (and chained offset) among a record's headers."""
    items = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in items:
        if name == HEADER_NAME:
            return decode_placed(value.encode() if isinstance(value, str) else value)
    return Placed(FOREIGN)


@dataclasses.dataclass(frozen=True, slots=True)
class Admission:
    """Which records of a topic count, read in offset order (pure; a new value per record).

    ``owner`` is the stamp of the last fence record read (the highest term
    wins; of one term, the later record): after it, only its writer's data
    count. So a record is skipped when

    * it is chained and did not land at the offset it names: something (a
      newer writer's fence record, or a record of this writer that was itself
      skipped) came between it and its writer's previous record, and its
      writer never acknowledged it (:mod:`headrace.wal.kafka.chain`), or
    * it is data of a lower term than ``owner``, or of ``owner``'s term by
      another writer: written by a writer the fence record fenced.

    Records without a header (another producer's) always count. A source
    that starts after the last fence record holds no ``owner`` yet; the
    chained rule alone keeps a fenced writer's late records out there. That
    holds because a chained producer leaves no gap: a record after a missing
    one would land one offset early, exactly where it names if a newer fence
    record filled the hole.
    """

    owner: KafkaStamp | None = None

    def after(self, offset: int, placed: Placed) -> tuple[Admission, bool]:
        """The admission after the record at ``offset``, and whether that record counts."""
        stamp = placed.stamp
        if stamp.kind is Kind.FENCE:
            owner = self.owner
            if owner is None or stamp.term >= owner.term:
                return Admission(stamp), True
            return self, False
        if stamp is FOREIGN:
            return self, True
        if placed.at is not None and placed.at != offset:
            return self, False
        owner = self.owner
        if owner is not None and (
            stamp.term < owner.term or (stamp.term == owner.term and stamp.nonce != owner.nonce)
        ):
            return self, False
        return self, True

"""How a Kafka record carries its term stamp (:mod:`headrace.wal.brokers.stamps`; pure).

Each record has one header ``headrace`` with a fixed binary stamp::

    0  1  format version (1)
    1  1  kind: 1 data, 2 fence record
    2  8  term of the writer (u64, big endian)
    10 8  writer nonce (u64): tells two writers of the same term apart
    18 8  fence records only: offset of the last data record before it, or -1

A writer that takes the pchannel (``init_transactions`` fences the producer
epoch) writes one fence record with its term; the decisions on stamps are the
toolkit's (:func:`headrace.wal.brokers.stamps.fence_check`).
"""

from __future__ import annotations

import struct

from headrace import errors
from headrace.wal.brokers.stamps import FOREIGN, Kind, Stamp
from headrace.wal.kafka.message_id import KafkaMessageID

HEADER_NAME = "headrace"
_VERSION = 1
_DATA = struct.Struct(">BBQQ")
_FENCE = struct.Struct(">BBQQq")
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


def decode(value: bytes | None) -> KafkaStamp:
    """Parse a stamp; a missing header reads as :data:`FOREIGN`."""
    if value is None:
        return FOREIGN
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
    items = headers.items() if isinstance(headers, dict) else headers or ()
    for name, value in items:
        if name == HEADER_NAME:
            return decode(value.encode() if isinstance(value, str) else value)
    return FOREIGN

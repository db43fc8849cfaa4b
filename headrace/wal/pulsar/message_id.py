"""Message ids of the Pulsar backend: (ledger, entry, partition, batch index).

Ids order by (ledger, entry, batch index) within a topic. The backend's
producer does not batch, so its ids have batch index -1 and partition -1
(non-partitioned topic); the printable form then is ``pulsar:<ledger>:<entry>``,
otherwise ``pulsar:<ledger>:<entry>:<partition>:<batch>``.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Self

from headrace import errors
from headrace.message import ids

_PACK = struct.Struct(">qqii")
_I64 = 1 << 63
_I32 = 1 << 31


def _check(name: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < high:
        raise errors.InvalidArgument(f"pulsar message id {name} out of range: {value!r}")
    return value


@ids.register
class PulsarMessageID(ids.MessageID):
    """Position of a message in a Pulsar topic."""

    backend: ClassVar[str] = "pulsar"
    # ``batch`` is Pulsar's own batch index: the position of a message in a
    # batch the Pulsar *client* built (client-side batching, which this
    # backend's producer turns off, so it is -1). It belongs to the stored
    # record's id. It is not ``MessageID.index`` (inherited), the position of
    # a Headrace message in the record batch Headrace stores as one Pulsar
    # message: ``pulsar:12:0/3`` is the 4th message of the record at ledger
    # 12, entry 0 (batch -1).
    __slots__ = ("batch", "entry", "ledger", "partition")

    def __init__(self, ledger: int, entry: int, partition: int = -1, batch: int = -1) -> None:
        self.ledger = _check("ledger", ledger, 0, _I64)
        self.entry = _check("entry", entry, 0, _I64)
        self.partition = _check("partition", partition, -1, _I32)
        self.batch = _check("batch index", batch, -1, _I32)

    def sort_key(self) -> tuple[int, ...]:
        return (self.ledger, self.entry, self.batch)

    def to_bytes(self) -> bytes:
        return _PACK.pack(self.ledger, self.entry, self.partition, self.batch)

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        if len(data) != _PACK.size:
            raise errors.InvalidArgument(
                f"pulsar message id must be {_PACK.size} bytes, got {len(data)}"
            )
        return cls(*_PACK.unpack(data))

    def preceding(self, count: int) -> PulsarMessageID | None:
        """Within this id's ledger only (ledger ids are not consecutive): the
        ledger's first entry when ``count`` reaches back past it."""
        if self.entry == 0:
            return None
        return PulsarMessageID(self.ledger, max(0, self.entry - count), self.partition)

    def value_str(self) -> str:
        if self.partition == -1 and self.batch == -1:
            return f"{self.ledger}:{self.entry}"
        return f"{self.ledger}:{self.entry}:{self.partition}:{self.batch}"

    @classmethod
    def parse_value(cls, text: str) -> Self:
        parts = text.split(":")
        if len(parts) not in (2, 4) or not all(_is_int(p) for p in parts):
            raise errors.InvalidArgument(
                f"malformed pulsar message id value {text!r}: expected 'ledger:entry' or "
                "'ledger:entry:partition:batch', e.g. 'pulsar:12:0'"
            )
        return cls(*(int(p) for p in parts))


def _is_int(text: str) -> bool:
    digits = text.removeprefix("-")
    return digits.isascii() and digits.isdigit()

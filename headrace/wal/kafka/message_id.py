"""Message ids of the Kafka backend: the record's offset in partition 0.

Offsets of one pchannel's topic increase but are not dense: transaction
markers and the backend's own fence records occupy offsets that readers never
see, so "at id" means the first record whose offset is at least the id.
"""

from __future__ import annotations

import struct
from typing import ClassVar, Self

from headrace import errors
from headrace.message import ids

_I64 = struct.Struct(">q")


@ids.register
class KafkaMessageID(ids.MessageID):
    """Offset of a record in partition 0 of its pchannel's topic."""

    backend: ClassVar[str] = "kafka"
    __slots__ = ("offset",)

    def __init__(self, offset: int) -> None:
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < 1 << 63:
            raise errors.InvalidArgument(f"kafka message id out of range: {offset!r}")
        self.offset = offset

    def sort_key(self) -> tuple[int, ...]:
        return (self.offset,)

    def to_bytes(self) -> bytes:
        return _I64.pack(self.offset)

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        if len(data) != _I64.size:
            raise errors.InvalidArgument(
                f"kafka message id must be {_I64.size} bytes, got {len(data)}"
            )
        return cls(_I64.unpack(data)[0])

    def preceding(self, count: int) -> KafkaMessageID | None:
        return KafkaMessageID(self.offset - count) if self.offset >= count else None

    def value_str(self) -> str:
        return str(self.offset)

    @classmethod
    def parse_value(cls, text: str) -> Self:
        if not text.isascii() or not text.isdigit():
            raise errors.InvalidArgument(
                f"malformed kafka message id value {text!r}: expected a decimal offset, "
                "e.g. 'kafka:42'"
            )
        return cls(int(text))

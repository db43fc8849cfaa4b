"""Message ids of the in-memory backend: a per-pchannel sequence number."""

from __future__ import annotations

import struct
from typing import ClassVar, Self

from headrace import errors
from headrace.message import ids

_U64 = struct.Struct(">Q")


@ids.register
class MemoryMessageID(ids.MessageID):
    """Sequence number of a record in its pchannel, starting at 0."""

    backend: ClassVar[str] = "memory"
    __slots__ = ("seq",)

    def __init__(self, seq: int) -> None:
        if not 0 <= seq < 1 << 64:
            raise errors.InvalidArgument(f"memory message id out of range: {seq}")
        self.seq = seq

    def sort_key(self) -> tuple[int, ...]:
        return (self.seq,)

    def to_bytes(self) -> bytes:
        return _U64.pack(self.seq)

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        if len(data) != _U64.size:
            raise errors.InvalidArgument(
                f"memory message id must be {_U64.size} bytes, got {len(data)}"
            )
        return cls(_U64.unpack(data)[0])

    def preceding(self, count: int) -> MemoryMessageID | None:
        return MemoryMessageID(self.seq - count) if self.seq >= count else None

    def value_str(self) -> str:
        return str(self.seq)

    @classmethod
    def parse_value(cls, text: str) -> Self:
        if not text.isascii() or not text.isdigit():
            raise errors.InvalidArgument(
                f"malformed memory message id value {text!r}: expected a decimal sequence number"
            )
        return cls(int(text))

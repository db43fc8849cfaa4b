"""Message ids of the local file backend: the log sequence number (LSN)."""

from __future__ import annotations

import struct
from typing import ClassVar, Self

from headrace import errors
from headrace.message import ids

_U64 = struct.Struct(">Q")


@ids.register
class LocalMessageID(ids.MessageID):
    """Log sequence number: +1 per record across segments and terms, from 0."""

    backend: ClassVar[str] = "local"
    __slots__ = ("lsn",)

    def __init__(self, lsn: int) -> None:
        if not 0 <= lsn < 1 << 64:
            raise errors.InvalidArgument(f"local message id out of range: {lsn}")
        self.lsn = lsn

    def sort_key(self) -> tuple[int, ...]:
        return (self.lsn,)

    def to_bytes(self) -> bytes:
        return _U64.pack(self.lsn)

    @classmethod
    def from_bytes(cls, data: bytes) -> Self:
        if len(data) != _U64.size:
            raise errors.InvalidArgument(
                f"local message id must be {_U64.size} bytes, got {len(data)}"
            )
        return cls(_U64.unpack(data)[0])

    def preceding(self, count: int) -> LocalMessageID | None:
        return LocalMessageID(self.lsn - count) if self.lsn >= count else None

    def value_str(self) -> str:
        return str(self.lsn)

    @classmethod
    def parse_value(cls, text: str) -> Self:
        if not text.isascii() or not text.isdigit():
            raise errors.InvalidArgument(
                f"malformed local message id value {text!r}: expected a decimal LSN"
            )
        return cls(int(text))

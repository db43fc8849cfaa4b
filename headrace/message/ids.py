"""Message IDs: a backend's position of a message in a pchannel.

Each backend has its own ID class (an offset, a sequence number, a ledger and
entry pair, ...). IDs of one backend are totally ordered within a pchannel,
serialise to bytes and to a printable ``<backend>:<value>`` string, and parse
back. Backends register their class here on import.
"""

from __future__ import annotations

import abc
import functools
from typing import Any, ClassVar, Self

from headrace import errors


@functools.total_ordering
class MessageID(abc.ABC):
    """Position of a message inside one pchannel of one backend."""

    backend: ClassVar[str]

    @abc.abstractmethod
    def sort_key(self) -> tuple[int, ...]:
        """Total order within a pchannel."""

    @abc.abstractmethod
    def to_bytes(self) -> bytes:
        """Compact binary form (without the backend name)."""

    @classmethod
    @abc.abstractmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Inverse of :meth:`to_bytes`; raises InvalidArgument on bad input."""

    @abc.abstractmethod
    def value_str(self) -> str:
        """Printable value (without the backend name)."""

    @classmethod
    @abc.abstractmethod
    def parse_value(cls, text: str) -> Self:
        """Inverse of :meth:`value_str`; raises InvalidArgument on bad input."""

    def preceding(self, count: int) -> MessageID | None:
        """An id at most ``count`` records before this one (a bounded start for
        reading the last records of a pchannel); None when the backend cannot
        tell, or this id is fewer than ``count`` records from the start of its
        id space (then read from the earliest record). Optional; None by default."""
        return None

    def __str__(self) -> str:
        return f"{self.backend}:{self.value_str()}"

    def __repr__(self) -> str:
        return f"MessageID({self})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageID):
            return NotImplemented
        return self.backend == other.backend and self.sort_key() == other.sort_key()

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, MessageID):
            return NotImplemented
        if self.backend != other.backend:
            raise errors.InvalidArgument(
                f"cannot compare message ids of backends {self.backend} and {other.backend}"
            )
        return self.sort_key() < other.sort_key()

    def __hash__(self) -> int:
        return hash((self.backend, self.sort_key()))


_REGISTRY: dict[str, type[MessageID]] = {}


def register(cls: type[MessageID]) -> type[MessageID]:
    """Class decorator: make ``cls`` parseable by :func:`parse`."""
    _REGISTRY[cls.backend] = cls
    return cls


def id_class(backend: str) -> type[MessageID]:
    try:
        return _REGISTRY[backend]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise errors.InvalidArgument(
            f"unknown message id backend {errors.quoted(backend)} (known: {known})"
        ) from None


def parse(text: str) -> MessageID:
    """Parse the printable form ``<backend>:<value>``."""
    backend, sep, value = text.partition(":")
    if not sep:
        raise errors.InvalidArgument(
            f"malformed message id {errors.quoted(text)}: "
            "expected '<backend>:<value>', e.g. 'local:42'"
        )
    return id_class(backend).parse_value(value)


def to_wire(mid: MessageID) -> bytes:
    """Self-describing binary form: backend name, NUL, value bytes."""
    return mid.backend.encode() + b"\0" + mid.to_bytes()


def from_wire(data: bytes) -> MessageID:
    backend, sep, value = data.partition(b"\0")
    if not sep:
        raise errors.InvalidArgument("malformed binary message id: no backend name")
    return id_class(backend.decode("ascii", "replace")).from_bytes(value)

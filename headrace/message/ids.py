"""Message IDs: a backend's position of a message in a pchannel.

Each backend has its own ID class (an offset, a sequence number, a ledger and
entry pair, ...). IDs of one backend are totally ordered within a pchannel,
serialise to bytes and to a printable ``<backend>:<value>`` string, and parse
back. Backends register their class here on import.

Batch index
-----------
A stored backend record may hold a batch of N messages (message format 2).
The ids of those messages are the record's id plus an ``index`` 0..N-1 inside
the batch, like Kafka's base offset plus offset delta or Pulsar's batch index.
Every id class gets the index from :class:`MessageID`, generically:

- ``index`` is 0 for a record's id (and for every message of format 1, one
  message per record); :meth:`MessageID.with_index` makes a copy with another
  index, :meth:`MessageID.indexed` the ids of a whole batch at once, and
  :meth:`MessageID.record_id` goes back to the stored record's id.
- Backends stay batch-agnostic: they store opaque records and only ever see,
  make and are given record ids (index 0). Mapping a start position with an
  index to "that record, skipping the messages below the index" is the
  framework scanner's job.
- Ids order, compare and hash by ``(sort_key(), index)``, so record 42 sorts
  before ``42/1``, which sorts before ``42/2``, and all before record 43.
- Printed form: ``<backend>:<value>`` for index 0 (what ids printed before
  the index existed look like, so they parse the same), otherwise
  ``<backend>:<value>/<index>``, e.g. ``local:42/3``. No backend's value
  contains ``/``.
- Wire form (:func:`to_wire`): backend name, NUL, value bytes for index 0
  (byte-for-byte the form written before the index existed); otherwise
  backend name, byte 0x01, the index as 4 bytes big-endian, value bytes.
  Backend names are ASCII letters and digits, so the first 0x00 or 0x01
  byte is the separator.
- Counts of :meth:`MessageID.preceding` are in records, not messages.
"""

from __future__ import annotations

import abc
import functools
import itertools
import re
import struct
from collections.abc import Callable
from typing import Any, ClassVar, Self

from headrace import errors, slots

INDEX_LIMIT = 1 << 32
"""Indexes are below this (they travel as 4 bytes on the wire)."""

_INDEX = struct.Struct(">I")
_PLAIN = b"\0"
_INDEXED = b"\1"
_SEPARATOR = re.compile(b"[\0\1]")
_new = object.__new__
_repeat = itertools.repeat


def _check_index(index: int) -> int:
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < INDEX_LIMIT:
        raise errors.InvalidArgument(
            f"message id index out of range: {index!r} (expected 0 <= index < 2**32)"
        )
    return index


@functools.total_ordering
class MessageID(abc.ABC):
    """Position of a message inside one pchannel of one backend."""

    backend: ClassVar[str]
    _fields: ClassVar[tuple[str, ...]] = ()
    _setters: ClassVar[tuple[Callable[[Any, Any], None], ...]] = ()
    """The slot descriptors' setters of ``_fields``, in the same order."""

    index: int = 0
    """Position of the message in its stored record's batch. A class default
    of 0, set on an instance only when non-zero (by :meth:`with_index` and
    :meth:`indexed`), so making a record id costs what it did before the
    index existed."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Id classes keep their fields in ``__slots__``: :meth:`with_index`
        copies exactly those (the index itself is not a slot)."""
        super().__init_subclass__(**kwargs)
        if "__slots__" not in cls.__dict__:
            raise TypeError(f"message id class {cls.__name__} must declare __slots__")
        cls._fields = slots.slot_names(cls)
        cls._setters = slots.setters(cls, cls._fields)

    @abc.abstractmethod
    def sort_key(self) -> tuple[int, ...]:
        """Total order of records within a pchannel (the index orders messages
        within one record, after this key)."""

    @abc.abstractmethod
    def to_bytes(self) -> bytes:
        """Compact binary form of the record id (without the backend name and
        without the index: :func:`to_wire` adds both)."""

    @classmethod
    @abc.abstractmethod
    def from_bytes(cls, data: bytes) -> Self:
        """Inverse of :meth:`to_bytes`; raises InvalidArgument on bad input."""

    @abc.abstractmethod
    def value_str(self) -> str:
        """Printable value of the record id (without the backend name and the
        index); must not contain '/'."""

    @classmethod
    @abc.abstractmethod
    def parse_value(cls, text: str) -> Self:
        """Inverse of :meth:`value_str`; raises InvalidArgument on bad input."""

    def preceding(self, count: int) -> MessageID | None:
        """A record id at most ``count`` records before this id's record (a
        bounded start for reading the last records of a pchannel); None when
        the backend cannot tell, or this id is fewer than ``count`` records
        from the start of its id space (then read from the earliest record).
        Counts are in records, not messages: an id with an index gets the
        answer of its :meth:`record_id`. Optional; None by default."""
        return None

    def with_index(self, index: int) -> Self:
        """This id's record with the message at ``index`` of its batch."""
        if index == self.index:
            return self
        _check_index(index)
        clone = _new(type(self))
        for name, set_slot in zip(self._fields, self._setters, strict=True):
            set_slot(clone, object.__getattribute__(self, name))
        if index:
            clone.index = index
        return clone

    def indexed(self, count: int) -> list[Self]:
        """The ids of messages 0 to ``count - 1`` of this id's record, in order
        (``[self.record_id(), self.record_id().with_index(1), ...]``), built
        column by column: the record's fields are read once and each copy gets
        them through the slot setters, so the cost per id is a few C calls."""
        if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count <= INDEX_LIMIT:
            raise errors.InvalidArgument(
                f"message id count out of range: {count!r} (expected 0 <= count <= 2**32)"
            )
        if count == 0:
            return []
        record = self.record_id()
        rest = count - 1
        clones: list[Self] = list(map(_new, _repeat(type(self), rest)))
        for name, set_slot in zip(self._fields, self._setters, strict=True):
            slots.drain(map(set_slot, clones, _repeat(object.__getattribute__(record, name), rest)))
        slots.drain(map(setattr, clones, _repeat("index", rest), range(1, count)))
        return [record, *clones]

    def record_id(self) -> Self:
        """The id of the stored record holding this message (index 0)."""
        return self.with_index(0)

    def __str__(self) -> str:
        if self.index:
            return f"{self.backend}:{self.value_str()}/{self.index}"
        return f"{self.backend}:{self.value_str()}"

    def __repr__(self) -> str:
        return f"MessageID({self})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageID):
            return NotImplemented
        return (
            self.backend == other.backend
            and self.index == other.index
            and self.sort_key() == other.sort_key()
        )

    def __lt__(self, other: Any) -> bool:
        if not isinstance(other, MessageID):
            return NotImplemented
        if self.backend != other.backend:
            raise errors.InvalidArgument(
                f"cannot compare message ids of backends {self.backend} and {other.backend}"
            )
        mine, theirs = self.sort_key(), other.sort_key()
        if mine != theirs:
            return mine < theirs
        return self.index < other.index

    def __hash__(self) -> int:
        return hash((self.backend, self.sort_key(), self.index))


_REGISTRY: dict[str, type[MessageID]] = {}


def register(cls: type[MessageID]) -> type[MessageID]:
    """Class decorator: make ``cls`` parseable by :func:`parse`."""
    _REGISTRY[cls.backend] = cls
    return cls


def registered() -> tuple[type[MessageID], ...]:
    """The id classes registered so far (one per imported backend)."""
    return tuple(_REGISTRY.values())


def id_class(backend: str) -> type[MessageID]:
    try:
        return _REGISTRY[backend]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise errors.InvalidArgument(
            f"unknown message id backend {errors.quoted(backend)} (known: {known})"
        ) from None


def parse(text: str) -> MessageID:
    """Parse the printable form ``<backend>:<value>`` or ``<backend>:<value>/<index>``."""
    backend, sep, rest = text.partition(":")
    if not sep:
        raise errors.InvalidArgument(
            f"malformed message id {errors.quoted(text)}: "
            "expected '<backend>:<value>', e.g. 'local:42', or "
            "'<backend>:<value>/<index>', e.g. 'local:42/3'"
        )
    cls = id_class(backend)
    value, slash, index = rest.partition("/")
    if not slash:
        return cls.parse_value(value)
    return cls.parse_value(value).with_index(_parse_index(text, index))


def _parse_index(text: str, index: str) -> int:
    if not index.isascii() or not index.isdigit():
        raise errors.InvalidArgument(
            f"malformed message id {errors.quoted(text)}: the index after '/' must be "
            "a decimal number from 0 to 2**32-1, e.g. 'local:42/3'"
        )
    number = int(index)
    if number >= INDEX_LIMIT:
        raise errors.InvalidArgument(
            f"malformed message id {errors.quoted(text)}: index {number} is not below 2**32"
        )
    return number


def to_wire(mid: MessageID) -> bytes:
    """Self-describing binary form: backend name, NUL, value bytes for index 0;
    backend name, 0x01, 4-byte big-endian index, value bytes otherwise."""
    if mid.index:
        return mid.backend.encode() + _INDEXED + _INDEX.pack(mid.index) + mid.to_bytes()
    return mid.backend.encode() + _PLAIN + mid.to_bytes()


def from_wire(data: bytes) -> MessageID:
    """Inverse of :func:`to_wire` (both forms); raises InvalidArgument on bad input."""
    found = _SEPARATOR.search(data)
    if found is None:
        raise errors.InvalidArgument("malformed binary message id: no backend name")
    at = found.start()
    cls = id_class(data[:at].decode("ascii", "replace"))
    if data[at : at + 1] == _PLAIN:
        return cls.from_bytes(data[at + 1 :])
    body = data[at + 1 :]
    if len(body) < _INDEX.size:
        raise errors.InvalidArgument(
            f"malformed binary message id: truncated index ({len(body)} of "
            f"{_INDEX.size} bytes after the backend name {cls.backend!r})"
        )
    (index,) = _INDEX.unpack_from(body)
    return cls.from_bytes(body[_INDEX.size :]).with_index(index)

"""Message types and the in-memory message model."""

from __future__ import annotations

import dataclasses
import enum
import operator
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import NamedTuple

from headrace import errors, slots
from headrace.message.ids import MessageID

DEFAULT_MAX_MESSAGE_BYTES = 8 * 1024 * 1024
"""Default upper bound of one encoded message (envelope included)."""

VCHANNEL_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,254}$")
"""Vchannel names: 1-255 of ``[A-Za-z0-9_.-]``, starting alphanumeric."""


class MessageType(enum.IntEnum):
    """Wire codes of message types; never renumber, only append."""

    TIME_TICK = 1
    INSERT = 2
    DELETE = 3
    CREATE_COLLECTION = 4
    DROP_COLLECTION = 5
    CREATE_PARTITION = 6
    DROP_PARTITION = 7
    FLUSH = 8
    BEGIN_TXN = 9
    COMMIT_TXN = 10
    ROLLBACK_TXN = 11
    FENCE = 12
    """Written first by a new owner of a pchannel under its new term."""

    @property
    def is_ddl(self) -> bool:
        return self in _DDL

    @property
    def is_system(self) -> bool:
        """Written by the WAL itself, never accepted from a producer."""
        return self in (MessageType.TIME_TICK, MessageType.FENCE)

    @classmethod
    def parse(cls, value: int | str) -> MessageType:
        """Parse a wire code or a case-insensitive name, with a clear error."""
        if isinstance(value, str):
            try:
                return cls[value.strip().upper()]
            except KeyError:
                names = ", ".join(m.name for m in cls)
                raise errors.InvalidArgument(
                    f"unknown message type {errors.quoted(value)}; known: {names}"
                ) from None
        try:
            return cls(value)
        except ValueError:
            raise errors.InvalidArgument(f"unknown message type code {value}") from None


_DDL = frozenset(
    {
        MessageType.CREATE_COLLECTION,
        MessageType.DROP_COLLECTION,
        MessageType.CREATE_PARTITION,
        MessageType.DROP_PARTITION,
    }
)

_EMPTY: Mapping[str, str] = MappingProxyType({})


def _no_properties() -> Mapping[str, str]:
    return _EMPTY


def validate_vchannel(vchannel: object) -> str:
    """Return ``vchannel`` if it is a well-formed name, else raise InvalidArgument."""
    if not isinstance(vchannel, str):
        raise errors.InvalidArgument(
            f"vchannel must be a str, got a {type(vchannel).__name__}: {errors.quoted(vchannel)}"
        )
    if not VCHANNEL_PATTERN.match(vchannel):
        raise errors.InvalidArgument(
            f"invalid vchannel {errors.quoted(vchannel)}: use 1-255 characters of [A-Za-z0-9_.-], "
            "starting with a letter or digit"
        )
    return vchannel


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class Message:
    """One log message.

    ``timetick`` and ``term`` are 0 until the WAL assigns them on append.
    ``vchannel`` is empty for messages that belong to the whole pchannel
    (time ticks, fences): those are delivered to every reader.
    ``txn_id`` is 0 outside a transaction.
    """

    type: MessageType
    vchannel: str = ""
    payload: bytes = b""
    properties: Mapping[str, str] = dataclasses.field(default_factory=_no_properties)
    timetick: int = 0
    term: int = 0
    txn_id: int = 0

    def __init__(  # noqa: PLR0917 - the dataclass's own positional signature
        self,
        type: MessageType,
        vchannel: str = "",
        payload: bytes = b"",
        properties: Mapping[str, str] = _EMPTY,
        timetick: int = 0,
        term: int = 0,
        txn_id: int = 0,
    ) -> None:
        # The generated __init__ of a frozen dataclass sets each field with
        # object.__setattr__ by name; the slot descriptors' setters do the same
        # in half the time (messages are built per record on every scan).
        _SET_TYPE(self, type)
        _SET_VCHANNEL(self, vchannel)
        _SET_PAYLOAD(self, payload)
        _SET_PROPERTIES(self, properties)
        _SET_TIMETICK(self, timetick)
        _SET_TERM(self, term)
        _SET_TXN_ID(self, txn_id)

    def with_stamp(self, timetick: int, term: int) -> Message:
        """The same message with the WAL's timetick and term."""
        return dataclasses.replace(self, timetick=timetick, term=term)


MESSAGE_SLOT_SETTERS = slots.setters(
    Message, ("type", "vchannel", "payload", "properties", "timetick", "term", "txn_id")
)
"""Setters of a Message's fields in declaration order, for code that builds
messages in bulk (on ``object.__new__(Message)``; every field must be set)."""
(
    _SET_TYPE,
    _SET_VCHANNEL,
    _SET_PAYLOAD,
    _SET_PROPERTIES,
    _SET_TIMETICK,
    _SET_TERM,
    _SET_TXN_ID,
) = MESSAGE_SLOT_SETTERS
EMPTY_PROPERTIES: Mapping[str, str] = _EMPTY
"""The shared, immutable empty properties mapping (the field's default)."""

# A message's fields as functions, for checks and columns over many messages
# (``map(vchannel_of, messages)``) without a Python loop.
type_of = operator.attrgetter("type")
vchannel_of = operator.attrgetter("vchannel")
payload_of = operator.attrgetter("payload")
properties_of = operator.attrgetter("properties")
txn_id_of = operator.attrgetter("txn_id")


class LogEntry(NamedTuple):
    """A message as stored in a WAL, with the backend's position for it."""

    id: MessageID
    message: Message

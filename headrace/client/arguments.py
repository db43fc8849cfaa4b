"""Checks of what callers pass to the public client API.

Each check returns the value in the form the client uses, or raises
:class:`headrace.errors.InvalidArgument` naming the argument and what is
expected, so a wrong type fails at the call, not as an ``AttributeError``
deep in a background task. Long values are shortened in messages.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from typing import Literal, TypeVar

from headrace import errors
from headrace.message.ids import MessageID
from headrace.message.types import (
    Message,
    MessageType,
    payload_of,
    properties_of,
    txn_id_of,
    type_of,
    validate_vchannel,
    vchannel_of,
)

T = TypeVar("T")

Start = Literal["earliest", "latest"] | MessageID


def _got(value: object) -> str:
    """What an error says it was given: the type and the (shortened) value."""
    return f"got a {_type_name(value)}: {errors.quoted(value)}"


def _type_name(value: object) -> str:
    return type(value).__name__


def instance(value: object, cls: type[T], what: str) -> T:
    """``value`` if it is a ``cls``."""
    if not isinstance(value, cls):
        raise errors.InvalidArgument(f"{what} must be a {cls.__name__}, {_got(value)}")
    return value


def vchannel(value: object) -> str:
    """A well-formed vchannel name."""
    return validate_vchannel(value)


def pchannel(value: object) -> str:
    if not isinstance(value, str) or not value:
        raise errors.InvalidArgument(f"pchannel must be a non-empty str, {_got(value)}")
    return value


def payload(value: object) -> bytes:
    """The payload as bytes (bytes, bytearray or memoryview are accepted)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    hint = "; encode text first, e.g. text.encode()" if isinstance(value, str) else ""
    raise errors.InvalidArgument(f"payload must be bytes, {_got(value)}{hint}")


def _any_message_type(value: object, what: str) -> MessageType:
    """A MessageType, its wire code or its name."""
    if isinstance(value, MessageType):
        return value
    if isinstance(value, int | str) and not isinstance(value, bool):
        return MessageType.parse(value)
    raise errors.InvalidArgument(f"{what} must be a MessageType, {_got(value)}")


def message_type(value: object) -> MessageType:
    """A type a producer may write (a MessageType, its code or its name)."""
    mtype = _any_message_type(value, "type")
    if mtype.is_system:
        raise errors.InvalidArgument(f"{mtype.name} messages are written by the WAL itself")
    return mtype


def message_types(value: object) -> frozenset[MessageType]:
    """The types a consumer asks for: a collection of MessageType (or codes, names)."""
    if isinstance(value, str | bytes) or not isinstance(value, Collection):
        raise errors.InvalidArgument(f"types must be a collection of MessageType, {_got(value)}")
    return frozenset(_any_message_type(item, "each of types") for item in value)


def properties(value: object) -> Mapping[str, str]:
    """A mapping of str to str (None: no properties)."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise errors.InvalidArgument(f"properties must be a mapping of str to str, {_got(value)}")
    for key, item in value.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise errors.InvalidArgument(
                f"properties must map str to str, got {errors.quoted(key)}: {errors.quoted(item)}"
            )
    return value


def txn_id(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise errors.InvalidArgument(f"txn_id must be a non-negative int, {_got(value)}")
    return value


_GOOD_VCHANNELS: set[str] = set()
"""Vchannel names that passed :func:`vchannel` (a producer repeats a few)."""
_GOOD_VCHANNELS_MAX = 4096
_SENDABLE_TYPES = frozenset(t for t in MessageType if not t.is_system)


def message(value: object) -> Message:
    """A Message a producer may send, its fields checked as for ``send``."""
    if (
        value.__class__ is Message
        and value.vchannel in _GOOD_VCHANNELS
        and value.payload.__class__ is bytes
        and value.type.__class__ is MessageType
        and value.type in _SENDABLE_TYPES
        and not value.properties
        and value.txn_id.__class__ is int
        and value.txn_id >= 0
    ):
        # The common message, as :func:`_message` would find it.
        return value
    return _message(value)


def common(values: list[Message]) -> bool:
    """Whether :func:`message` passes every one of ``values`` as it is, checked
    per call rather than per message (each distinct type, txn id and
    vchannel once); False means: check them one by one."""
    if set(map(type, values)) != {Message}:
        return False
    return (
        _GOOD_VCHANNELS.issuperset(map(vchannel_of, values))
        and set(map(type, map(payload_of, values))) == {bytes}
        and not any(map(properties_of, values))
        and all(
            t.__class__ is MessageType and t in _SENDABLE_TYPES for t in set(map(type_of, values))
        )
        and all(t.__class__ is int and t >= 0 for t in set(map(txn_id_of, values)))
    )


def _message(value: object) -> Message:
    msg = instance(value, Message, "each message")
    vchannel(msg.vchannel)
    data = payload(msg.payload)
    mtype = message_type(msg.type)
    props = properties(msg.properties)
    txn_id(msg.txn_id)
    if len(_GOOD_VCHANNELS) >= _GOOD_VCHANNELS_MAX:
        _GOOD_VCHANNELS.clear()
    _GOOD_VCHANNELS.add(msg.vchannel)
    if data is msg.payload and mtype is msg.type and props is msg.properties:
        return msg
    return Message(mtype, msg.vchannel, data, props, txn_id=msg.txn_id)


def messages(value: Iterable[Message]) -> list[Message]:
    """The items of an iterable of messages; each is checked when it is sent,
    as the type says nothing at run time."""
    if isinstance(value, Message | str | bytes) or not isinstance(value, Iterable):
        raise errors.InvalidArgument(f"messages must be an iterable of Message, {_got(value)}")
    return list(value)


def start(value: object) -> Start:
    """Where a consumer starts: "earliest", "latest" or a MessageID."""
    if isinstance(value, MessageID):
        return value
    if value == "earliest":
        return "earliest"
    if value == "latest":
        return "latest"
    raise errors.InvalidArgument(
        f"start must be 'earliest', 'latest' or a message id, got {errors.quoted(value)}"
    )


def timeout(value: object) -> float | None:
    """A number of seconds, not negative, or None for no limit."""
    if value is None:
        return None
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or math.isnan(value)
        or value < 0
    ):
        raise errors.InvalidArgument(
            f"timeout must be a non-negative number of seconds or None, got {errors.quoted(value)}"
        )
    return float(value)


def count(value: object, what: str) -> int | None:
    """A non-negative int, or None for no limit."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise errors.InvalidArgument(f"{what} must be a non-negative int or None, {_got(value)}")
    return value

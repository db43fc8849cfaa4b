"""Validation of a producer's message, and its fast path, in one place.

:func:`validate` is the rule: what a producer may append (a known, non-system
type; a well-formed vchannel; bytes; a txn id in range; string properties;
an encoded size within the limit), with a clear error naming what is wrong.
:meth:`Validator.check` gives the same answer faster for the common message:
outside transactions and DDL, on a vchannel that passed :func:`validate`
before (well formed, hence ASCII), with no properties or only short ASCII
ones (a producer's dedup key), whose size it computes without encoding. For
anything else it asks :func:`validate`. The two agree on every input, accepted
or refused, and on the error (``tests/wal/test_validation.py`` checks it
property-based).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from headrace import errors
from headrace.message import codec
from headrace.message.types import Message, MessageType, validate_vchannel
from headrace.wal.interceptors.txn import TXN_RELEVANT

SYSTEM = frozenset((MessageType.TIME_TICK, MessageType.FENCE))
"""Written by the WAL itself, never by producers."""
_U16_MAX = 0xFFFF
_U64_MAX = (1 << 64) - 1
_NOT_PLAIN = SYSTEM | TXN_RELEVANT
_PLAIN_SIZE = codec.HEADER_SIZE + 4
"""Encoded size of a message without vchannel, payload, txn id and properties."""
_PLAIN_MAPPINGS = frozenset((dict, MappingProxyType))
"""Property mappings the fast path reads as they are (what producers and the node build)."""
GOOD_VCHANNELS_MAX = 65536
"""Good vchannel names remembered at most (then forgotten, and learned again)."""


def validate(msg: Message, max_bytes: int) -> int:
    """Check a producer's message before anything is written; its encoded size.

    Raises InvalidArgument (or MessageTooLarge) saying what is wrong.
    """
    kind = msg.type
    if not isinstance(kind, MessageType):
        raise errors.InvalidArgument(f"unknown message type {kind!r}")
    if kind in SYSTEM:
        raise errors.InvalidArgument(
            f"{kind.name} messages are written by the WAL itself, not by producers"
        )
    validate_vchannel(msg.vchannel)
    if not isinstance(msg.payload, bytes):
        raise errors.InvalidArgument("message payload must be bytes")
    txn_id = msg.txn_id
    if not isinstance(txn_id, int):
        raise errors.InvalidArgument(f"txn_id must be an integer, got {errors.quoted(txn_id)}")
    if not 0 <= txn_id <= _U64_MAX:
        raise errors.InvalidArgument(f"txn_id out of range: {txn_id}")
    properties = msg.properties
    if not isinstance(properties, Mapping):
        raise errors.InvalidArgument(
            f"message properties must be a mapping of strings, got a {type(properties).__name__}"
        )
    if properties:
        _check_properties(properties)
    size = codec.encoded_size(msg)
    if size > max_bytes:
        raise errors.MessageTooLarge(
            f"message of {size} bytes (payload {len(msg.payload)}) exceeds the maximum of "
            f"{max_bytes} bytes; nothing was written"
        )
    return size


def _check_properties(properties: Mapping[str, str]) -> None:
    if len(properties) > _U16_MAX:
        raise errors.InvalidArgument(f"too many properties: {len(properties)} (at most 65535)")
    for key, value in properties.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise errors.InvalidArgument(f"property {key!r}: keys and values must be strings")
        if len(key) > _U16_MAX // 4 and len(key.encode("utf-8", "replace")) > _U16_MAX:
            raise errors.InvalidArgument(f"property key longer than 65535 bytes: {key[:40]!r}...")


def _ascii_properties_size(properties: Mapping[str, str]) -> int | None:
    """Encoded size of ``properties`` if every key and value is a short ASCII
    string (nothing for :func:`_check_properties` to refuse); else None."""
    if len(properties) > _U16_MAX:
        return None
    size = 2
    for key, value in properties.items():
        if (
            key.__class__ is not str
            or value.__class__ is not str
            or not key.isascii()
            or not value.isascii()
            or len(key) > _U16_MAX
        ):
            return None
        size += 6 + len(key) + len(value)
    return size


Checked = tuple[int, bool]
"""A message that passed: its encoded size, and whether it is *plain* (a data
message outside transactions with no properties, hence no dedup key and no
collection: only the lock stage has anything to do for it). A bare tuple:
one is made per appended message."""


class Validator:
    """:func:`validate` with a fast path for the common message (one per WAL)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._good: set[str] = set()
        """Vchannel names that passed :func:`validate` (well formed, hence ASCII)."""

    def check(self, msg: Message) -> Checked | errors.HeadraceError:
        """What :func:`validate` says of ``msg``: accepted (size, plain) or the error."""
        kind, vchannel, payload = msg.type, msg.vchannel, msg.payload
        if (
            kind.__class__ is MessageType
            and kind not in _NOT_PLAIN
            and vchannel.__class__ is str
            and vchannel in self._good
            and payload.__class__ is bytes
            and msg.txn_id.__class__ is int
            and not msg.txn_id
        ):
            size = _PLAIN_SIZE + len(vchannel) + len(payload)
            properties = msg.properties
            if properties.__class__ in _PLAIN_MAPPINGS:
                if not properties:
                    if size <= self.max_bytes:
                        return (size, True)
                else:
                    extra = _ascii_properties_size(properties)
                    if extra is not None and size + extra <= self.max_bytes:
                        return (size + extra, False)
        return self._slow(msg)

    def _slow(self, msg: Message) -> Checked | errors.HeadraceError:
        try:
            size = validate(msg, self.max_bytes)
        except errors.HeadraceError as exc:
            return exc
        good = self._good
        if len(good) >= GOOD_VCHANNELS_MAX:
            good.clear()
        good.add(msg.vchannel)
        plain = msg.type not in _NOT_PLAIN and not msg.txn_id and not msg.properties
        return (size, plain)

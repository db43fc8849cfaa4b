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

Record batches (message format 2) likewise: :func:`validate_batch` is the
rule, checking a producer's batch as a whole and each of its messages as
:func:`validate` does (it decodes them); :meth:`Validator.check_batch` gives
the same answer from the batch's framing and properties blocks alone, never
touching a payload. Both also say how the batch travels (:class:`CheckedBatch`):
*whole*, as one record through the interceptors, or, if it holds a DDL, a
transaction control message (BEGIN/COMMIT/ROLLBACK_TXN) or, on a WAL with
collections, a message naming a collection, decoded through the per-message
path. So does a batch without a producer id whose message carries format 1's
per-message dedup properties (a message first sent to an owner writing format
1, retried after the switch: the WAL deduplicates it by those). Such a batch
must hold that one message alone: its messages would get ids and timeticks of
their own, which one batch result could not state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import NamedTuple

from headrace import errors
from headrace.message import batch, codec
from headrace.message.batch import BatchHeader, Limits
from headrace.message.properties import PRODUCER_ID
from headrace.message.types import Message, MessageType, validate_vchannel
from headrace.table.names import COLLECTION
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


class CheckedBatch(NamedTuple):
    """A producer's batch that passed: its header, and how it travels (a
    named tuple: one is made per appended batch)."""

    header: BatchHeader
    whole: bool
    """As one record through the interceptors (else: its one message, decoded,
    through the per-message path)."""
    first_type: MessageType


_TYPES = {int(t): t for t in MessageType}
_PER_MESSAGE_TYPES = frozenset(int(t) for t in TXN_RELEVANT)
_SYSTEM_CODES = frozenset(int(t) for t in SYSTEM)
_PLAIN_CODES = frozenset(_TYPES) - _PER_MESSAGE_TYPES - _SYSTEM_CODES
"""Type codes of messages a whole batch may hold."""


def _batch_refusal(header: BatchHeader, limits: Limits) -> errors.HeadraceError | None:
    """The batch-wide checks after its framing and CRCs, in order (both paths
    make them): size, the stamp, the system flag."""
    if header.length > limits.max_batch_bytes:
        return errors.MessageTooLarge(
            f"record batch of {header.length} bytes ({header.count} messages) exceeds the "
            f"maximum of {limits.max_batch_bytes} bytes; nothing was written"
        )
    if header.base_timetick or header.term:
        return errors.InvalidArgument(
            f"a producer's record batch carries timetick and term 0 (the WAL stamps them), "
            f"got timetick {header.base_timetick}, term {header.term}"
        )
    if header.system:
        return errors.InvalidArgument(
            "record batches flagged system are written by the WAL itself, not by producers"
        )
    return None


def _malformed(exc: errors.CorruptData) -> errors.InvalidArgument:
    return errors.InvalidArgument(f"malformed record batch: {exc.message}; nothing was written")


def _in_message(i: int, exc: errors.HeadraceError) -> errors.HeadraceError:
    return type(exc)(f"message {i} of the batch: {exc.message}")


def _route(
    header: BatchHeader, per_message: bool, first_type: MessageType
) -> CheckedBatch | errors.HeadraceError:
    if per_message and header.count > 1:
        return errors.InvalidArgument(
            f"a record batch holding a DDL, transaction control (BEGIN/COMMIT/ROLLBACK_TXN) or "
            f"collection message must hold that message alone: send them one per batch "
            f"(this one holds {header.count} messages); nothing was written"
        )
    return tuple.__new__(CheckedBatch, (header, not per_message, first_type))


def validate_batch(
    data: bytes, limits: Limits, *, collections: bool
) -> CheckedBatch | errors.HeadraceError:
    """The rule for a producer's record batch (decodes every message):
    :func:`_batch_refusal`, a well-formed vchannel, each message as
    :func:`validate` says, then the route (``collections``: the WAL has
    collection hooks, so a message naming a collection goes per message)."""
    try:
        header = batch.verify(data)
    except errors.CorruptData as exc:
        return _malformed(exc)
    refusal = _batch_refusal(header, limits)
    if refusal is not None:
        return refusal
    try:
        validate_vchannel(header.vchannel)
        msgs = batch.messages(data, header)
    except errors.CorruptData as exc:
        return _malformed(exc)
    except errors.HeadraceError as exc:
        return exc
    for i, msg in enumerate(msgs):
        try:
            validate(msg, limits.max_message_bytes)
        except errors.HeadraceError as exc:
            return _in_message(i, exc)
    keyed = not header.producer_id
    per_message = any(
        msg.type in TXN_RELEVANT
        or (collections and COLLECTION in msg.properties)
        or (keyed and PRODUCER_ID in msg.properties)
        for msg in msgs
    )
    return _route(header, per_message, msgs[0].type)


def goes_alone(msg: Message) -> bool:
    """Whether a producer sends ``msg`` in a record batch of its own (pure): a
    DDL, a transaction control message or a message naming a collection may
    take the per-message path (a WAL with collection hooks sends a collection
    message there), which takes batches of one message only."""
    return msg.type in TXN_RELEVANT or COLLECTION in msg.properties


class Validator:
    """:func:`validate` with a fast path for the common message, and
    :func:`validate_batch` without decoding payloads (one per WAL)."""

    def __init__(
        self, max_bytes: int, limits: Limits | None = None, *, collections: bool = False
    ) -> None:
        """``limits``: of record batches (default: ``max_bytes`` per message,
        a batch as large); ``collections``: the WAL has collection hooks."""
        self.max_bytes = max_bytes
        self.limits = Limits(max_bytes, max_bytes) if limits is None else limits
        self.collections = collections
        self._good: set[str] = set()
        """Vchannel names that passed :func:`validate` (well formed, hence ASCII)."""

    def check_batch(self, data: bytes) -> CheckedBatch | errors.HeadraceError:
        """What :func:`validate_batch` says of ``data``, from its framing and
        properties blocks (payloads are only measured)."""
        try:
            header, outline = batch.outline(data)
        except errors.CorruptData as exc:
            return _malformed(exc)
        return self._outlined(data, header, outline)

    def check_batches(self, datas: Sequence[bytes]) -> list[CheckedBatch | errors.HeadraceError]:
        """:meth:`check_batch` of each of ``datas``, in order: the batches of one
        message (a request of a call spread over many vchannels) read in one
        pass (:func:`~headrace.message.batch.outline_singles`), the others one
        by one."""
        out: list[CheckedBatch | errors.HeadraceError] = []
        append = out.append
        good = self._good
        max_batch, max_message = self.limits.max_batch_bytes, self.limits.max_message_bytes
        types, new_tuple = _TYPES, tuple.__new__
        for data, seen in zip(datas, batch.outline_singles(datas), strict=True):
            if seen is None:
                append(self.check_batch(data))
                continue
            header, outline = seen
            code = outline.first_type_code
            if (
                # What _outlined finds of an unstamped batch of one record
                # outside transactions, on a vchannel found good before.
                header.length <= max_batch
                and not header.flags
                and header.vchannel in good
                and not outline.with_properties
                and code in _PLAIN_CODES
                and _PLAIN_SIZE + len(header.vchannel) + outline.max_payload <= max_message
            ):
                append(new_tuple(CheckedBatch, (header, True, types[code])))
            else:
                append(self._outlined(data, header, outline))
        return out

    def _outlined(
        self, data: bytes, header: BatchHeader, outline: batch.Outline
    ) -> CheckedBatch | errors.HeadraceError:
        """:meth:`check_batch` of a batch whose framing and CRCs passed."""
        limits = self.limits
        refusal = _batch_refusal(header, limits)
        if refusal is not None:
            return refusal
        vchannel = header.vchannel
        if vchannel not in self._good:
            try:
                validate_vchannel(vchannel)
            except errors.HeadraceError as exc:
                return exc
            self._remember(vchannel)
        base = _PLAIN_SIZE + len(vchannel) + (8 if header.txn_id else 0)
        codes = outline.type_codes
        if (
            not outline.with_properties
            and codes.isdisjoint(_SYSTEM_CODES)
            and base + outline.max_payload <= limits.max_message_bytes
        ):
            # The common producer batch: nothing to look at record by record.
            per_message = not codes.isdisjoint(_PER_MESSAGE_TYPES)
            return _route(header, per_message, _TYPES[outline.first_type_code])
        return self._check_records(data, header, base)

    def _check_records(
        self, data: bytes, header: BatchHeader, base: int
    ) -> CheckedBatch | errors.HeadraceError:
        """:meth:`check_batch` record by record (properties, or a refusal to name)."""
        limits = self.limits
        shapes = batch.shapes(data, header)  # checked by outline() already
        view = memoryview(data)
        props_sizes: list[int] = []
        per_message = False
        collections = self.collections
        keyed = not header.producer_id
        decode_properties = codec.decode_properties
        for shape in shapes:
            plen = shape.properties_length
            if not plen:
                props_sizes.append(0)
                continue
            at = shape.properties_at
            try:
                properties = decode_properties(view[at : at + plen])
            except errors.CorruptData as exc:
                return _malformed(exc)
            props_sizes.append(plen if properties else 0)
            per_message = (
                per_message
                or (collections and COLLECTION in properties)
                or (keyed and PRODUCER_ID in properties)
            )
        max_bytes = limits.max_message_bytes
        types = _TYPES
        for i, (shape, props) in enumerate(zip(shapes, props_sizes, strict=True)):
            kind = types[shape.type_code]
            if kind in SYSTEM:
                return _in_message(
                    i,
                    errors.InvalidArgument(
                        f"{kind.name} messages are written by the WAL itself, not by producers"
                    ),
                )
            size = base + props + shape.payload_length
            if size > max_bytes:
                return _in_message(
                    i,
                    errors.MessageTooLarge(
                        f"message of {size} bytes (payload {shape.payload_length}) exceeds the "
                        f"maximum of {max_bytes} bytes; nothing was written"
                    ),
                )
            per_message = per_message or shape.type_code in _PER_MESSAGE_TYPES
        return _route(header, per_message, types[shapes[0].type_code])

    def _remember(self, vchannel: str) -> None:
        good = self._good
        if len(good) >= GOOD_VCHANNELS_MAX:
            good.clear()
        good.add(vchannel)

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
        self._remember(msg.vchannel)
        plain = msg.type not in _NOT_PLAIN and not msg.txn_id and not msg.properties
        return (size, plain)

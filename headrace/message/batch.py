"""Record batches: message format version 2 (documented in docs/message-format.md).

A batch is the unit of append, storage and delivery: the client encodes the
messages of one vchannel into one batch; the node checks the batch as a whole
(:func:`verify`), stamps its base timetick and term in place (:func:`stamp`) and
stores it as one backend record. Message ``i`` of a batch stored as record
``R`` has id ``R.with_index(i)``, timetick ``base timetick + i`` and the
batch's term. The WAL reserves the batch's ``N`` timeticks at once, so
timeticks still strictly increase message by message in log order (which the
write-ahead buffer, scanners, checkpoints and as-of reads rely on), and the
batch is atomic: all of its messages become readable together, or none.

Layout (little endian)::

    0   2  magic b"HB"
    2   1  format version (2)
    3   1  flags: bit 0 transactional (every record is part of txn id),
                  bit 1 system (written by the WAL itself: time ticks, fences)
    4   4  batch length L (every byte of the batch, this header included)
    8   8  base timetick \\ the stamp: 0 from the client, set by the WAL on
    16  8  term          /  append without touching the rest of the batch
    24  4  CRC32C of bytes 8..24 (the stamp), written by whoever stamps
    28  4  CRC32C of bytes 32..L (everything after it), written by the client
    32  4  record count N (at least 1)
    36  4  reserved, 0
    40  8  producer id (0: none; then the batch is not deduplicated)
    48  8  sequence of the batch in its producer's stream
    56  8  txn id (0 outside a transaction)
    64  2  vchannel length V (0 for pchannel-wide system batches)
    66  V  vchannel (UTF-8)

then N records, each::

    0   4  record length R (the bytes after this field)
    4   1  message type code
    5   1  record flags (0; reserved)
    6   2  reserved, 0
    8   4  properties block length P (format 1's encoding: u16 count, then
           per entry u16 key length, key, u32 value length, value)
    12  P  properties
    .   .  payload (the remaining R - 8 - P bytes)

A record's offset in the batch is its position: records are never removed
from a stored batch, so an explicit offset delta would always equal it.
The batch carries no base id: the backend gives the stored record its id.
"""

from __future__ import annotations

import dataclasses
import itertools
import struct
from collections.abc import Sequence
from typing import NamedTuple

import crc32c

from headrace import errors, slots
from headrace.message import codec
from headrace.message.formats import RELEASE_FORMATS, describe
from headrace.message.types import (
    DEFAULT_MAX_MESSAGE_BYTES,
    EMPTY_PROPERTIES,
    MESSAGE_SLOT_SETTERS,
    Message,
    MessageType,
    payload_of,
    properties_of,
    txn_id_of,
    type_of,
    vchannel_of,
)

MAGIC = b"HB"
FORMAT_VERSION = 2
FLAG_TXN = 0x01
FLAG_SYSTEM = 0x02
_KNOWN_FLAGS = FLAG_TXN | FLAG_SYSTEM
_PREFIX = struct.Struct("<2sBBI")  # magic, version, flags, length
_STAMP = struct.Struct("<QQ")
_CRC = struct.Struct("<I")
_BODY = struct.Struct("<IIQQQH")  # count, reserved, producer, sequence, txn, vlen
HEADER_SIZE = 66
"""Bytes of the header before the vchannel."""
_STAMP_AT, _STAMP_CRC_AT, _BODY_CRC_AT, _BODY_AT = 8, 24, 28, 32
_HEAD = struct.Struct("<2sBBIQQIIIIQQQH")  # every field before the vchannel
assert _HEAD.size == HEADER_SIZE
_RECORD = struct.Struct("<IBBHI")  # length, type, flags, reserved, properties length
RECORD_HEADER_SIZE = _RECORD.size  # 12
_FRAME = struct.Struct("<IB3xI")  # a record's length, type and properties length
_LENGTH_TYPE = struct.Struct("<IB")
_LENGTH = struct.Struct("<I")
_VCHANNEL_LENGTH = struct.Struct("<H")
_VCHANNEL_LENGTH_AT = HEADER_SIZE - 2
_UNIFORM_BYTES = (0, 1, 2, 3, 8, 9, 10, 11)
"""Bytes of a record header that every record of a uniform batch repeats."""
_TYPES = {int(t): t for t in MessageType}
_KNOWN_CODES = bytes(sorted(_TYPES))
_crc = crc32c.crc32c
_new_tuple = tuple.__new__
_new_object = object.__new__


@dataclasses.dataclass(frozen=True, slots=True, init=False)
class BatchInfo:
    """What a producer says of a batch besides its messages."""

    vchannel: str = ""
    producer_id: int = 0
    sequence: int = 0
    txn_id: int = 0
    system: bool = False

    def __init__(
        self,
        vchannel: str = "",
        producer_id: int = 0,
        sequence: int = 0,
        txn_id: int = 0,
        system: bool = False,
    ) -> None:
        # The slot descriptors' setters, as BatchHeader's (one is made per
        # encoded batch: per message of a call spread over many vchannels).
        _SET_INFO_VCHANNEL(self, vchannel)
        _SET_INFO_PRODUCER_ID(self, producer_id)
        _SET_INFO_SEQUENCE(self, sequence)
        _SET_INFO_TXN_ID(self, txn_id)
        _SET_INFO_SYSTEM(self, system)


(
    _SET_INFO_VCHANNEL,
    _SET_INFO_PRODUCER_ID,
    _SET_INFO_SEQUENCE,
    _SET_INFO_TXN_ID,
    _SET_INFO_SYSTEM,
) = slots.setters(BatchInfo)


class BatchHeader(NamedTuple):
    """The fixed fields of a batch, read without touching its records (a named
    tuple: one is made per appended and per read batch, and building one
    costs a fifth of a slotted dataclass's, even through its slot setters)."""

    flags: int
    length: int
    base_timetick: int
    """Timetick of the first message; message ``i`` has ``base_timetick + i``."""
    term: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count on purpose
    producer_id: int
    sequence: int
    txn_id: int
    vchannel: str
    records_at: int
    """Offset of the first record."""

    def with_stamp(self, base_timetick: int, term: int) -> BatchHeader:
        """The same header with the WAL's base timetick and term."""
        return _new_tuple(
            BatchHeader,
            (
                self.flags,
                self.length,
                base_timetick,
                term,
                self.count,
                self.producer_id,
                self.sequence,
                self.txn_id,
                self.vchannel,
                self.records_at,
            ),
        )

    @property
    def last_timetick(self) -> int:
        """Timetick of the batch's last message."""
        return self.base_timetick + self.count - 1

    @property
    def transactional(self) -> bool:
        return bool(self.flags & FLAG_TXN)

    @property
    def system(self) -> bool:
        return bool(self.flags & FLAG_SYSTEM)


def is_batch(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` starts like a batch (format 2) rather than a format 1 message."""
    return bytes(data[:2]) == MAGIC


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds a batch must keep: each message's size as format 1 counts it, and the batch's."""

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    max_batch_bytes: int = 4 * DEFAULT_MAX_MESSAGE_BYTES


_UNSTAMPED = _STAMP.pack(0, 0) + _CRC.pack(_crc(_STAMP.pack(0, 0)))
"""The stamp of a batch from the client (base timetick and term 0) and its CRC."""
_CHUNK_PARTS = 64
"""Record parts (headers, properties, payloads) joined into one piece before
the CRC and the batch's own join: a CRC call per piece rather than per part,
and pieces of some 32 KiB for 1 KiB messages, so the copy is never a second
allocation of the batch's size (freeing and making one each batch costs more
than the copy itself when the allocator gives the memory back in between)."""
_repeat = itertools.repeat


def encode(messages: Sequence[Message], info: BatchInfo, limits: Limits = Limits()) -> bytes:
    """Encode ``messages`` (all of ``info.vchannel`` and ``info.txn_id``) as one unstamped batch.

    InvalidArgument for an empty batch, a message of another vchannel or
    transaction, or values the format cannot hold; MessageTooLarge (nothing
    built) for a message or a batch over ``limits``.

    Two ways build the same bytes (``tests/message/test_batch.py`` checks it
    property-based): :func:`_plain_records`, column by column, for the common
    batch of messages without properties that keeps every rule; and
    :func:`_checked_records`, the rule, message by message, which encodes any
    other batch or names the first fault.
    """
    if not messages:
        raise errors.InvalidArgument("a batch holds at least one message")
    try:
        vch = info.vchannel.encode()
    except UnicodeError as exc:
        raise errors.InvalidArgument(f"vchannel is not encodable as UTF-8: {exc}") from None
    if len(vch) > 0xFFFF:
        raise errors.InvalidArgument("vchannel name longer than 65535 bytes")
    # What format 1 adds to a message's properties and payload (its size limit counts it).
    overhead = codec.HEADER_SIZE + len(vch) + 4 + (8 if info.txn_id else 0)
    if len(messages) == 1:
        single = _plain_single(messages[0], info, limits, overhead, vch)
        if single is not None:
            return single
    parts = _plain_records(messages, info, limits, overhead)
    if parts is None:
        parts = _checked_records(messages, info, limits, overhead)
    chunks = [b"".join(parts[at : at + _CHUNK_PARTS]) for at in range(0, len(parts), _CHUNK_PARTS)]
    size = HEADER_SIZE + len(vch) + sum(map(len, chunks))
    if size > limits.max_batch_bytes:
        raise errors.MessageTooLarge(
            f"batch of {len(messages)} messages is {size} bytes, over the maximum of "
            f"{limits.max_batch_bytes} bytes; nothing was written"
        )
    flags = (FLAG_TXN if info.txn_id else 0) | (FLAG_SYSTEM if info.system else 0)
    try:
        body_head = _BODY.pack(
            len(messages), 0, info.producer_id, info.sequence, info.txn_id, len(vch)
        )
    except struct.error as exc:
        raise errors.InvalidArgument(
            f"batch field out of range (producer id, sequence and txn id are 0..2**64-1): {exc}"
        ) from None
    body_crc = _crc(vch, _crc(body_head))
    for chunk in chunks:
        body_crc = _crc(chunk, body_crc)
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, flags, size) + _UNSTAMPED + _CRC.pack(body_crc)
    return b"".join([head, body_head, vch, *chunks])


def _plain_single(
    msg: Message, info: BatchInfo, limits: Limits, overhead: int, vch: bytes
) -> bytes | None:
    """The batch of one message without properties, of ``info``'s vchannel and
    transaction and within ``limits`` (the common batch of a call spread over
    many vchannels), packed in a few calls without a parts list; None for any
    other message or a field out of range (:func:`encode` then builds or
    refuses it the general way)."""
    payload = msg.payload
    if (
        msg.properties
        or msg.vchannel != info.vchannel
        or msg.txn_id != info.txn_id
        or overhead + len(payload) > limits.max_message_bytes
    ):
        return None
    size = HEADER_SIZE + len(vch) + RECORD_HEADER_SIZE + len(payload)
    if size > limits.max_batch_bytes:
        return None
    try:
        body_head = _BODY.pack(1, 0, info.producer_id, info.sequence, info.txn_id, len(vch))
    except struct.error:
        return None
    record = _RECORD.pack(8 + len(payload), msg.type, 0, 0, 0)
    body_crc = _crc(payload, _crc(record, _crc(vch, _crc(body_head))))
    flags = (FLAG_TXN if info.txn_id else 0) | (FLAG_SYSTEM if info.system else 0)
    head = _PREFIX.pack(MAGIC, FORMAT_VERSION, flags, size) + _UNSTAMPED + _CRC.pack(body_crc)
    return b"".join((head, body_head, vch, record, payload))


_SINGLE_HEAD = struct.Struct("<2sBBI20sI")
"""Bytes 0..32 of a batch: magic, version, flags, length, the stamp and its CRC, the body CRC."""
_SINGLE_BODIES: dict[int, struct.Struct] = {}
"""Per vchannel length V: a one-record batch's bytes 32..78+V (the fields after
the body CRC, the vchannel, the record's header), packed by one call."""


def _single_body(vlen: int) -> struct.Struct:
    shape = _SINGLE_BODIES.get(vlen)
    if shape is None:
        shape = _SINGLE_BODIES[vlen] = struct.Struct(f"<IIQQQH{vlen}sIBBHI")
    return shape


def encode_singles(
    messages: Sequence[Message],
    producer_id: int,
    sequences: Sequence[int],
    limits: Limits = Limits(),
) -> list[bytes | None]:
    """Each of ``messages`` as an unstamped batch of its own, in one pass: entry
    ``i`` is the bytes :func:`encode` builds for ``[messages[i]]`` with
    ``BatchInfo(its vchannel, producer_id, sequences[i], its txn id)``, or None
    where :func:`encode` would build it otherwise or refuse it (properties, over
    ``limits``, a field out of range, a vchannel not encodable): the caller then
    asks :func:`encode`, which builds it or names the fault.

    The batches of a call spread over many vchannels (most hold one message),
    a few C calls each: ``tests/message/test_batch.py`` checks them byte for
    byte against :func:`encode`."""
    if len(sequences) != len(messages):
        raise errors.InvalidArgument(
            f"{len(messages)} messages and {len(sequences)} sequences: one sequence per batch"
        )
    out: list[bytes | None] = []
    append = out.append
    names: dict[str, bytes] = {}
    max_message, max_batch = limits.max_message_bytes, limits.max_batch_bytes
    head_pack, join = _SINGLE_HEAD.pack, b"".join
    # What format 1 adds to a message besides its vchannel (its size limit counts it).
    overhead = codec.HEADER_SIZE + 4
    for msg, sequence in zip(messages, sequences, strict=True):
        vchannel = msg.vchannel
        vch = names.get(vchannel)
        if vch is None:
            vch = names[vchannel] = _encodable(vchannel)
        payload, txn_id = msg.payload, msg.txn_id
        if not vch or msg.properties:
            append(None)
            continue
        vlen, plen = len(vch), len(payload)
        size = HEADER_SIZE + vlen + RECORD_HEADER_SIZE + plen
        if overhead + vlen + (8 if txn_id else 0) + plen > max_message or size > max_batch:
            append(None)
            continue
        try:
            body = _single_body(vlen).pack(
                1, 0, producer_id, sequence, txn_id, vlen, vch, 8 + plen, msg.type, 0, 0, 0
            )
        except struct.error:
            append(None)
            continue
        body_crc = _crc(payload, _crc(body))
        flags = FLAG_TXN if txn_id else 0
        append(
            join(
                (head_pack(MAGIC, FORMAT_VERSION, flags, size, _UNSTAMPED, body_crc), body, payload)
            )
        )
    return out


def _encodable(vchannel: str) -> bytes:
    """``vchannel`` in UTF-8, if a producer's batch header can hold it (else b"")."""
    try:
        vch = vchannel.encode()
    except UnicodeError:
        return b""
    return vch if len(vch) <= 0xFFFF else b""


def _plain_records(
    messages: Sequence[Message], info: BatchInfo, limits: Limits, overhead: int
) -> list[bytes] | None:
    """The parts of the records of a batch whose messages have no properties, are all of
    ``info``'s vchannel and transaction and each within ``limits``, built
    column by column (one record header packed for all when every record has
    the same length and type); None for any other batch."""
    count = len(messages)
    if any(map(properties_of, messages)):
        return None
    if list(map(vchannel_of, messages)).count(info.vchannel) != count:
        return None
    if list(map(txn_id_of, messages)).count(info.txn_id) != count:
        return None
    payloads = list(map(payload_of, messages))
    lengths = list(map(len, payloads))
    if overhead + max(lengths) > limits.max_message_bytes:
        return None
    types = list(map(type_of, messages))
    if lengths.count(lengths[0]) == count and types.count(types[0]) == count:
        heads = [_RECORD.pack(8 + lengths[0], types[0], 0, 0, 0)] * count
    else:
        lengths8 = map((8).__add__, lengths)
        flags, reserved, no_props = _repeat(0, count), _repeat(0, count), _repeat(0, count)
        heads = list(map(_RECORD.pack, lengths8, types, flags, reserved, no_props))
    parts: list[bytes] = [b""] * (2 * count)
    parts[::2] = heads
    parts[1::2] = payloads
    return parts


def _checked_records(
    messages: Sequence[Message], info: BatchInfo, limits: Limits, overhead: int
) -> list[bytes]:
    """The parts of the records of a batch, message by message; InvalidArgument or
    MessageTooLarge naming the first message that breaks a rule."""
    parts: list[bytes] = []
    append = parts.append
    pack_record = _RECORD.pack
    encode_props = codec.encode_properties
    max_message = limits.max_message_bytes
    for i, msg in enumerate(messages):
        if msg.vchannel != info.vchannel or msg.txn_id != info.txn_id:
            raise errors.InvalidArgument(
                f"message {i} of a batch for vchannel {errors.quoted(info.vchannel)} "
                f"(txn {info.txn_id}) is for vchannel {errors.quoted(msg.vchannel)} "
                f"(txn {msg.txn_id}): a batch holds one vchannel's messages of one transaction"
            )
        try:
            props = encode_props(msg.properties) if msg.properties else b""
        except UnicodeError as exc:
            raise errors.InvalidArgument(f"message text is not encodable as UTF-8: {exc}") from None
        payload = msg.payload
        if overhead + len(props) + len(payload) > max_message:
            raise errors.MessageTooLarge(
                f"message {i} of the batch is {overhead + len(props) + len(payload)} bytes "
                f"(payload {len(payload)}), over the maximum of {max_message} bytes; "
                "nothing was written"
            )
        append(pack_record(8 + len(props) + len(payload), msg.type, 0, 0, len(props)))
        if props:
            append(props)
        append(payload)
    return parts


def raw_vchannel(data: bytes) -> bytes:
    """The bytes of the header's vchannel field, unchecked (a key to remember a
    name already checked by: equal to ``read_header(data).vchannel`` encoded
    whenever the header is well formed; b"" if ``data`` is shorter than a header)."""
    if len(data) < HEADER_SIZE:
        return b""
    (size,) = _VCHANNEL_LENGTH.unpack_from(data, _VCHANNEL_LENGTH_AT)
    return data[HEADER_SIZE : HEADER_SIZE + size]


def raw_vchannels(datas: Sequence[bytes]) -> list[bytes]:
    """:func:`raw_vchannel` of each of ``datas``, in one pass."""
    unpack, at = _VCHANNEL_LENGTH.unpack_from, _VCHANNEL_LENGTH_AT
    return [
        data[HEADER_SIZE : HEADER_SIZE + unpack(data, at)[0]] if len(data) >= HEADER_SIZE else b""
        for data in datas
    ]


def read_header(data: bytes | bytearray | memoryview) -> BatchHeader:
    """The batch's header, checked (magic, version, flags, length, stamp CRC); no body CRC."""
    size = len(data)
    if size < HEADER_SIZE:
        raise errors.CorruptData(f"batch of {size} bytes is shorter than its header")
    (
        magic,
        version,
        flags,
        length,
        timetick,
        term,
        stamp_crc,
        _body_crc,
        count,
        _res,
        producer,
        sequence,
        txn_id,
        vlen,
    ) = _HEAD.unpack_from(data)
    if magic != MAGIC:
        raise errors.CorruptData(f"bad batch magic {bytes(magic)!r}; not a Headrace record batch")
    if version != FORMAT_VERSION:
        raise errors.CorruptData(
            f"unsupported message format version {version} "
            f"(this release reads {describe(RELEASE_FORMATS.reads)}): written by a newer release?"
        )
    if flags & ~_KNOWN_FLAGS:
        raise errors.CorruptData(f"unknown batch flags {flags:#04x}")
    if length != size:
        raise errors.CorruptData(f"batch length {size} does not match its header ({length})")
    if _crc(data[_STAMP_AT:_STAMP_CRC_AT]) != stamp_crc:
        raise errors.CorruptData("batch stamp CRC mismatch (timetick or term damaged)")
    records_at = HEADER_SIZE + vlen
    if count < 1 or records_at > size:
        raise errors.CorruptData(f"batch header is inconsistent: {count} records, vchannel {vlen}")
    try:
        vchannel = str(data[HEADER_SIZE:records_at], "utf-8")
    except UnicodeDecodeError:
        raise errors.CorruptData("batch vchannel is not valid UTF-8") from None
    if bool(flags & FLAG_TXN) != bool(txn_id):
        raise errors.CorruptData("batch transactional flag does not match its txn id")
    if timetick + count > 1 << 64:
        raise errors.CorruptData(f"batch timeticks from {timetick} for {count} records overflow")
    return _new_tuple(
        BatchHeader,
        (flags, length, timetick, term, count, producer, sequence, txn_id, vchannel, records_at),
    )


class RecordShape(NamedTuple):
    """Where one record of a batch lies, read from its framing alone."""

    type_code: int
    properties_at: int
    """Offset of its properties block in the batch."""
    properties_length: int
    payload_length: int


class Outline(NamedTuple):
    """What a batch's records hold, in aggregate, read from their framing alone
    (a named tuple: one is made per checked batch)."""

    type_codes: frozenset[int]
    first_type_code: int
    max_payload: int
    """Largest payload of a record without properties (0 if none)."""
    with_properties: bool
    """Some record has a properties block."""


def outline(data: bytes | bytearray | memoryview) -> tuple[BatchHeader, Outline]:
    """:func:`verify`, also giving the records' :class:`Outline` from the same
    walk, without per-record objects.

    Four walks give the same answer on every input (``tests/message/test_batch.py``
    checks it property-based): :func:`_outline_single` reads a batch of one
    record from its one frame; :func:`_outline_uniform` reads a batch whose
    records all have one length (the common producer batch of equal rows) with
    a constant number of strided reads, whatever its record count;
    :func:`_outline_walk` follows the records' lengths one ``unpack`` each; and
    :func:`_outline_checked`, the rule, which names the first fault. The first
    three accept or leave the batch to the next, never refuse."""
    header = _checked_body(data)
    found = (
        _outline_single(data, header)
        or _outline_uniform(data, header)
        or _outline_walk(data, header)
    )
    if found is None:
        found = _outline_checked(data, header)
    return header, found


def outline_singles(
    datas: Sequence[bytes],
) -> list[tuple[BatchHeader, Outline] | None]:
    """:func:`outline` of each of ``datas`` that is an unstamped batch of one
    record (a producer's batch of a call spread over many vchannels), read in
    one pass; None for any other batch, well formed or not (:func:`outline`
    then reads it, or names its fault). Never refuses: an entry it gives is
    what :func:`outline` gives for the same bytes (``tests/message/test_batch.py``
    checks it property-based)."""
    out: list[tuple[BatchHeader, Outline] | None] = []
    append = out.append
    unpack_head, unpack_frame = _HEAD.unpack_from, _FRAME.unpack_from
    names: dict[bytes, str] = {}
    one_code = _ONE_CODE
    new_tuple = _new_tuple
    for data in datas:
        size = len(data)
        if size < HEADER_SIZE + RECORD_HEADER_SIZE or data[_STAMP_AT:_BODY_CRC_AT] != _UNSTAMPED:
            append(None)
            continue
        (
            magic,
            version,
            flags,
            length,
            _timetick,
            _term,
            _stamp_crc,
            body_crc,
            count,
            _res,
            producer,
            sequence,
            txn_id,
            vlen,
        ) = unpack_head(data)
        start = HEADER_SIZE + vlen
        if (
            magic != MAGIC
            or version != FORMAT_VERSION
            or flags & ~_KNOWN_FLAGS
            or length != size
            or count != 1
            or bool(flags & FLAG_TXN) != bool(txn_id)
            or start + RECORD_HEADER_SIZE > size
        ):
            append(None)
            continue
        record_length, tcode, plen = unpack_frame(data, start)
        codes = one_code.get(tcode)
        if (
            codes is None
            or record_length < 8 + plen
            or start + 4 + record_length != size
            or _crc(data[_BODY_AT:]) != body_crc
        ):
            append(None)
            continue
        raw = data[HEADER_SIZE:start]
        vchannel = names.get(raw)
        if vchannel is None:
            try:
                vchannel = names[raw] = str(raw, "utf-8")
            except UnicodeDecodeError:
                append(None)
                continue
        header = new_tuple(
            BatchHeader,
            (flags, length, 0, 0, 1, producer, sequence, txn_id, vchannel, start),
        )
        shape = new_tuple(Outline, (codes, tcode, 0 if plen else record_length - 8, bool(plen)))
        append((header, shape))
    return out


def _outline_checked(data: bytes | bytearray | memoryview, header: BatchHeader) -> Outline:
    """The records' outline, checked record by record; CorruptData naming the first fault."""
    pos, end, count = header.records_at, header.length, 0
    unpack = _RECORD.unpack_from
    known = _TYPES
    codes: set[int] = set()
    add = codes.add
    max_payload = 0
    props = False
    while pos < end:
        if end - pos < RECORD_HEADER_SIZE:
            raise errors.CorruptData(f"record {count} of the batch is cut short")
        length, tcode, _flags, _res, plen = unpack(data, pos)
        if tcode not in known:
            raise errors.CorruptData(f"record {count} of the batch has unknown type code {tcode}")
        if length < 8 + plen or pos + 4 + length > end:
            raise errors.CorruptData(f"record {count} of the batch has a bad length")
        if plen:
            props = True
        elif length - 8 > max_payload:
            max_payload = length - 8
        add(tcode)
        pos += 4 + length
        count += 1
    if count != header.count:
        raise errors.CorruptData(f"batch holds {count} records, its header says {header.count}")
    first = unpack(data, header.records_at)[1]
    return Outline(frozenset(codes), first, max_payload, props)


_ONE_CODE = {code: frozenset((code,)) for code in _TYPES}


def _outline_single(data: bytes | bytearray | memoryview, header: BatchHeader) -> Outline | None:
    """The outline of a well-formed batch of one record (the common batch of a
    call spread over many vchannels), from its one frame; None for a malformed
    one (:func:`_outline_checked` names its fault)."""
    start, end = header.records_at, header.length
    if header.count != 1 or end - start < RECORD_HEADER_SIZE:
        return None
    length, tcode, plen = _FRAME.unpack_from(data, start)
    codes = _ONE_CODE.get(tcode)
    if codes is None or length < 8 + plen or start + 4 + length != end:
        return None
    return _new_tuple(Outline, (codes, tcode, 0 if plen else length - 8, bool(plen)))


def _uniform_frame(data: bytes | bytearray, header: BatchHeader) -> tuple[int, int] | None:
    """The length and properties length every record of a batch has, when
    all its records repeat the first one's header but for the type code
    (:data:`_UNIFORM_BYTES`, checked column by column: one strided slice per
    header byte) and fill the batch; None for any other batch."""
    start, end, count = header.records_at, header.length, header.count
    if end - start < RECORD_HEADER_SIZE:
        return None
    length, _tcode, plen = _FRAME.unpack_from(data, start)
    stride = 4 + length
    if length < 8 + plen or stride * count != end - start:
        return None
    if count > 1:
        for at in _UNIFORM_BYTES:
            column = data[start + at : end : stride]
            if column.count(column[0]) != count:
                return None
    return length, plen


def _outline_uniform(data: bytes | bytearray | memoryview, header: BatchHeader) -> Outline | None:
    """The outline of a well-formed batch whose records all have the first
    one's length and properties length, read column by column (a strided
    slice of the batch per header byte); None for any other batch."""
    if isinstance(data, memoryview):
        return None
    frame = _uniform_frame(data, header)
    if frame is None:
        return None
    length, plen = frame
    start, end = header.records_at, header.length
    codes = data[start + 4 : end : 4 + length]
    if codes.translate(None, _KNOWN_CODES):
        return None
    return Outline(frozenset(codes), codes[0], 0 if plen else length - 8, bool(plen))


def _outline_walk(data: bytes | bytearray | memoryview, header: BatchHeader) -> Outline | None:
    """The outline of a well-formed batch, following its records' lengths with
    one ``unpack`` each and checking the type codes at once; None for a
    malformed one (:func:`_outline_checked` names its fault)."""
    pos, end = header.records_at, header.length
    last = end - RECORD_HEADER_SIZE
    unpack = _FRAME.unpack_from
    codes = bytearray()
    add = codes.append
    longest = 0
    props = False
    while pos <= last:
        length, tcode, plen = unpack(data, pos)
        if length < 8 + plen:
            return None
        add(tcode)
        if plen:
            props = True
        elif length > longest:
            longest = length
        pos += 4 + length
    if pos != end or len(codes) != header.count or codes.translate(None, _KNOWN_CODES):
        return None
    return Outline(frozenset(codes), codes[0], longest - 8 if longest else 0, props)


def _checked_body(data: bytes | bytearray | memoryview) -> BatchHeader:
    """The header, checked, and the body's CRC checked."""
    header = read_header(data)
    (body_crc,) = _CRC.unpack_from(data, _BODY_CRC_AT)
    if _crc(memoryview(data)[_BODY_AT:]) != body_crc:
        raise errors.CorruptData("batch CRC mismatch")
    return header


def verify(data: bytes | bytearray | memoryview) -> BatchHeader:
    """Check a whole batch without decoding its messages: header, body CRC and
    record framing (lengths, type codes, count). CorruptData naming the first fault."""
    return outline(data)[0]


def shapes(data: bytes, verified: BatchHeader) -> list[RecordShape]:
    """Every record's shape (type code, where its properties lie, payload
    length) of a batch :func:`verify` passed, without decoding anything."""
    out: list[RecordShape] = []
    append = out.append
    unpack, new_tuple = _RECORD.unpack_from, tuple.__new__
    pos = verified.records_at
    for _ in range(verified.count):
        length, tcode, _flags, _res, plen = unpack(data, pos)
        append(new_tuple(RecordShape, (tcode, pos + RECORD_HEADER_SIZE, plen, length - 8 - plen)))
        pos += 4 + length
    return out


def stamp(data: bytearray, base_timetick: int, term: int) -> None:
    """Set the batch's base timetick and term in place (and the stamp's CRC)."""
    _STAMP.pack_into(data, _STAMP_AT, base_timetick, term)
    _CRC.pack_into(data, _STAMP_CRC_AT, _crc(memoryview(data)[_STAMP_AT:_STAMP_CRC_AT]))


def stamped(data: bytes, base_timetick: int, term: int) -> bytes:
    """``data`` with its base timetick and term set (and the stamp's CRC), in one copy."""
    return b"".join(_stamped_parts(data, stamp_mark(base_timetick, term)))


def stamp_mark(base_timetick: int, term: int) -> bytes:
    """The bytes a stamp writes over bytes 8..28 of a batch: base timetick,
    term and their CRC (the rest of the batch, its body CRC included, stays)."""
    mark = _STAMP.pack(base_timetick, term)
    return mark + _CRC.pack(_crc(mark))


def _stamped_parts(data: bytes, mark: bytes) -> tuple[memoryview, bytes, memoryview]:
    view = memoryview(data)
    return (view[:_STAMP_AT], mark, view[_BODY_CRC_AT:])


class Stamped:
    """A producer's batch with the stamp the WAL gave it, not joined yet.

    ``header`` is the batch's header with that stamp
    (:meth:`BatchHeader.with_stamp`); the stored batch is ``data`` with
    :func:`stamp_mark` of it over bytes 8..28. A writer that writes a record's
    :meth:`parts` as they are (the local WAL's ``pwritev``) stores it without
    a copy of the batch, and the write-ahead buffer keeps the producer's
    bytes. :meth:`joined` makes the one copy when somebody needs the stamped
    bytes in one piece (a reader sending it on, a backend whose client takes
    one buffer), keeps it and lets the producer's bytes go. ``data`` must be
    immutable (``bytes``).
    """

    __slots__ = ("_data", "_header")

    def __init__(self, data: bytes, header: BatchHeader) -> None:
        self._data = data
        self._header: BatchHeader | None = header

    def __len__(self) -> int:
        return len(self._data)

    @property
    def records(self) -> bytes:
        """Bytes with the batch's records (and header) at their offsets; the
        stamp in them may not be set yet: the stamped header has it."""
        return self._data

    def parts(self) -> tuple[bytes | memoryview, ...]:
        """The stored batch's bytes in order, in as few pieces as it has."""
        header = self._header
        if header is None:
            return (self._data,)
        return _stamped_parts(self._data, stamp_mark(header.base_timetick, header.term))

    def joined(self) -> bytes:
        """The stored batch in one piece (copied once, then kept)."""
        if self._header is None:
            return self._data
        data = self.copy()
        self._data, self._header = data, None
        return data

    def copy(self) -> bytes:
        """The stored batch in one piece, a copy not kept (a send that frees
        it when done), or the bytes themselves once joined."""
        return b"".join(self.parts()) if self._header is not None else self._data

    def __repr__(self) -> str:
        return f"Stamped({len(self._data)} bytes, joined={self._header is None})"


def messages(data: bytes, verified: BatchHeader | None = None) -> list[Message]:
    """The batch's messages in order, stamped; CorruptData on bad input.

    ``verified``: the result of :func:`verify` on the same bytes, when the
    caller has it (the batch is then not checked again); None checks it.
    """
    header = verify(data) if verified is None else verified
    try:
        return _messages(data, header)
    except (struct.error, KeyError) as exc:  # a header not from verify() over bad bytes
        raise errors.CorruptData(f"batch records are malformed: {exc!r}") from None


def record_types(data: bytes, verified: BatchHeader) -> list[MessageType]:
    """The message type of each record, in order, without decoding the records."""
    codes = type_codes(data, verified)
    if codes.translate(None, _KNOWN_CODES):
        unknown = codes.translate(None, _KNOWN_CODES)[0]
        raise errors.CorruptData(f"batch records are malformed: unknown type code {unknown}")
    types = _TYPES
    return [types[code] for code in codes]


def type_codes(data: bytes, verified: BatchHeader) -> bytes:
    """The type code of each record, in order, read from the framing alone (a
    header :func:`read_header` passed; CorruptData if the records run past the
    batch): one strided slice when every record has the first one's length,
    else one ``unpack`` per record."""
    start, count, size = verified.records_at, verified.count, len(data)
    end = verified.length
    if end - start >= RECORD_HEADER_SIZE and end == size:
        (length,) = _LENGTH.unpack_from(data, start)
        stride = 4 + length
        if stride >= RECORD_HEADER_SIZE and stride * count == end - start:
            at = 0
            while at < 4:
                column = data[start + at : end : stride]
                if column.count(column[0]) != count:
                    break
                at += 1
            else:
                return data[start + 4 : end : stride]
    codes = bytearray()
    add = codes.append
    unpack = _LENGTH_TYPE.unpack_from
    pos = start
    for i in range(count):
        if pos + RECORD_HEADER_SIZE > size:
            raise errors.CorruptData(f"batch records are malformed: record {i} runs past the batch")
        length, tcode = unpack(data, pos)
        add(tcode)
        pos += 4 + length
    return bytes(codes)


def _messages(data: bytes, header: BatchHeader) -> list[Message]:
    columns = _uniform_columns(data, header)
    if columns is not None:
        return _uniform_messages(header, *columns)
    out: list[Message] = []
    append = out.append
    unpack = _RECORD.unpack_from
    types = _TYPES
    new = object.__new__
    set_type, set_vch, set_payload, set_props, set_tt, set_term, set_txn = MESSAGE_SLOT_SETTERS
    vch, tt, term, txn = header.vchannel, header.base_timetick, header.term, header.txn_id
    pos, end = header.records_at, header.length
    view = memoryview(data)
    for _ in range(header.count):
        length, tcode, _flags, _res, plen = unpack(data, pos)
        start = pos + RECORD_HEADER_SIZE
        stop = pos + 4 + length
        msg = new(Message)
        set_type(msg, types[tcode])
        set_vch(msg, vch)
        if plen:
            set_props(msg, codec.decode_properties(view[start : start + plen]))
        else:
            set_props(msg, EMPTY_PROPERTIES)
        set_payload(msg, data[start + plen : stop])
        set_tt(msg, tt)
        tt += 1
        set_term(msg, term)
        set_txn(msg, txn)
        append(msg)
        pos = stop
    if pos != end:
        raise errors.CorruptData("batch records do not end where the batch does")
    return out


def _uniform_columns(data: bytes, header: BatchHeader) -> tuple[bytes, list[bytes]] | None:
    """The type codes and payloads of a batch whose records all have the first
    one's length and no properties (the common producer batch of equal rows),
    column by column: one strided slice per header byte and one slice per
    payload, no ``unpack`` per record; None for any other batch (the record
    by record decode reads it)."""
    if type(data) is not bytes or header.count < 2:
        return None
    frame = _uniform_frame(data, header)
    if frame is None or frame[1]:
        return None
    start, end, stride = header.records_at, header.length, 4 + frame[0]
    payloads = [data[at + RECORD_HEADER_SIZE : at + stride] for at in range(start, end, stride)]
    return data[start + 4 : end : stride], payloads


def _uniform_messages(header: BatchHeader, codes: bytes, payloads: list[bytes]) -> list[Message]:
    """The messages of a uniform batch (:func:`_uniform_columns`), built field
    by field over all of them (``slots.drain``) instead of one Python loop
    turn of seven setter calls per message: a third less time per message.
    KeyError on an unknown type code (:func:`messages` names it)."""
    count = len(payloads)
    out: list[Message] = list(map(_new_object, _repeat(Message, count)))
    set_type, set_vch, set_payload, set_props, set_tt, set_term, set_txn = MESSAGE_SLOT_SETTERS
    drain = slots.drain
    drain(map(set_type, out, map(_TYPES.__getitem__, codes)))
    drain(map(set_vch, out, _repeat(header.vchannel, count)))
    drain(map(set_payload, out, payloads))
    drain(map(set_props, out, _repeat(EMPTY_PROPERTIES, count)))
    base = header.base_timetick
    drain(map(set_tt, out, range(base, base + count)))
    drain(map(set_term, out, _repeat(header.term, count)))
    drain(map(set_txn, out, _repeat(header.txn_id, count)))
    return out

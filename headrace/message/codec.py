"""Binary message envelope, format version 1.

The formats this release reads and writes are declared in
:mod:`headrace.message.formats` (:data:`~headrace.message.formats.RELEASE_FORMATS`);
which one a WAL writes is the cluster's choice, passed to :func:`encode`.

Layout (little endian)::

    0   2  magic  b"HM"
    2   1  format version (1)
    3   1  message type code
    4   1  flags (bit 0: txn id present)
    5   1  reserved, 0
    6   2  vchannel length V
    8   8  timetick
    16  8  term
    24  4  payload length P
    28  4  properties block length R
    32  V  vchannel (UTF-8)
    .   8  txn id (only with flag bit 0)
    .   R  properties: u16 count, then per entry u16 key length, key, u32 value length, value
    .   P  payload
    .   4  CRC-32 of every byte before it

The fixed 32-byte header lets scanners read type, vchannel, timetick and term
(:func:`peek`) without touching the payload or the properties.
"""

from __future__ import annotations

import dataclasses
import struct
import zlib
from collections.abc import Mapping, Sequence
from typing import NamedTuple

from headrace import errors
from headrace.message.formats import RELEASE_FORMATS, describe
from headrace.message.ids import MessageID
from headrace.message.types import (
    DEFAULT_MAX_MESSAGE_BYTES,
    EMPTY_PROPERTIES,
    MESSAGE_SLOT_SETTERS,
    LogEntry,
    Message,
    MessageType,
)

MAGIC = b"HM"
FORMAT_VERSION = 1
"""The layout this module encodes (the only one it knows today)."""
_READS = RELEASE_FORMATS.reads
_WRITES = RELEASE_FORMATS.writes
_HEADER = struct.Struct("<2sBBBBHQQII")
HEADER_SIZE = _HEADER.size  # 32
_CRC = struct.Struct("<I")
_TXN = struct.Struct("<Q")
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FLAG_TXN = 0x01
_TYPES = {int(t): t for t in MessageType}
_KNOWN_TYPES = frozenset(_TYPES)


class Header(NamedTuple):
    type: MessageType
    vchannel: str
    timetick: int
    term: int


def encoded_size(msg: Message) -> int:
    """Size :func:`encode` would produce, without encoding."""
    try:
        return _encoded_size(msg)
    except UnicodeError as exc:
        raise errors.InvalidArgument(f"message text is not encodable as UTF-8: {exc}") from None


def _encoded_size(msg: Message) -> int:
    size = HEADER_SIZE + len(msg.vchannel.encode()) + len(msg.payload) + 4
    if msg.txn_id:
        size += 8
    size += _properties_size(msg.properties)
    return size


def _properties_size(props: Mapping[str, str]) -> int:
    if not props:
        return 0
    size = 2 + 6 * len(props)
    for key, value in props.items():
        # ASCII text (the usual case) is as long encoded as it is.
        size += len(key) if key.isascii() else len(key.encode())
        size += len(value) if value.isascii() else len(value.encode())
    return size


_KEY_PREFIXES: dict[str, bytes] = {}
"""Encoded length-and-key of property keys seen (producers repeat a few keys)."""
_KEY_PREFIXES_MAX = 1024


def _key_prefix(key: str) -> bytes:
    prefix = _KEY_PREFIXES.get(key)
    if prefix is None:
        kb = key.encode()
        if len(kb) > 0xFFFF:
            raise errors.InvalidArgument(f"property key longer than 65535 bytes: {key[:40]!r}...")
        prefix = _U16.pack(len(kb)) + kb
        if len(_KEY_PREFIXES) >= _KEY_PREFIXES_MAX:
            _KEY_PREFIXES.clear()
        _KEY_PREFIXES[key] = prefix
    return prefix


def encode_properties(props: Mapping[str, str]) -> bytes:
    if not props:
        return b""
    if len(props) > 0xFFFF:
        raise errors.InvalidArgument(f"too many properties: {len(props)} (at most 65535)")
    parts = [_U16.pack(len(props))]
    pack_len = _U32.pack
    for key, value in props.items():
        vb = value.encode()
        parts += [_key_prefix(key), pack_len(len(vb)), vb]
    return b"".join(parts)


def encode(
    msg: Message, max_size: int = DEFAULT_MAX_MESSAGE_BYTES, format_version: int = FORMAT_VERSION
) -> bytes:
    """Encode ``msg`` in ``format_version``; raise MessageTooLarge before
    building anything oversized.

    Values that do not fit the format (text that is not UTF-8 encodable,
    numbers outside 0..2**64-1) raise InvalidArgument, and so does a format
    this release cannot write.
    """
    if format_version != FORMAT_VERSION:
        raise errors.InvalidArgument(_unwritable(format_version))
    try:
        return _encode(msg, max_size)
    except UnicodeError as exc:
        raise errors.InvalidArgument(f"message text is not encodable as UTF-8: {exc}") from None
    except struct.error as exc:
        raise errors.InvalidArgument(
            f"message field out of range (timetick, term and txn_id are 0..2**64-1): {exc}"
        ) from None


def _encode(msg: Message, max_size: int) -> bytes:
    vch = msg.vchannel.encode()
    vlen = len(vch)
    if vlen > 0xFFFF:
        raise errors.InvalidArgument("vchannel name longer than 65535 bytes")
    properties = msg.properties
    payload = msg.payload
    txn_id = msg.txn_id
    size = HEADER_SIZE + vlen + len(payload) + 4
    if txn_id:
        size += 8
    props = b""
    if properties:
        if size + 2 + 6 * len(properties) > max_size:  # too large even without the text
            raise _too_large(size + _properties_size(properties), len(payload), max_size)
        props = encode_properties(properties)
        size += len(props)
    if size > max_size:
        raise _too_large(size, len(payload), max_size)
    # IntEnum type codes pack as they are.
    prefix = _HEADER.pack(
        MAGIC,
        FORMAT_VERSION,
        msg.type,
        _FLAG_TXN if txn_id else 0,
        0,
        vlen,
        msg.timetick,
        msg.term,
        len(payload),
        len(props),
    )
    prefix += vch + _TXN.pack(txn_id) + props if txn_id else vch + props
    # One copy of the payload: the CRC runs over the prefix, then the payload.
    crc = zlib.crc32(payload, zlib.crc32(prefix))
    return b"".join((prefix, payload, _CRC.pack(crc)))


def _unreadable(version: int) -> str:
    if version in _READS:  # a format this release reads, but not as this envelope
        return (
            f"message envelope of format version {version}: only format {FORMAT_VERSION} "
            f"uses this envelope (format {version} records are batches)"
        )
    return (
        f"unsupported message format version {version} "
        f"(this release reads {describe(_READS)}): written by a newer release?"
    )


def _unwritable(format_version: int) -> str:
    if format_version in _WRITES:
        return (
            f"message format {format_version} is written as record batches "
            "(headrace.message.batch), not as single messages"
        )
    return (
        f"cannot encode message format version {format_version} "
        f"(this release writes {describe(_WRITES)})"
    )


def _too_large(size: int, payload: int, max_size: int) -> errors.MessageTooLarge:
    return errors.MessageTooLarge(
        f"message of {size} bytes (payload {payload}) exceeds the "
        f"maximum of {max_size} bytes; nothing was written"
    )


def _check_header(data: bytes | memoryview) -> tuple[int, int, int, int, int, int, int]:
    if len(data) < HEADER_SIZE + 4:
        raise errors.CorruptData(f"message of {len(data)} bytes is shorter than its header")
    magic, version, tcode, flags, _res, vlen, tt, term, plen, rlen = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise errors.CorruptData(f"bad message magic {bytes(magic)!r}; not a Headrace message")
    if version != FORMAT_VERSION:
        raise errors.CorruptData(_unreadable(version))
    if tcode not in _KNOWN_TYPES:
        raise errors.CorruptData(f"unknown message type code {tcode}")
    expected = HEADER_SIZE + vlen + (8 if flags & _FLAG_TXN else 0) + rlen + plen + 4
    if expected != len(data):
        raise errors.CorruptData(
            f"message length {len(data)} does not match its header (expected {expected})"
        )
    return tcode, flags, vlen, tt, term, plen, rlen


def peek(data: bytes | memoryview) -> Header:
    """Read type, vchannel, timetick and term without decoding the rest."""
    tcode, _flags, vlen, tt, term, _plen, _rlen = _check_header(data)
    vch = _decode_vchannel(data[HEADER_SIZE : HEADER_SIZE + vlen])
    return Header(MessageType(tcode), vch, tt, term)


def _decode_vchannel(raw: bytes | memoryview) -> str:
    try:
        return bytes(raw).decode()
    except UnicodeDecodeError:
        raise errors.CorruptData("message vchannel is not valid UTF-8") from None


def decode(data: bytes | memoryview, *, verify: bool = True) -> Message:
    """Decode a whole message; CorruptData on any inconsistency.

    ``verify=False`` skips the CRC for callers whose storage frame already
    checked the same bytes.
    """
    tcode, flags, vlen, tt, term, plen, rlen = _check_header(data)
    view = memoryview(data)
    if verify:
        (crc,) = _CRC.unpack_from(view, len(view) - 4)
        if zlib.crc32(view[:-4]) != crc:
            raise errors.CorruptData("message CRC mismatch")
    if isinstance(data, bytes) and not flags and not rlen:
        # Common case: no txn id, no properties; slice the bytes directly.
        end = HEADER_SIZE + vlen
        vch = _decode_vchannel(data[HEADER_SIZE:end]) if vlen else ""
        return Message(_TYPES[tcode], vch, data[end : end + plen], {}, tt, term, 0)
    pos = HEADER_SIZE
    vch = _decode_vchannel(view[pos : pos + vlen])
    pos += vlen
    txn_id = 0
    if flags & _FLAG_TXN:
        (txn_id,) = _TXN.unpack_from(view, pos)
        pos += 8
    props: dict[str, str] = {}
    if rlen:
        props = decode_properties(view[pos : pos + rlen])
        pos += rlen
    payload = bytes(view[pos : pos + plen])
    return Message(_TYPES[tcode], vch, payload, props, tt, term, txn_id)


def decode_properties(view: memoryview) -> dict[str, str]:
    try:
        (count,) = _U16.unpack_from(view, 0)
        pos = 2
        out: dict[str, str] = {}
        for _ in range(count):
            (klen,) = _U16.unpack_from(view, pos)
            pos += 2
            key = bytes(view[pos : pos + klen]).decode()
            pos += klen
            (vlen,) = _U32.unpack_from(view, pos)
            pos += 4
            out[key] = bytes(view[pos : pos + vlen]).decode()
            pos += vlen
    except (struct.error, UnicodeDecodeError) as exc:
        raise errors.CorruptData(f"malformed message properties: {exc}") from None
    if pos != len(view):
        raise errors.CorruptData("malformed message properties: trailing bytes")
    return out


# -- bulk decoding -------------------------------------------------------------


class Skipped(NamedTuple):
    """A record :func:`decode_block` did not decode in full: its id and header."""

    id: MessageID
    type: MessageType
    vchannel: str
    timetick: int
    term: int


@dataclasses.dataclass(frozen=True, slots=True)
class HeaderFilter:
    """Which messages without a txn id :func:`decode_block` decodes in full.

    The rule of a reader's filters, on header fields only: ``vchannels``
    (empty: any; messages without a vchannel always pass), ``types`` (type
    codes; empty: any) and ``min_timetick`` (inclusive).
    """

    vchannels: frozenset[str] = frozenset()
    types: frozenset[int] = frozenset()
    min_timetick: int = 0

    def accepts(self, type_code: int, vchannel: str, timetick: int) -> bool:
        if self.vchannels and vchannel and vchannel not in self.vchannels:
            return False
        if self.types and type_code not in self.types:
            return False
        return timetick >= self.min_timetick


_MIN_SIZE = HEADER_SIZE + 4
_VCHANNELS: dict[bytes, str] = {}
"""Decoded vchannel names by their bytes (a pchannel carries few of them)."""
_VCHANNELS_MAX = 4096
_new_tuple = tuple.__new__


def _vchannel_of(raw: bytes) -> str:
    name = _decode_vchannel(raw)
    if len(_VCHANNELS) >= _VCHANNELS_MAX:
        _VCHANNELS.clear()
    _VCHANNELS[raw] = name
    return name


def decode_block(
    data: bytes,
    bounds: Sequence[int],
    ids: Sequence[MessageID],
    *,
    verify: bool = True,
    keep: HeaderFilter | None = None,
) -> list[LogEntry | Skipped]:
    """Decode many records of one buffer: record ``i`` is ``data[bounds[2i]:bounds[2i+1]]``.

    Every record is checked as :func:`decode` checks it (``verify`` as
    there) and comes back as ``LogEntry(ids[i], message)``, in order. With
    ``keep``, a message without a txn id that ``keep`` rejects comes back as
    a :class:`Skipped` instead: no payload copied, no message built.
    CorruptData on the first bad record.
    """
    if len(bounds) != 2 * len(ids):
        raise errors.InvalidArgument(
            f"a block of {len(ids)} records needs {2 * len(ids)} bounds, got {len(bounds)}"
        )
    out: list[LogEntry | Skipped] = []
    append = out.append
    unpack, unpack_crc, crc32 = _HEADER.unpack_from, _CRC.unpack_from, zlib.crc32
    view = memoryview(data)
    types, cache, new_tuple, new = _TYPES, _VCHANNELS, _new_tuple, object.__new__
    set_type, set_vch, set_payload, set_props, set_tt, set_term, set_txn = MESSAGE_SLOT_SETTERS
    check = keep is not None
    kv, kt, kmin = (keep.vchannels, keep.types, keep.min_timetick) if keep else (None, None, 0)
    prev_raw, prev_vch = b"", ""
    spans = iter(bounds)
    for mid, start, end in zip(ids, spans, spans, strict=True):
        if end - start < _MIN_SIZE:
            decode(view[start:end], verify=verify)  # raises CorruptData
        magic, version, tcode, flags, _res, vlen, tt, term, plen, rlen = unpack(data, start)
        if verify and crc32(view[start : end - 4]) != unpack_crc(data, end - 4)[0]:
            decode(view[start:end])  # raises: what is wrong with the header, else the CRC
            raise errors.CorruptData("message CRC mismatch")
        if (
            flags
            or rlen
            or magic != MAGIC
            or version != FORMAT_VERSION
            or tcode not in types
            or end - start != HEADER_SIZE + vlen + plen + 4
        ):
            # Transactions and properties, or a bad header (decode() says what).
            msg = decode(view[start:end], verify=False)
            if keep is None or msg.txn_id or keep.accepts(tcode, msg.vchannel, tt):
                append(new_tuple(LogEntry, (mid, msg)))
            else:
                append(new_tuple(Skipped, (mid, msg.type, msg.vchannel, tt, term)))
            continue
        vstart = start + HEADER_SIZE
        pos = vstart + vlen
        if vlen == len(prev_raw) and data.startswith(prev_raw, vstart):
            vch = prev_vch  # the same vchannel as the previous message
        elif vlen:
            prev_raw = data[vstart:pos]
            vch = prev_vch = cache.get(prev_raw) or _vchannel_of(prev_raw)
        else:
            vch = ""
        kind = types[tcode]
        if check and ((kv and vch and vch not in kv) or (kt and tcode not in kt) or tt < kmin):
            append(new_tuple(Skipped, (mid, kind, vch, tt, term)))
            continue
        msg = new(Message)
        set_type(msg, kind)
        set_vch(msg, vch)
        set_payload(msg, data[pos : pos + plen])
        set_props(msg, EMPTY_PROPERTIES)
        set_tt(msg, tt)
        set_term(msg, term)
        set_txn(msg, 0)
        append(new_tuple(LogEntry, (mid, msg)))
    return out

"""On-disk format of the local WAL: segment names, headers and record frames.

Pure functions over bytes; file I/O lives in :mod:`headrace.wal.local.files`.

A segment file ``<base_lsn:020d>-<term:010d>-<seq:04d>.seg`` starts with a
64-byte header (little endian)::

    0   8  magic b"HRWALSEG"
    8   2  format version (3; 1 and 2 are still read)
    10  2  flags (bit 0: the segment has a predecessor)
    12  8  term of the writer that created it
    20  8  base LSN (LSN of its first record)
    28  4  seq: format 2, the epoch of the writer that created it (with the
           term its identity, see :mod:`.fence`); format 1, a number telling
           apart segments of one term opened at the same LSN
    32  8  predecessor base LSN   \
    40  8  predecessor term        | the segment this one continues
    48  4  predecessor seq        /
    52  8  prev_len: valid byte length of the predecessor
    60  4  CRC-32 of bytes 0-59

followed by record frames::

    0   4  body length N
    4   4  checksum over bytes 8 .. 16+N (the LSN and the body)
    8   8  LSN
    16  N  body

The checksum is CRC-32C (Castagnoli, computed in hardware) in format 3
segments and CRC-32 (``zlib``) in formats 1 and 2; the header's own CRC is
CRC-32 in every format. A writer writes its segments in the current format;
a log may hold segments of several formats.
"""

from __future__ import annotations

import dataclasses
import enum
import re
import struct
import zlib
from collections.abc import Callable, Sequence
from typing import NamedTuple

import crc32c

from headrace import errors
from headrace.message.batch import Stamped
from headrace.message.ids import MessageID
from headrace.wal.contract import Record, RecordBlock
from headrace.wal.local.fence import Fence
from headrace.wal.local.message_id import LocalMessageID

MAGIC = b"HRWALSEG"
FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
_HEADER = struct.Struct("<8sHHQQIQQIQ")
_CRC = struct.Struct("<I")
HEADER_SIZE = _HEADER.size + _CRC.size  # 64
_FLAG_PREV = 0x01
FRAME = struct.Struct("<IIQ")
FRAME_SIZE = FRAME.size  # 16
MAX_RECORD_BYTES = 256 * 1024 * 1024
"""Largest record body a frame may carry (the framework's limit is far lower)."""

Checksum = Callable[[bytes | memoryview, int], int]
"""A frame checksum: ``checksum(data, value)`` continues ``value`` over ``data``."""


PREVIOUS_VERSION = 2
"""The segment format the releases writing only message format 1 read and write."""


def version_for(message_format: int) -> int:
    """The segment format a writer of ``message_format`` starts (pure).

    Format 3 only once the cluster writes record batches: the format switch
    waits until every node's release reads message format 2, and every such
    release reads segment format 3; before it, a rollback to the previous
    release must read every segment written."""
    return FORMAT_VERSION if message_format >= 2 else PREVIOUS_VERSION


def frame_checksum(version: int) -> Checksum:
    """The checksum of the frames of a segment of format ``version``."""
    if version >= 3:
        return crc32c.crc32c
    return zlib.crc32


_NAME = re.compile(r"^(\d{20})-(\d{10,})-(\d{4,})\.seg$")
_LSN = struct.Struct("<Q")


class SegmentName(NamedTuple):
    base_lsn: int
    term: int
    seq: int

    @property
    def filename(self) -> str:
        return f"{self.base_lsn:020d}-{self.term:010d}-{self.seq:04d}.seg"


def parse_name(filename: str) -> SegmentName | None:
    """The segment name of ``filename``, or None for any other file."""
    match = _NAME.match(filename)
    if match is None:
        return None
    return SegmentName(int(match[1]), int(match[2]), int(match[3]))


@dataclasses.dataclass(frozen=True, slots=True)
class SegmentHeader:
    name: SegmentName
    prev: SegmentName | None
    prev_len: int
    version: int = FORMAT_VERSION

    @property
    def fence(self) -> Fence:
        """Identity of the writer that created the segment (epoch 0 in format 1)."""
        return Fence(self.name.term, self.name.seq if self.version >= 2 else 0)

    @property
    def head_key(self) -> tuple[int, int, int, int]:
        """Order in which segments take over the log: by the identity of their
        writer, then position (a writer's own segments by LSN)."""
        return (*self.fence, self.name.base_lsn, self.name.seq)

    @property
    def checksum(self) -> Checksum:
        """The checksum of this segment's frames."""
        return frame_checksum(self.version)


def encode_header(header: SegmentHeader) -> bytes:
    prev = header.prev or SegmentName(0, 0, 0)
    body = _HEADER.pack(
        MAGIC,
        header.version,
        _FLAG_PREV if header.prev is not None else 0,
        header.name.term,
        header.name.base_lsn,
        header.name.seq,
        prev.base_lsn,
        prev.term,
        prev.seq,
        header.prev_len,
    )
    return body + _CRC.pack(zlib.crc32(body))


def decode_header(data: bytes, path: str) -> SegmentHeader:
    """Decode and check a header read from ``path``; CorruptData if it is bad."""
    if len(data) < HEADER_SIZE:
        raise errors.CorruptData(
            f"{path}: segment header is {len(data)} bytes, expected 64", path=path, offset=0
        )
    (crc,) = _CRC.unpack_from(data, _HEADER.size)
    if zlib.crc32(data[: _HEADER.size]) != crc:
        raise errors.CorruptData(
            f"{path}: segment header CRC mismatch at byte offset 0", path=path, offset=0
        )
    magic, version, flags, term, base, seq, pbase, pterm, pseq, prev_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise errors.CorruptData(
            f"{path}: not a Headrace WAL segment (magic {magic!r})", path=path, offset=0
        )
    if version not in READABLE_VERSIONS:
        raise errors.CorruptData(
            f"{path}: segment format version {version} is not supported "
            f"(this build reads {', '.join(map(str, READABLE_VERSIONS))})",
            path=path,
            offset=0,
        )
    prev = SegmentName(pbase, pterm, pseq) if flags & _FLAG_PREV else None
    return SegmentHeader(SegmentName(base, term, seq), prev, prev_len, version)


def frame_parts(
    first_lsn: int, records: Sequence[bytes | Stamped], version: int = FORMAT_VERSION
) -> list[bytes | memoryview]:
    """Frames of ``records`` with consecutive LSNs from ``first_lsn`` in a
    segment of format ``version``: each frame header followed by its body
    (the bodies are not copied; a stamped batch not joined yet goes as its
    parts, its checksum run over them in order)."""
    parts: list[bytes | memoryview] = []
    add, extend, pack_lsn, pack_frame = parts.append, parts.extend, _LSN.pack, FRAME.pack
    checksum = frame_checksum(version)
    for lsn, body in enumerate(records, first_lsn):
        crc = checksum(pack_lsn(lsn), 0)
        if isinstance(body, bytes):
            add(pack_frame(len(body), checksum(body, crc), lsn))
            add(body)
            continue
        pieces = body.parts()
        for piece in pieces:
            crc = checksum(piece, crc)
        add(pack_frame(len(body), crc, lsn))
        extend(pieces)
    return parts


def encode_frames(
    first_lsn: int, records: Sequence[bytes | Stamped], version: int = FORMAT_VERSION
) -> bytes:
    """:func:`frame_parts` joined."""
    return b"".join(frame_parts(first_lsn, records, version))


class Stop(enum.Enum):
    """Why :func:`parse_records` stopped."""

    END = "end"
    """Every byte given was consumed."""
    PARTIAL = "partial"
    """The bytes end inside a frame; ``need`` bytes from ``pos`` hold it whole."""
    BAD = "bad"
    """A complete frame at ``pos`` fails its checks (CRC, LSN or length)."""
    FULL = "full"
    """``max_records`` records were parsed."""


class Parsed(NamedTuple):
    """Frames parsed out of ``data``: record ``i`` (LSN ``first_lsn + i``) is
    ``data[bounds[2 * i]:bounds[2 * i + 1]]`` (its body)."""

    data: bytes
    bounds: list[int]
    first_lsn: int
    pos: int
    lsn: int
    stop: Stop
    need: int

    @property
    def n_records(self) -> int:
        """Records parsed (also when their bounds were not kept)."""
        return self.lsn - self.first_lsn

    def block(self, skip: int = 0) -> RecordBlock:
        """The records from the ``skip``-th on, as a verified block."""
        first = self.first_lsn + skip
        return RecordBlock(
            lsn_ids(first, self.lsn - first), self.data, self.bounds[2 * skip :], True
        )

    def records(self) -> list[Record]:
        return self.block().records()


def lsn_ids(first: int, count: int) -> list[MessageID]:
    """Ids of ``count`` consecutive LSNs from ``first`` (which are in range)."""
    out: list[MessageID] = []
    append, new_id, id_class = out.append, object.__new__, LocalMessageID
    for lsn in range(first, first + count):
        mid = new_id(id_class)  # skip the constructor's range check
        mid.lsn = lsn
        append(mid)
    return out


def parse_records(
    data: bytes,
    pos: int,
    end: int,
    lsn: int,
    max_records: int,
    *,
    checksum: Checksum,
    with_bounds: bool = True,
) -> Parsed:
    """Parse frames in ``data[pos:end]`` whose LSNs continue from ``lsn``,
    checked with the segment's ``checksum``.

    With ``with_bounds=False`` frames are checked but their bounds are not
    kept (recovery scans). This is the hot loop of every scan: one
    ``unpack`` and one checksum per frame, no object per record.
    """
    bounds: list[int] = []
    add = bounds.append
    view = memoryview(data)
    unpack = FRAME.unpack_from
    first = lsn
    last = lsn + max_records
    while pos < end:
        if lsn >= last:
            return Parsed(data, bounds, first, pos, lsn, Stop.FULL, 0)
        if end - pos < FRAME_SIZE:
            return Parsed(data, bounds, first, pos, lsn, Stop.PARTIAL, FRAME_SIZE)
        length, crc, frame_lsn = unpack(view, pos)
        if length > MAX_RECORD_BYTES or frame_lsn != lsn:
            return Parsed(data, bounds, first, pos, lsn, Stop.BAD, 0)
        stop = pos + FRAME_SIZE + length
        if stop > end:
            return Parsed(data, bounds, first, pos, lsn, Stop.PARTIAL, FRAME_SIZE + length)
        if checksum(view[pos + 8 : stop], 0) != crc:
            return Parsed(data, bounds, first, pos, lsn, Stop.BAD, 0)
        if with_bounds:
            add(pos + FRAME_SIZE)
            add(stop)
        lsn += 1
        pos = stop
    return Parsed(data, bounds, first, pos, lsn, Stop.END, 0)


def frame_valid_at(view: memoryview, pos: int, lsn: int, checksum: Checksum) -> bool:
    """Whether a complete frame with LSN ``lsn`` and a good checksum starts at ``pos``."""
    if pos < 0 or len(view) - pos < FRAME_SIZE:
        return False
    length, crc, frame_lsn = FRAME.unpack_from(view, pos)
    stop = pos + FRAME_SIZE + length
    if frame_lsn != lsn or length > MAX_RECORD_BYTES or stop > len(view):
        return False
    return bool(checksum(view[pos + 8 : stop], 0) == crc)


def find_valid_frame(data: bytes, pos: int, lsn: int, checksum: Checksum) -> int | None:
    """Offset of a valid frame with LSN ``lsn`` at or after ``pos``, if any.

    Used behind a bad frame: the frame that follows it is found by its LSN
    even when the bad frame's own length field is damaged.
    """
    needle = _LSN.pack(lsn)
    view = memoryview(data)
    start = pos + 8
    while True:
        hit = data.find(needle, start)
        if hit < 0:
            return None
        if frame_valid_at(view, hit - 8, lsn, checksum):
            return hit - 8
        start = hit + 1


def hop(view: memoryview, pos: int, end: int, lsn: int, target: int) -> tuple[int, int]:
    """Skip frames below LSN ``target`` without checking CRCs (they are not read).

    Stops at ``target``, at the end of the bytes, or at anything unexpected,
    leaving the frame there to the checking parser.
    """
    unpack = FRAME.unpack_from
    while lsn < target and end - pos >= FRAME_SIZE:
        length, _crc, frame_lsn = unpack(view, pos)
        stop = pos + FRAME_SIZE + length
        if frame_lsn != lsn or length > MAX_RECORD_BYTES or stop > end:
            break
        pos = stop
        lsn += 1
    return pos, lsn

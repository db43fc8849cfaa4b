"""Blocking reads of segment files in large chunks (run them in a thread)."""

from __future__ import annotations

import dataclasses
import os

from headrace import errors
from headrace.wal.contract import Record
from headrace.wal.local import segment
from headrace.wal.local.chain import Chain, Link
from headrace.wal.local.segment import FRAME, HEADER_SIZE, Checksum, Parsed, Stop

CHUNK_BYTES = 2 * 1024 * 1024
ALL = 1 << 62
"""``max_records`` for no limit."""


def read_chunk(
    fd: int,
    pos: int,
    lsn: int,
    end: int | None,
    max_records: int,
    *,
    checksum: Checksum,
    with_bounds: bool = True,
) -> Parsed:
    """Parse the frames of one chunk starting at byte ``pos`` of the file
    (a segment whose frames carry ``checksum``).

    ``end`` bounds the read (None: to the end of the file). The result's
    ``pos`` is a file position; its record bounds index its ``data``. An
    empty result with ``Stop.END`` means no bytes were left;
    ``PARTIAL``/``BAD`` describe the frame at ``pos``.
    """
    want = CHUNK_BYTES if end is None else min(CHUNK_BYTES, end - pos)
    if want <= 0:
        return Parsed(b"", [], lsn, pos, lsn, Stop.END, 0)
    data = os.pread(fd, want, pos)
    parsed = segment.parse_records(
        data, 0, len(data), lsn, max_records, checksum=checksum, with_bounds=with_bounds
    )
    if parsed.stop is Stop.PARTIAL and parsed.pos == 0 and len(data) == want < parsed.need:
        want = parsed.need if end is None else min(parsed.need, end - pos)
        data = os.pread(fd, want, pos)
        parsed = segment.parse_records(
            data, 0, len(data), lsn, max_records, checksum=checksum, with_bounds=with_bounds
        )
    return parsed._replace(pos=pos + parsed.pos)


def corrupt_frame(path: str, pos: int, lsn: int, why: str) -> errors.CorruptData:
    return errors.CorruptData(
        f"{path}: record {lsn} at byte offset {pos} is corrupt ({why}); records are never "
        "skipped: restore the segment file from a copy, or keep the records before it with "
        "`headrace wal repair`",
        path=path,
        offset=pos,
    )


def check_bad_tail(fd: int, link: Link, pos: int, lsn: int) -> None:
    """A bad frame at ``pos`` is a torn tail unless valid records follow it."""
    if valid_records_follow(fd, link, pos, lsn):
        raise corrupt_frame(link.path, pos, lsn, "CRC or LSN mismatch, valid records follow")


def valid_records_follow(fd: int, link: Link, pos: int, lsn: int) -> bool:
    """Whether a valid record ``lsn + 1`` lies behind the bad frame at ``pos``
    (damage in the middle of the log, not a torn tail)."""
    chunks, offset = [], pos
    while chunk := os.pread(fd, CHUNK_BYTES, offset):
        chunks.append(chunk)
        offset += len(chunk)
    rest = b"".join(chunks)
    view = memoryview(rest)
    checksum = link.header.checksum
    if len(rest) >= FRAME.size:
        length = FRAME.unpack_from(view, 0)[0]
        if segment.frame_valid_at(view, FRAME.size + length, lsn + 1, checksum):
            return True
    return segment.find_valid_frame(rest, 0, lsn + 1, checksum) is not None


def find_damage(fd: int, link: Link) -> tuple[int, int] | None:
    """Byte position and LSN of the first damaged record of the segment, or
    None: a segment with a successor must be valid up to its recorded length;
    the head may end in a torn tail (cut away when a writer opens)."""
    pos, lsn = HEADER_SIZE, link.base_lsn
    while True:
        parsed = read_chunk(
            fd, pos, lsn, link.limit, ALL, checksum=link.header.checksum, with_bounds=False
        )
        if parsed.lsn > lsn:
            pos, lsn = parsed.pos, parsed.lsn
            continue
        if link.limit is not None:
            return None if pos == link.limit else (pos, lsn)
        if parsed.stop is Stop.BAD and valid_records_follow(fd, link, pos, lsn):
            return pos, lsn
        return None


def open_segment(link: Link) -> int | None:
    """A read descriptor of the segment, or None if it was deleted."""
    try:
        return os.open(link.path, os.O_RDONLY)
    except FileNotFoundError:
        return None


def strict_failure(link: Link, parsed: Parsed) -> errors.CorruptData:
    """The error for a segment that does not parse up to its known limit."""
    if parsed.stop is Stop.END:
        return errors.CorruptData(
            f"{link.path}: ends at byte offset {parsed.pos} but {link.limit} bytes of it "
            "were recorded as valid",
            path=link.path,
            offset=parsed.pos,
        )
    why = "cut off inside the record" if parsed.stop is Stop.PARTIAL else "CRC or LSN mismatch"
    return corrupt_frame(link.path, parsed.pos, parsed.lsn, why)


def scan_end(fd: int, link: Link, start: tuple[int, int] | None = None) -> tuple[int, int]:
    """Byte position and LSN of the end of the segment's valid records.

    A bounded segment must be valid up to its limit exactly. The head ends at
    its last complete valid record: a partial or bad last record is a torn
    tail; a bad record followed by valid ones raises CorruptData. ``start``:
    a position and LSN this segment was already found valid up to.
    """
    pos, lsn = start if start is not None else (HEADER_SIZE, link.base_lsn)
    while True:
        parsed = read_chunk(
            fd, pos, lsn, link.limit, ALL, checksum=link.header.checksum, with_bounds=False
        )
        if parsed.lsn > lsn:
            pos, lsn = parsed.pos, parsed.lsn
            continue
        if link.limit is not None:
            if pos == link.limit:
                return pos, lsn
            raise strict_failure(link, parsed)
        if parsed.stop is Stop.BAD:
            check_bad_tail(fd, link, pos, lsn)
        return pos, lsn


def skip_to(fd: int, link: Link, target: int) -> tuple[int, int]:
    """Byte position and LSN of record ``target`` or of the first frame before it
    that cannot be skipped quickly; the records skipped are not checked (they
    are not delivered), the caller parses the rest with checks.
    """
    pos, lsn = HEADER_SIZE, link.base_lsn
    while lsn < target:
        want = CHUNK_BYTES if link.limit is None else min(CHUNK_BYTES, link.limit - pos)
        if want <= 0:
            break
        view = memoryview(os.pread(fd, want, pos))
        step, after = segment.hop(view, 0, len(view), lsn, target)
        if step == 0:
            break
        pos, lsn = pos + step, after
    return pos, lsn


def read_record(fd: int, link: Link, target: int) -> Record:
    """Record ``target`` of the segment, which is known to hold it."""
    pos, lsn = skip_to(fd, link, target)
    while True:
        parsed = read_chunk(
            fd, pos, lsn, link.limit, target - lsn + 1, checksum=link.header.checksum
        )
        if not parsed.n_records:
            raise strict_failure(link, parsed)
        if parsed.lsn > target:
            return parsed.records()[target - lsn]
        pos, lsn = parsed.pos, parsed.lsn


def bound_last(chain: Chain) -> Chain:
    """A broken chain (see :mod:`.chain`) with the byte length of its last link
    measured: up to the record at its ``end_lsn`` (the damaged segment's base
    LSN), or where quick skipping stops before it, for readers to check."""
    last = chain.links[-1]
    assert last.end_lsn is not None
    fd = open_segment(last)
    if fd is None:
        limit = HEADER_SIZE
    else:
        try:
            limit = skip_to(fd, last, last.end_lsn)[0]
        finally:
            os.close(fd)
    return dataclasses.replace(
        chain, links=(*chain.links[:-1], dataclasses.replace(last, limit=limit))
    )


def last_record(chain: Chain) -> Record | None:
    """The last record of the chain at or above its truncation marker;
    CorruptData if the chain is broken (its last record is past the damage)."""
    if chain.broken is not None:
        raise chain.broken
    for link in reversed(chain.links):
        fd = open_segment(link)
        if fd is None:
            return None
        try:
            end = scan_end(fd, link)[1]
            if end == link.base_lsn:
                continue
            if end - 1 < chain.marker:
                return None
            return read_record(fd, link, end - 1)
        finally:
            os.close(fd)
    return None


def end_lsn(chain: Chain) -> int:
    """LSN the next appended record will get (as far as readable now)."""
    head = chain.head
    if head is None:
        return 0
    fd = open_segment(head)
    if fd is None:
        return head.base_lsn
    try:
        return scan_end(fd, head)[1]
    finally:
        os.close(fd)

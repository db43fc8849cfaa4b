"""Blocking file operations of the local WAL (run them in a worker thread).

The term file ``TERM`` holds the identity (term, epoch) of the newest writer
(see :mod:`.fence`); it is rewritten in place (a 20-byte ``pwrite`` plus
``fsync``), so writers can check it with one ``pread`` on a descriptor they
keep. The ``TRUNCATED`` marker holds
the first LSN still readable and is replaced atomically.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
import struct
import time
import zlib
from collections.abc import Iterator

from headrace import errors
from headrace.wal.local import fence, segment
from headrace.wal.local.segment import SegmentHeader, SegmentName

TERM_FILE = "TERM"
TRUNCATED_FILE = "TRUNCATED"
MARKER_LOCK_FILE = "TRUNCATED.lock"
_VALUE = struct.Struct("<QI")
_STALE_TMP_SECONDS = 60.0
_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def storage_error(exc: OSError, what: str) -> errors.HeadraceError:
    """Translate an OSError of ``what`` into StorageFull or Unavailable."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    if exc.errno in _FULL_ERRNOS:
        return errors.StorageFull(
            f"{what}: {reason}; nothing of this write was acknowledged, acknowledged "
            "records are intact; free space (or raise the file size limit) and retry"
        )
    return errors.Unavailable(f"{what}: {reason}")


def fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_data(fd: int) -> None:
    """fdatasync where it exists (it covers the size of an appended file)."""
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:
        os.fsync(fd)


def ensure_dir(path: str) -> None:
    """Create ``path`` (and parents) durably if it does not exist."""
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path.rstrip("/")) or "."
    ensure_dir(parent)
    with contextlib.suppress(FileExistsError):
        os.mkdir(path)
    fsync_dir(parent)


def _encode_value(value: int) -> bytes:
    raw = struct.pack("<Q", value)
    return _VALUE.pack(value, zlib.crc32(raw))


def _decode_value(data: bytes, path: str) -> int:
    if not data:
        return 0
    if len(data) != _VALUE.size:
        raise errors.CorruptData(f"{path}: expected {_VALUE.size} bytes, found {len(data)}")
    value, crc = _VALUE.unpack(data)
    if zlib.crc32(struct.pack("<Q", value)) != crc:
        raise errors.CorruptData(f"{path}: CRC mismatch at byte offset 0")
    return int(value)


def open_term_file(directory: str, *, write: bool) -> int:
    """Descriptor of the term file; created (empty: no writer yet) for writers."""
    path = os.path.join(directory, TERM_FILE)
    if not write:
        return os.open(path, os.O_RDONLY)
    existed = os.path.exists(path)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    if not existed:
        fsync_dir(directory)
    return fd


def read_term_bytes(fd: int) -> bytes:
    """The bytes of the term file (one more than an identity takes, to see
    trailing garbage)."""
    return os.pread(fd, fence.ENCODED_SIZE + 1, 0)


def read_fence(fd: int, path: str) -> fence.Fence:
    """The writer identity stored in the term file."""
    return fence.decode(read_term_bytes(fd), path)


LOCK_WAIT = 5.0
"""Longest wait for a term or marker lock. Holders keep them for a few system
calls; one held longer belongs to a paused (SIGSTOPped) or stuck process, and
the caller gets a retryable error instead of hanging with it."""
_LOCK_POLL = 0.005


def _lock(fd: int, path: str) -> None:
    """``flock`` ``fd`` exclusively within :data:`LOCK_WAIT` (else Unavailable)."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise errors.Unavailable(
                    f"{path} stayed locked by another process for {LOCK_WAIT:g} s (a paused or "
                    "stuck process?); retry"
                ) from None
            time.sleep(_LOCK_POLL)


def claim_fence(fd: int, path: str, term: int, pchannel: str) -> fence.Fence:
    """Store a new writer identity under ``term`` durably and return it.

    Fenced if a higher term is stored. A short ``flock`` makes the read, the
    decision and the write one step across processes; it is held for one
    ``pwrite`` and ``fsync``, never while writing records or truncating. The
    segments are listed before it is taken: a segment created later belongs
    to an identity already stored.
    """
    floor = max((name.seq for name in list_segments(os.path.dirname(path))), default=0)
    _lock(fd, path)
    try:
        claimed = fence.claim(read_fence(fd, path), term, floor, pchannel)
        os.pwrite(fd, fence.encode(claimed), 0)
        os.fsync(fd)
        return claimed
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


@contextlib.contextmanager
def marker_lock(directory: str) -> Iterator[None]:
    """Hold the lock that orders updates of the truncation marker.

    A file of its own (``TRUNCATED.lock``), so an owner paused while
    truncating never holds up a new owner's claim of the term file. Each
    holder opens its own descriptor: ``flock`` excludes other open file
    descriptions, in this process as in others.
    """
    path = os.path.join(directory, MARKER_LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        _lock(fd, path)
        yield
    finally:
        os.close(fd)


def lock_directory(directory: str, *, exclusive: bool) -> int | None:
    """A descriptor of ``directory`` that holds its ``flock``, or None if
    ``exclusive`` was asked for and somebody holds it.

    Writers hold it shared (waiting for a repair in progress); ``headrace wal
    repair`` takes it exclusively without waiting, so it never changes the
    files of a pchannel a node is writing. Closing the descriptor releases it.
    """
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if exclusive:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        else:
            fcntl.flock(fd, fcntl.LOCK_SH)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_marker(directory: str) -> int:
    """First LSN still readable (0 when nothing was truncated)."""
    path = os.path.join(directory, TRUNCATED_FILE)
    try:
        with open(path, "rb") as fh:
            return _decode_value(fh.read(_VALUE.size + 1), path)
    except FileNotFoundError:
        return 0


def write_marker(directory: str, lsn: int) -> None:
    _replace(directory, TRUNCATED_FILE, _encode_value(lsn))


def _tmp_name(final: str) -> str:
    return f".{final}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _replace(directory: str, name: str, data: bytes) -> None:
    tmp = os.path.join(directory, _tmp_name(name))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, os.path.join(directory, name))
    fsync_dir(directory)


def remove_stale_tmp(directory: str) -> None:
    """Remove temporary files left by a crash (older than a minute)."""
    now = time.time()
    for entry in os.scandir(directory):
        if entry.name.endswith(".tmp"):
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat().st_mtime > _STALE_TMP_SECONDS:
                    os.unlink(entry.path)


def list_segments(directory: str) -> list[SegmentName]:
    """Segment names in ``directory`` in LSN order; [] if it does not exist."""
    try:
        entries = os.listdir(directory)
    except FileNotFoundError:
        return []
    names = [name for name in map(segment.parse_name, entries) if name is not None]
    names.sort()
    return names


def read_header(directory: str, name: SegmentName) -> SegmentHeader | None:
    """The header of segment ``name``, or None if the file is gone."""
    path = os.path.join(directory, name.filename)
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        header = segment.decode_header(os.pread(fd, segment.HEADER_SIZE, 0), path)
    finally:
        os.close(fd)
    if header.name != name:
        raise errors.CorruptData(
            f"{path}: header names segment {header.name.filename}", path=path, offset=0
        )
    return header


SYNC_WRITES = getattr(os, "O_DSYNC", 0)
"""Open flag that makes every write durable before it returns (0 where missing)."""


def create_segment(directory: str, header: SegmentHeader, *, sync_writes: bool = False) -> int:
    """Create the segment file of ``header`` and return a descriptor to append.

    The header is written and synced under a temporary name and then linked
    into place, so no reader ever sees a segment without a complete header.
    With ``sync_writes`` (and where the platform has ``O_DSYNC``) every write
    through the descriptor is durable when it returns, as if followed by
    ``fdatasync``: one system call per write instead of two.
    CorruptData if the name is taken: a name holds its writer's identity,
    which no other open shares.
    """
    final = header.name.filename
    tmp = os.path.join(directory, _tmp_name(final))
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | (SYNC_WRITES if sync_writes else 0)
    fd = os.open(tmp, flags, 0o644)
    try:
        os.write(fd, segment.encode_header(header))
        os.fsync(fd)
        os.link(tmp, os.path.join(directory, final))
    except FileExistsError:
        os.close(fd)
        raise errors.CorruptData(
            f"{os.path.join(directory, final)} exists already: the identity "
            f"{header.fence.describe()} was given to two writers"
        ) from None
    except BaseException:
        os.close(fd)
        raise
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
    fsync_dir(directory)
    return fd


def write_all(fd: int, data: bytes, offset: int) -> None:
    """pwrite all of ``data`` at ``offset`` (a short write is continued)."""
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written


def _iov_max() -> int:
    """Most buffers one ``pwritev`` takes here (POSIX guarantees 16)."""
    if "SC_IOV_MAX" not in getattr(os, "sysconf_names", {}):
        return 16
    return max(16, os.sysconf("SC_IOV_MAX"))


IOV_MAX = _iov_max()
_PWRITEV = getattr(os, "pwritev", None)


def write_parts(fd: int, parts: list[bytes | memoryview], size: int, offset: int) -> None:
    """Write the concatenation of ``parts`` (``size`` bytes) at ``offset``.

    One ``pwritev`` of the parts as they are, without copying them into one
    buffer, when the platform has it and they fit one call; otherwise (and to
    continue a short write) the bytes are joined and written with ``pwrite``.
    """
    if _PWRITEV is None or len(parts) > IOV_MAX:
        write_all(fd, b"".join(parts), offset)
        return
    written = _PWRITEV(fd, parts, offset)
    if written < size:
        write_all(fd, b"".join(parts)[written:], offset + written)

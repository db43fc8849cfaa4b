"""Frame checksums of the local WAL (issue #14).

Segments of format 3 check their frames with CRC-32C (computed in hardware,
about twenty times cheaper than ``zlib.crc32`` per byte); formats 1 and 2,
written before, check them with CRC-32 and are still read, and a log may hold
segments of both. Whatever the format, a frame whose checksum does not match
is a torn tail at the end of the newest segment and damage anywhere else.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

import crc32c
import pytest

from headrace import errors
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.contract import StartPosition
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import LocalBackend, LocalMessageID, fence, files, segment
from headrace.wal.local.dump import iter_dump
from headrace.wal.local.fence import Fence
from headrace.wal.local.segment import FRAME, HEADER_SIZE, SegmentHeader, SegmentName

from .conformance import read_all, read_n

P = "p0"
_LSN = struct.Struct("<Q")


def crc32_frame(lsn: int, body: bytes) -> bytes:
    """A frame as formats 1 and 2 write it (CRC-32 over the LSN and the body),
    built here without the module's encoder."""
    return FRAME.pack(len(body), zlib.crc32(body, zlib.crc32(_LSN.pack(lsn))), lsn) + body


def crc32c_frame(lsn: int, body: bytes) -> bytes:
    """A frame as format 3 writes it (CRC-32C over the LSN and the body)."""
    return FRAME.pack(len(body), crc32c.crc32c(body, crc32c.crc32c(_LSN.pack(lsn))), lsn) + body


def frames_of(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """(offset, checksum, lsn, body) of every frame after the header."""
    out, pos = [], HEADER_SIZE
    while pos + FRAME.size <= len(data):
        length, checksum, lsn = FRAME.unpack_from(data, pos)
        body = data[pos + FRAME.size : pos + FRAME.size + length]
        out.append((pos, checksum, lsn, body))
        pos += FRAME.size + length
    return out


def write_old_segment(root: Path, frames: bytes, *, version: int = 2) -> Path:
    """A pchannel directory as the code before format 3 left it: a term file
    holding the writer of term 4 and its segment of format ``version`` (epoch
    1; format 1 had no epochs)."""
    directory = root / P
    directory.mkdir()
    epoch = 0 if version == 1 else 1
    (directory / files.TERM_FILE).write_bytes(fence.encode(Fence(4, epoch)))
    name = SegmentName(0, 4, epoch)
    header = segment.encode_header(SegmentHeader(name, None, 0, version=version))
    path = directory / name.filename
    path.write_bytes(header + frames)
    return path


async def test_new_segments_are_format_3_with_crc32c_frames(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 1)
    bodies = [b"first", b"x" * 70_000, b""]
    assert await writer.append(bodies) == [LocalMessageID(i) for i in range(3)]
    await backend.close()
    (path,) = (tmp_path / P).glob("*.seg")
    data = path.read_bytes()
    assert struct.unpack_from("<H", data, 8) == (3,)
    frames = frames_of(data)
    assert [(lsn, body) for _, _, lsn, body in frames] == list(enumerate(bodies))
    for _, checksum, lsn, body in frames:
        assert checksum == crc32c.crc32c(body, crc32c.crc32c(_LSN.pack(lsn)))
        assert checksum != zlib.crc32(body, zlib.crc32(_LSN.pack(lsn)))


@pytest.mark.parametrize("version", [1, 2])
async def test_segments_of_earlier_formats_are_read_and_continued(
    tmp_path: Path, version: int
) -> None:
    old = [b"old-0", b"old-1", b"old-2"]
    write_old_segment(
        tmp_path, b"".join(crc32_frame(i, b) for i, b in enumerate(old)), version=version
    )
    backend = LocalBackend(str(tmp_path))
    assert [r.data for r in await read_all(backend, P, 3)] == old
    writer = await backend.open_writer(P, 4)
    assert await writer.append([b"new-3"]) == [LocalMessageID(3)]
    await backend.close()

    names = files.list_segments(str(tmp_path / P))
    versions = [files.read_header(str(tmp_path / P), name) for name in names]
    assert [h.version for h in versions if h is not None] == [version, 3]
    again = LocalBackend(str(tmp_path))
    records = await read_all(again, P, 4)
    assert [r.data for r in records] == [*old, b"new-3"]
    assert [r.id for r in records] == [LocalMessageID(i) for i in range(4)]
    assert (await again.last_record(P)) == records[-1]
    await again.close()
    assert [row.id for row in iter_dump(str(tmp_path), P)] == [f"local:{i}" for i in range(4)]


async def test_a_torn_tail_of_an_old_format_segment_is_cut_on_reopen(tmp_path: Path) -> None:
    frames = crc32_frame(0, b"a") + crc32_frame(1, b"b")
    torn = crc32_frame(2, b"torn-record")[:-3]
    write_old_segment(tmp_path, frames + torn)
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 4)
    assert await writer.append([b"c"]) == [LocalMessageID(2)]
    assert [r.data for r in await read_all(backend, P, 3)] == [b"a", b"b", b"c"]
    await backend.close()


async def test_damage_in_an_old_format_segment_is_found(tmp_path: Path) -> None:
    frames = [crc32_frame(i, b"record-%d" % i) for i in range(4)]
    damaged = bytearray(frames[1])
    damaged[FRAME.size] ^= 0xFF
    frames[1] = bytes(damaged)
    path = write_old_segment(tmp_path, b"".join(frames))
    offset = HEADER_SIZE + len(frames[0])
    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    assert [r.data for r in await read_n(reader, 1)] == [b"record-0"]
    with pytest.raises(errors.CorruptData) as corrupt:
        await reader.next_batch(timeout=1)
    assert (corrupt.value.path, corrupt.value.offset) == (str(path), offset)
    with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
        await backend.open_writer(P, 5)
    await backend.close()


@pytest.mark.parametrize(
    ("kind", "last"),
    [
        ("crc32-in-format-3", True),
        ("crc32-in-format-3", False),
        ("flipped", True),
        ("flipped", False),
    ],
)
async def test_a_format_3_frame_that_fails_its_crc32c_is_a_torn_tail_or_damage(
    tmp_path: Path, kind: str, last: bool
) -> None:
    """A frame of a format 3 segment is checked with CRC-32C only: one with an
    (otherwise valid) CRC-32, as an older writer would frame it, fails like a
    frame with a flipped bit. At the end of the newest segment that is a torn
    tail, cut away when a writer opens; followed by valid records it is damage."""
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 1)
    await writer.append([b"a", b"b"])
    await backend.close()
    (path,) = (tmp_path / P).glob("*.seg")
    bad = (
        crc32_frame(2, b"bad")
        if kind == "crc32-in-format-3"
        else bytearray(crc32c_frame(2, b"bad"))
    )
    if isinstance(bad, bytearray):
        bad[FRAME.size + 1] ^= 0x01
    offset = path.stat().st_size
    with path.open("ab") as fh:
        fh.write(bytes(bad) + (b"" if last else crc32c_frame(3, b"after")))

    backend = LocalBackend(str(tmp_path))
    if last:
        writer = await backend.open_writer(P, 2)
        assert await writer.append([b"c"]) == [LocalMessageID(2)]
        assert [r.data for r in await read_all(backend, P, 3)] == [b"a", b"b", b"c"]
    else:
        with pytest.raises(errors.CorruptData) as corrupt:
            await backend.open_writer(P, 2)
        assert (corrupt.value.path, corrupt.value.offset) == (str(path), offset)
        reader = await backend.open_reader(P, StartPosition.earliest())
        assert [r.data for r in await read_n(reader, 2)] == [b"a", b"b"]
        with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
            await reader.next_batch(timeout=1)
    await backend.close()


def test_every_readable_format_has_a_checksum_and_newer_formats_are_refused() -> None:
    assert segment.frame_checksum(1) is zlib.crc32
    assert segment.frame_checksum(2) is zlib.crc32
    assert segment.frame_checksum(3) is crc32c.crc32c
    header = segment.encode_header(SegmentHeader(SegmentName(0, 1, 1), None, 0, version=4))
    with pytest.raises(errors.CorruptData, match="version 4 is not supported"):
        segment.decode_header(header, "x.seg")


def segment_versions(root: Path) -> list[int]:
    """The format of every segment of ``P``, oldest first."""
    return [
        struct.unpack_from("<H", path.read_bytes(), 8)[0]
        for path in sorted((root / P).glob("*.seg"))
    ]


@pytest.mark.parametrize(("message_format", "expected"), [(1, 2), (2, 3)])
async def test_a_wal_starts_segment_format_3_only_once_it_writes_record_batches(
    tmp_path: Path, message_format: int, expected: int
) -> None:
    """Until the cluster's format switch (message format 1), the segments written
    are of format 2, which the previous release reads, so a rollback reads them;
    rolled segments keep their writer's format."""
    backend = LocalBackend(str(tmp_path), segment_bytes=4096)
    options = WALOptions(message_format=message_format, timetick_interval_ms=1000)
    wal = await WAL.open(backend, P, 1, tso=LocalTSO(), options=options)
    for i in range(8):
        await wal.append(Message(MessageType.INSERT, "v", b"x" * 1000 + bytes([i]), {}))
    await wal.close()
    await backend.close()
    versions = segment_versions(tmp_path)
    assert len(versions) > 2
    assert set(versions) == {expected}
    reread = LocalBackend(str(tmp_path))
    reader = await reread.open_reader(P, StartPosition.earliest())
    stored = b""
    while batch := await reader.next_batch(timeout=0.05):
        stored += b"".join(bytes(record.data) for record in batch)
    await reread.close()
    assert all(b"x" * 1000 + bytes([i]) in stored for i in range(8))


def test_segment_format_follows_the_message_format() -> None:
    assert segment.version_for(1) == segment.PREVIOUS_VERSION == 2
    assert segment.version_for(2) == segment.FORMAT_VERSION == 3

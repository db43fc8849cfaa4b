"""A damaged segment header stops the log like a damaged record at offset 0 of
that segment: readers get every record of the earlier segments and then
CORRUPT naming the file and offset 0; last_record, LATEST and the writer do
not skip it. Headers are written whole under a temporary name before the
segment is linked into place, so a crash leaves no torn header under a
segment's name: a torn temporary file is ignored, and a damaged header of the
newest segment is damage like any other."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from headrace import errors
from headrace.wal.contract import Record, StartPosition
from headrace.wal.local import LocalBackend, files, segment
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.segment import SegmentHeader, SegmentName

from .conformance import read_all
from .test_local_backend import P, segment_paths, write

WAIT = 10.0


def damage_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF  # the base LSN field: the header's CRC fails
    path.write_bytes(bytes(data))


async def three_terms(root: Path, last: list[bytes]) -> list[Path]:
    """Segments of terms 1 (a, b), 2 (c) and 3 (``last``)."""
    await write(root, [b"a", b"b"])
    await write(root, [b"c"], term=2)
    await write(root, last, term=3)
    return segment_paths(root)


async def read_until_corrupt(
    backend: LocalBackend, start: StartPosition
) -> tuple[list[bytes], errors.CorruptData]:
    reader = await backend.open_reader(P, start)
    got: list[Record] = []
    try:
        with pytest.raises(errors.CorruptData) as corrupt:
            async with asyncio.timeout(WAIT):
                while True:
                    got += await reader.next_batch(timeout=WAIT)
    finally:
        await reader.close()
    return [r.data for r in got], corrupt.value


def located(exc: errors.CorruptData) -> tuple[str, int]:
    return exc.path, exc.offset


@pytest.mark.parametrize(
    ("damaged", "before"),
    [(0, []), (1, [b"a", b"b"]), (2, [b"a", b"b", b"c"])],
    ids=["first", "middle", "newest"],
)
async def test_readers_get_the_earlier_segments_then_corrupt_at_offset_0(
    tmp_path: Path, damaged: int, before: list[bytes]
) -> None:
    paths = await three_terms(tmp_path, [b"d"])
    damage_header(paths[damaged])
    where = (str(paths[damaged]), 0)
    backend = LocalBackend(str(tmp_path))
    try:
        got, corrupt = await read_until_corrupt(backend, StartPosition.earliest())
        assert (got, located(corrupt)) == (before, where)
        if before:  # a reader starting inside the earlier segments
            got, corrupt = await read_until_corrupt(backend, StartPosition.at(LocalMessageID(1)))
            assert (got, located(corrupt)) == (before[1:], where)
        # positions past the damage cannot be found: not skipped, not waited on
        _, corrupt = await read_until_corrupt(backend, StartPosition.at(LocalMessageID(3)))
        assert located(corrupt) == where
        with pytest.raises(errors.CorruptData) as last:
            await backend.last_record(P)
        assert located(last.value) == where
        with pytest.raises(errors.CorruptData) as latest:
            await backend.open_reader(P, StartPosition.latest())
        assert located(latest.value) == where
        with pytest.raises(errors.CorruptData) as refused:
            await backend.open_writer(P, 4)
        assert located(refused.value) == where
    finally:
        await backend.close()
    assert segment_paths(tmp_path) == paths  # nothing was created or removed


async def test_an_empty_newest_segment_with_a_damaged_header_is_damage(tmp_path: Path) -> None:
    """The newest segment holds no record yet (its writer opened, then the
    node stopped): its header was still written whole before it got its name,
    so damage there is not a torn tail and is not cut away."""
    paths = await three_terms(tmp_path, [])
    damage_header(paths[2])
    backend = LocalBackend(str(tmp_path))
    try:
        got, corrupt = await read_until_corrupt(backend, StartPosition.earliest())
        assert (got, located(corrupt)) == ([b"a", b"b", b"c"], (str(paths[2]), 0))
        with pytest.raises(errors.CorruptData):
            await backend.open_writer(P, 4)
    finally:
        await backend.close()


async def test_a_torn_header_left_by_a_crash_while_creating_a_segment_is_ignored(
    tmp_path: Path,
) -> None:
    paths = await three_terms(tmp_path, [b"d"])
    name = SegmentName(4, 4, 0)
    header = segment.encode_header(SegmentHeader(name, SegmentName(4, 3, 0), 100))
    (tmp_path / P / f".{name.filename}.999.0badcafe.tmp").write_bytes(header[:30])
    backend = LocalBackend(str(tmp_path))
    try:
        records = await read_all(backend, P, 4)
        assert [r.data for r in records] == [b"a", b"b", b"c", b"d"]
        writer = await backend.open_writer(P, 4)
        assert await writer.append([b"e"]) == [LocalMessageID(4)]
    finally:
        await backend.close()
    assert len(segment_paths(tmp_path)) == len(paths) + 1


async def test_a_damaged_segment_off_the_chain_is_ignored(tmp_path: Path) -> None:
    """A segment of an older writer that no segment continues (a fenced
    writer's empty roll) holds nothing of the log, damaged or not."""
    paths = await three_terms(tmp_path, [b"d"])
    stray = tmp_path / P / SegmentName(3, 2, 0).filename
    stray.write_bytes(b"\x00" * 10)
    backend = LocalBackend(str(tmp_path))
    try:
        records = await read_all(backend, P, 4)
        assert [r.data for r in records] == [b"a", b"b", b"c", b"d"]
        last = await backend.last_record(P)
        assert last is not None and last.data == b"d"
    finally:
        await backend.close()
    assert files.list_segments(str(tmp_path / P)) == sorted(
        [*(segment.parse_name(p.name) for p in paths), SegmentName(3, 2, 0)]
    )


async def test_a_reader_waiting_at_the_tail_meets_a_later_damaged_header(tmp_path: Path) -> None:
    await write(tmp_path, [b"a", b"b"])
    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    try:
        async with asyncio.timeout(WAIT):
            got = await reader.next_batch(timeout=WAIT)
        assert [r.data for r in got] == [b"a", b"b"]
        assert await reader.next_batch(timeout=0.05) == []
        await write(tmp_path, [b"c"], term=2)
        second = segment_paths(tmp_path)[1]
        damage_header(second)
        with pytest.raises(errors.CorruptData) as corrupt:
            async with asyncio.timeout(WAIT):
                while True:
                    assert await reader.next_batch(timeout=WAIT) == []
        assert located(corrupt.value) == (str(second), 0)
    finally:
        await reader.close()
        await backend.close()

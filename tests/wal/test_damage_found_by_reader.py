"""Damage that opening does not read (a closed segment outside the dedup
window) is found by a reader: the reader gets every record before it and then
CORRUPT, and the WAL stops taking appends, so nothing more is acknowledged
behind a record no reader can pass."""

from __future__ import annotations

import asyncio
from pathlib import Path

from headrace import errors
from headrace.message.types import Message, MessageType
from headrace.tso import LocalTSO
from headrace.wal.api import ReadOptions, WALState
from headrace.wal.framework import WAL, WALOptions
from headrace.wal.local import LocalBackend

from .test_local_backend import P, damage, frame_offsets, segment_paths

OPTIONS = WALOptions(timetick_interval_ms=3_600_000)


async def damaged_log(root: Path) -> tuple[Path, int]:
    """Two terms of INSERTs; a record of the first term's segment damaged."""
    for term, tag in ((1, b"a"), (2, b"b")):
        backend = LocalBackend(str(root))
        wal = await WAL.open(backend, P, term, tso=LocalTSO(), options=OPTIONS)
        for i in range(6):
            await wal.append(Message(MessageType.INSERT, "v", tag + b"%d" % i))
        await wal.close()
        await backend.close()
    first = segment_paths(root)[0]
    offset = frame_offsets(first)[4]
    damage(first, offset, "bad-crc")
    return first, offset


async def test_a_reader_finding_damage_stops_the_appends(tmp_path: Path) -> None:
    path, offset = await damaged_log(tmp_path)
    backend = LocalBackend(str(tmp_path))
    wal = await WAL.open(backend, P, 3, tso=LocalTSO(), options=OPTIONS)
    assert wal.state is WALState.SERVING  # opening reads only the log's tail
    await wal.append(Message(MessageType.INSERT, "v", b"c0"))

    got = []
    async with wal.read(ReadOptions(types=[MessageType.INSERT])) as scanner:
        try:
            async with asyncio.timeout(10):
                while True:
                    entry = await scanner.next(timeout=5)
                    assert entry is not None
                    got.append(entry.message.payload)
        except errors.CorruptData as exc:
            corrupt = exc
    assert (corrupt.path, corrupt.offset) == (str(path), offset)
    assert got == [b"a0", b"a1", b"a2"]  # the FENCE is record 0, a3 is damaged

    assert wal.state is WALState.CORRUPT
    stats = wal.stats()
    assert stats["corrupt_file"] == str(path) and stats["corrupt_offset"] == offset
    (refused,) = await wal.append_many([Message(MessageType.INSERT, "v", b"refused")])
    assert isinstance(refused, errors.CorruptData) and not refused.retryable
    assert f"byte offset {offset}" in refused.message
    await wal.close()
    await backend.close()

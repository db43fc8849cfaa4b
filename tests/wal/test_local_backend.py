"""Local backend specifics: recovery, corruption, stale writers, segments, full disks."""

from __future__ import annotations

import asyncio
import errno
import fcntl
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from headrace import errors
from headrace.message import codec
from headrace.message.ids import MessageID
from headrace.message.types import Message, MessageType
from headrace.wal import registry
from headrace.wal.contract import BackendWriter, StartPosition
from headrace.wal.local import LocalBackend, LocalMessageID, files, segment, space
from headrace.wal.local.channel import Channel
from headrace.wal.local.dump import iter_dump
from headrace.wal.local.segment import FRAME, HEADER_SIZE
from headrace.wal.local.writer import WriterSettings

from .conformance import read_all, read_n

P = "p0"


def segment_paths(root: Path, pchannel: str = P) -> list[Path]:
    return sorted(
        (root / pchannel / name.filename for name in files.list_segments(str(root / pchannel))),
        key=lambda path: segment.parse_name(path.name) or (),
    )


def frame_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    offsets, pos = [], HEADER_SIZE
    while pos + FRAME.size <= len(data):
        offsets.append(pos)
        pos += FRAME.size + FRAME.unpack_from(data, pos)[0]
    return offsets


async def write(root: Path, records: list[bytes], term: int = 1, **settings: object) -> list[str]:
    backend = LocalBackend(str(root), **settings)  # type: ignore[arg-type]
    writer = await backend.open_writer(P, term)
    ids = await writer.append(records)
    await backend.close()
    return [str(mid) for mid in ids]


@pytest.mark.parametrize(
    "tail",
    [
        FRAME.pack(100, 0, 5)[:7],
        FRAME.pack(100, 0, 5) + b"x" * 10,
        FRAME.pack(3, 12345, 5) + b"bad",
        bytes(300),
    ],
    ids=["partial-frame-header", "partial-body", "bad-crc-last-record", "zeroes"],
)
async def test_torn_tail_is_cut_on_reopen(tmp_path: Path, tail: bytes) -> None:
    await write(tmp_path, [b"r%d" % i for i in range(5)])
    (path,) = segment_paths(tmp_path)
    with path.open("ab") as fh:
        fh.write(tail)

    backend = LocalBackend(str(tmp_path))
    assert [r.data for r in await read_all(backend, P, 5)] == [b"r%d" % i for i in range(5)]
    writer = await backend.open_writer(P, 1)
    ids = await writer.append([b"after"])
    assert ids == [LocalMessageID(5)]
    records = await read_all(backend, P, 6)
    assert [r.data for r in records] == [*(b"r%d" % i for i in range(5)), b"after"]
    assert [r.id for r in records] == [LocalMessageID(i) for i in range(6)]
    await backend.close()


async def test_corrupt_record_in_the_middle_is_never_skipped(tmp_path: Path) -> None:
    await write(tmp_path, [b"record-%d" % i for i in range(10)])
    (path,) = segment_paths(tmp_path)
    offset = frame_offsets(path)[3]
    data = bytearray(path.read_bytes())
    data[offset + FRAME.size + 2] ^= 0xFF
    path.write_bytes(bytes(data))

    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    assert [r.data for r in await read_n(reader, 3)] == [b"record-%d" % i for i in range(3)]
    with pytest.raises(errors.CorruptData) as corrupt:
        await reader.next_batch(timeout=1)
    assert str(path) in corrupt.value.message
    assert f"byte offset {offset}" in corrupt.value.message
    with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
        await backend.open_writer(P, 2)
    with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
        list(iter_dump(str(tmp_path), P))
    await backend.close()


async def test_corruption_in_a_closed_segment(tmp_path: Path) -> None:
    await write(tmp_path, [b"a", b"b", b"c"])
    await write(tmp_path, [b"d"])
    first, _second = segment_paths(tmp_path)
    offset = frame_offsets(first)[2]
    data = bytearray(first.read_bytes())
    data[offset + FRAME.size] ^= 0x01
    first.write_bytes(bytes(data))
    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
        await read_n(reader, 4)
    await backend.close()


def damage(path: Path, offset: int, how: str) -> None:
    """Damage the frame at ``offset`` of ``path``: flip a body byte, cut the
    file there (a truncation in the middle of the log), or overwrite the frame
    header with garbage."""
    data = bytearray(path.read_bytes())
    if how == "bad-crc":
        data[offset + FRAME.size] ^= 0xFF
    elif how == "garbage":
        data[offset : offset + FRAME.size] = b"\xa5" * FRAME.size
    else:
        raise AssertionError(how)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["bad-crc", "garbage"])
async def test_a_writer_refused_by_damage_leaves_the_records_before_it_readable(
    tmp_path: Path, how: str
) -> None:
    """Opening a writer on a log damaged in the middle fails with the file and
    offset; it must not leave a stored term behind that makes readers wait
    forever for a segment that will never come."""
    await write(tmp_path, [b"record-%d" % i for i in range(10)])
    (path,) = segment_paths(tmp_path)
    offset = frame_offsets(path)[3]
    damage(path, offset, how)

    writer_side = LocalBackend(str(tmp_path))
    with pytest.raises(errors.CorruptData) as refused:
        await writer_side.open_writer(P, 2)
    assert (refused.value.path, refused.value.offset) == (str(path), offset)
    with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
        await writer_side.open_writer(P, 3)
    for backend in (writer_side, LocalBackend(str(tmp_path))):
        reader = await backend.open_reader(P, StartPosition.earliest())
        assert [r.data for r in await read_n(reader, 3)] == [b"record-%d" % i for i in range(3)]
        with pytest.raises(errors.CorruptData) as corrupt:
            async with asyncio.timeout(10):
                await reader.next_batch(timeout=5)
        assert (corrupt.value.path, corrupt.value.offset) == (str(path), offset)
        await reader.close()
        await backend.close()


async def test_a_log_cut_short_in_a_closed_segment_is_corrupt_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    """A closed segment shorter than its successor recorded is damage in the
    middle of the log: readers get the records before the cut, then CORRUPT."""
    await write(tmp_path, [b"a", b"b", b"c", b"d"])
    await write(tmp_path, [b"e"], term=2)
    first, _second = segment_paths(tmp_path)
    offset = frame_offsets(first)[2]
    cut = offset + 5
    with first.open("r+b") as fh:
        fh.truncate(cut)
    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    assert [r.data for r in await read_n(reader, 2)] == [b"a", b"b"]
    with pytest.raises(errors.CorruptData) as corrupt:
        async with asyncio.timeout(10):
            await reader.next_batch(timeout=5)
    assert corrupt.value.path == str(first)
    assert corrupt.value.offset == offset
    await backend.close()


async def test_stale_writer_cannot_publish_after_new_owner(tmp_path: Path) -> None:
    old_node, new_node, observer = (LocalBackend(str(tmp_path)) for _ in range(3))
    stale = await old_node.open_writer(P, 1)
    await stale.append([b"a1", b"a2"])
    tailing = await observer.open_reader(P, StartPosition.earliest())
    assert [r.data for r in await read_n(tailing, 2)] == [b"a1", b"a2"]

    owner = await new_node.open_writer(P, 2)
    await owner.append([b"b1"])
    with pytest.raises(errors.Fenced) as fenced:
        await stale.append([b"x1", b"x2"])
    assert (fenced.value.term, fenced.value.current_term) == (1, 2)
    assert b"x1" in segment_paths(tmp_path)[0].read_bytes()
    await owner.append([b"b2"])

    assert [r.data for r in await read_n(tailing, 2)] == [b"b1", b"b2"]
    assert await tailing.next_batch(timeout=0.1) == []
    for backend in (old_node, new_node, observer):
        records = await read_all(backend, P, 4)
        assert [r.data for r in records] == [b"a1", b"a2", b"b1", b"b2"]
    rows = list(iter_dump(str(tmp_path), P))
    assert [row.id for row in rows] == [f"local:{i}" for i in range(4)]
    for backend in (old_node, new_node, observer):
        await backend.close()


async def test_stale_writer_fenced_when_rolling(tmp_path: Path) -> None:
    old_node = LocalBackend(str(tmp_path), segment_bytes=200)
    new_node = LocalBackend(str(tmp_path))
    stale = await old_node.open_writer(P, 1)
    await stale.append([bytes(300)])
    owner = await new_node.open_writer(P, 2)
    with pytest.raises(errors.Fenced):
        await stale.append([b"late"])
    await owner.append([b"owner"])
    assert [r.data for r in await read_all(new_node, P, 2)] == [bytes(300), b"owner"]
    await old_node.close()
    await new_node.close()


async def test_terms_only_move_forward_even_without_the_term_file(tmp_path: Path) -> None:
    await write(tmp_path, [b"t5"], term=5)
    (tmp_path / P / "TERM").unlink()
    backend = LocalBackend(str(tmp_path))
    with pytest.raises(errors.Fenced) as fenced:
        await backend.open_writer(P, 4)
    assert fenced.value.current_term == 5
    writer = await backend.open_writer(P, 6)
    await writer.append([b"t6"])
    assert [r.data for r in await read_all(backend, P, 2)] == [b"t5", b"t6"]
    await backend.close()


async def test_same_process_reopen_supersedes_the_old_writer(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path))
    first = await backend.open_writer(P, 1)
    await first.append([b"one"])
    second = await backend.open_writer(P, 1)
    with pytest.raises(errors.Fenced):
        await first.append([b"lost"])
    await second.append([b"two"])
    assert [r.data for r in await read_all(backend, P, 2)] == [b"one", b"two"]
    await backend.close()


@pytest.mark.parametrize("seed", range(3))
async def test_random_owner_changes_keep_exactly_the_acknowledged_records(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    nodes = [
        LocalBackend(str(tmp_path), segment_bytes=rng.choice([200, 1000, 1 << 20]))
        for _ in range(3)
    ]
    writers: list[BackendWriter] = []
    acked: list[tuple[MessageID, bytes]] = []
    term = 0
    for step in range(60):
        action = rng.random()
        if action < 0.2 or not writers:
            term += 1
            writers.append(await rng.choice(nodes).open_writer(P, term))
        elif action < 0.35 and len(writers) > 1:
            with pytest.raises(errors.Fenced):
                await rng.choice(writers[:-1]).append([b"stale-%d" % step])
        else:
            batch = [
                b"%d-%d" % (step, i) + bytes(rng.randint(0, 150)) for i in range(rng.randint(1, 4))
            ]
            ids = await writers[-1].append(batch)
            acked += zip(ids, batch, strict=True)
    for node in nodes:
        records = await read_all(node, P, len(acked))
        assert [(r.id, r.data) for r in records] == acked
    for node in nodes:
        await node.close()


async def test_takeover_racing_a_busy_stale_writer(tmp_path: Path) -> None:
    old_node, new_node = LocalBackend(str(tmp_path)), LocalBackend(str(tmp_path))
    stale = await old_node.open_writer(P, 1)
    acked: list[bytes] = []
    busy = asyncio.Event()

    async def keep_writing() -> None:
        for i in range(10_000):
            batch = [b"a%d.%d" % (i, j) for j in range(3)]
            try:
                await stale.append(batch)
            except errors.Fenced:
                return
            acked.extend(batch)
            if len(acked) >= 30:
                busy.set()

    writing = asyncio.create_task(keep_writing())
    async with asyncio.timeout(10):
        await busy.wait()
    owner = await new_node.open_writer(P, 2)
    await owner.append([b"b0"])
    async with asyncio.timeout(10):
        await writing
    await owner.append([b"b1"])
    reader = await new_node.open_reader(P, StartPosition.earliest())
    log: list[bytes] = []
    async with asyncio.timeout(10):
        while b"b1" not in log:
            log += [r.data for r in await reader.next_batch()]
    assert await reader.next_batch(timeout=0.1) == []
    first_new = log.index(b"b0")
    assert log[first_new:] == [b"b0", b"b1"]
    assert log[: len(acked)] == acked
    assert all(data.startswith(b"a") for data in log[:first_new])
    await old_node.close()
    await new_node.close()


async def test_concurrent_opens_leave_one_writer(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path))
    writers = await asyncio.gather(*(backend.open_writer(P, 3) for _ in range(4)))
    outcomes = await asyncio.gather(
        *(w.append([b"w%d" % i]) for i, w in enumerate(writers)), return_exceptions=True
    )
    succeeded = [o for o in outcomes if not isinstance(o, BaseException)]
    assert len(succeeded) == 1
    assert all(isinstance(o, errors.Fenced) for o in outcomes if isinstance(o, BaseException))
    assert len(await read_all(backend, P, 1)) == 1
    await backend.close()


async def test_segments_roll_and_truncation_deletes_whole_segments(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path), segment_bytes=256)
    writer = await backend.open_writer(P, 1)
    ids = [(await writer.append([b"%03d" % i + bytes(97)]))[0] for i in range(40)]
    assert len(segment_paths(tmp_path)) >= 10
    reader = await backend.open_reader(P, StartPosition.at(ids[17]))
    assert [r.id for r in await read_n(reader, 23)] == ids[17:]
    await reader.close()

    reopened = LocalBackend(str(tmp_path), segment_bytes=256)
    assert [r.id for r in await read_all(reopened, P, 40)] == ids
    before = len(segment_paths(tmp_path))
    await backend.truncate(P, ids[25])
    assert len(segment_paths(tmp_path)) < before
    assert await reopened.earliest(P) == ids[25]
    with pytest.raises(errors.Truncated) as truncated:
        await (await reopened.open_reader(P, StartPosition.at(ids[10]))).next_batch(timeout=1)
    assert truncated.value.earliest == "local:25"
    assert [r.id for r in await read_all(reopened, P, 15)] == ids[25:]

    await backend.truncate(P, LocalMessageID(10**6))
    assert await backend.earliest(P) is None
    assert await backend.last_record(P) is None
    assert len(segment_paths(tmp_path)) >= 1
    (new,) = await writer.append([b"fresh"])
    assert new == LocalMessageID(40)
    assert await backend.earliest(P) == new
    await backend.close()
    await reopened.close()


async def test_fsync_interval_policy_shares_syncs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    syncs = 0
    real_sync = files.sync_data

    def counting_sync(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real_sync(fd)

    monkeypatch.setattr(files, "sync_data", counting_sync)
    backend = registry.create("local", root=str(tmp_path), fsync="interval", fsync_interval_ms=20)
    writer = await backend.open_writer(P, 1)

    async def produce(task: int) -> list[LocalMessageID]:
        out = []
        for call in range(5):
            (mid,) = await writer.append([b"%d.%d" % (task, call)])
            assert isinstance(mid, LocalMessageID)
            out.append(mid)
        return out

    acked = await asyncio.gather(*map(produce, range(10)))
    assert all(ids == sorted(ids) for ids in acked)
    assert syncs < 50
    await backend.close()
    reopened = LocalBackend(str(tmp_path))
    records = await read_all(reopened, P, 50)
    assert sorted(r.id for r in records) == sorted(mid for ids in acked for mid in ids)
    await reopened.close()


async def test_failed_write_acknowledges_nothing_and_cuts_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 1)
    await writer.append([b"kept"])
    (path,) = segment_paths(tmp_path)
    size = path.stat().st_size
    real_write = files.write_parts

    def half_then_enospc(fd: int, parts: list[bytes], size: int, offset: int) -> None:
        os.pwrite(fd, b"".join(parts)[: size // 2], offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_parts", half_then_enospc)
    with pytest.raises(errors.StorageFull) as full:
        await writer.append([b"lost-1", b"lost-2"])
    assert full.value.retryable
    assert path.stat().st_size == size
    monkeypatch.setattr(files, "write_parts", real_write)
    assert await writer.append([b"next"]) == [LocalMessageID(1)]
    assert [r.data for r in await read_all(backend, P, 2)] == [b"kept", b"next"]
    await backend.close()


async def test_appends_stop_at_the_free_space_reserve_and_resume(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below the reserve, appends fail with STORAGE_FULL (retryable, naming the
    file) before a byte is written, and resume once space is free again."""
    free = {"bytes": 1 << 30}
    monkeypatch.setattr(space, "free_space", lambda directory: (free["bytes"], 1 << 34))
    monkeypatch.setattr(space, "READ_EVERY_S", 0.0)  # no waiting for the next reading
    backend = LocalBackend(str(tmp_path), reserve_bytes=1 << 20)
    writer = await backend.open_writer(P, 1)
    assert await writer.append([b"kept"]) == [LocalMessageID(0)]
    (path,) = segment_paths(tmp_path)
    size = path.stat().st_size
    free["bytes"] = (1 << 20) + 50
    for _ in range(2):
        with pytest.raises(errors.StorageFull) as full:
            await writer.append([b"x" * 100])
        assert full.value.retryable
        assert str(path) in full.value.message and "free" in full.value.message
    assert path.stat().st_size == size
    free["bytes"] = 1 << 30
    assert await writer.append([b"next"]) == [LocalMessageID(1)]
    assert [r.data for r in await read_all(backend, P, 2)] == [b"kept", b"next"]
    await backend.close()


async def test_enospc_from_the_sync_acknowledges_nothing_and_cuts_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variant: the write went through but the sync (group commit) failed."""
    backend = LocalBackend(str(tmp_path), fsync="interval", reserve_bytes=0)
    writer = await backend.open_writer(P, 1)
    await writer.append([b"kept"])
    (path,) = segment_paths(tmp_path)
    size = path.stat().st_size
    real_sync = files.sync_data
    calls = {"n": 0}

    def first_sync_fails(fd: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_sync(fd)

    monkeypatch.setattr(files, "sync_data", first_sync_fails)
    with pytest.raises(errors.StorageFull) as full:
        await writer.append([b"lost"])
    assert full.value.retryable and str(path) in full.value.message
    assert path.stat().st_size == size
    assert await writer.append([b"next"]) == [LocalMessageID(1)]
    assert [r.data for r in await read_all(backend, P, 2)] == [b"kept", b"next"]
    await backend.close()


async def test_enospc_when_rolling_a_segment_acknowledges_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Variant: the segment is full and the next one cannot be created."""
    backend = LocalBackend(str(tmp_path), segment_bytes=128, reserve_bytes=0)
    writer = await backend.open_writer(P, 1)
    await writer.append([b"x" * 100])
    real_create = files.create_segment

    def no_space(*args: object, **kwargs: object) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "create_segment", no_space)
    with pytest.raises(errors.StorageFull, match="creating a segment"):
        await writer.append([b"lost"])
    assert len(segment_paths(tmp_path)) == 1
    monkeypatch.setattr(files, "create_segment", real_create)
    assert await writer.append([b"next"]) == [LocalMessageID(1)]
    assert len(segment_paths(tmp_path)) == 2
    assert [r.data for r in await read_all(backend, P, 2)] == [b"x" * 100, b"next"]
    await backend.close()


def test_default_reserve_is_a_share_of_the_disk_capped() -> None:
    assert space.default_reserve(8 << 20) == (8 << 20) // 20
    assert space.default_reserve(1 << 40) == space.RESERVE_MAX
    last = space.Reading(free=100 << 20, reserve=10 << 20, at=0.0)
    assert not space.needs_reading(last, 1024, now=0.1)
    assert space.needs_reading(last, 1024, now=1.5), "read again after READ_EVERY_S"
    near = space.Reading(free=20 << 20, reserve=10 << 20, at=0.0)
    assert space.needs_reading(near, 1024, now=0.1), "near the reserve, read before each write"


_FULL_DISK_CHILD = r"""
import asyncio, json, os, resource, signal, sys
from headrace import errors
from headrace.wal.local import LocalBackend

async def main(root, limit):
    backend = LocalBackend(root)
    writer = await backend.open_writer("p0", 1)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    acked, failures, n = [], [], 0
    while len(failures) < 2:
        batch = [str(n + i).encode().ljust(1024, b".") for i in range(8)]
        try:
            ids = await writer.append(batch)
        except errors.StorageFull as exc:
            failures.append(exc.message)
            continue
        acked += [[str(mid), data.decode()] for mid, data in zip(ids, batch)]
        n += len(batch)
    ids = await writer.append([b"small"])
    acked.append([str(ids[0]), "small"])
    await backend.close()
    print(json.dumps({"acked": acked, "failures": failures}))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def test_full_disk_with_rlimit_fsize(tmp_path: Path) -> None:
    limit = 64 * 1024
    done = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_CHILD, str(tmp_path), str(limit)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert len(result["failures"]) == 2
    assert all("File too large" in message for message in result["failures"])
    acked = result["acked"]
    assert len(acked) == 7 * 8 + 1

    async def reread() -> list[list[str]]:
        backend = LocalBackend(str(tmp_path))
        records = await read_all(backend, P, len(acked))
        writer = await backend.open_writer(P, 2)
        (mid,) = await writer.append([b"after"])
        assert mid == LocalMessageID(len(acked))
        await backend.close()
        return [[str(r.id), r.data.decode()] for r in records]

    assert asyncio.run(reread()) == acked


async def test_reader_in_another_process_follows_the_writer(tmp_path: Path) -> None:
    writing, reading = LocalBackend(str(tmp_path)), LocalBackend(str(tmp_path))
    writer = await writing.open_writer(P, 1)
    reader = await reading.open_reader(P, StartPosition.latest())
    waiting = asyncio.create_task(read_n(reader, 3))
    await writer.append([b"1"])
    await writer.append([b"2", b"3"])
    assert [r.data for r in await waiting] == [b"1", b"2", b"3"]
    await writing.close()
    await reading.close()


async def test_dump_lists_records(tmp_path: Path) -> None:
    message = Message(MessageType.INSERT, "vc-1", b"payload", timetick=42, term=1)
    await write(tmp_path, [codec.encode(message), b"not a message"])
    rows = list(iter_dump(str(tmp_path), P))
    assert rows[0][:6] == ("local:0", "INSERT", "vc-1", 42, 1, len(codec.encode(message)))
    assert rows[0].error == ""
    assert rows[1].id == "local:1" and rows[1].type == "?" and rows[1].error
    with pytest.raises(errors.NotFound):
        list(iter_dump(str(tmp_path), "missing"))


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"root": ""},
        {"root": "x", "fsync": "sometimes"},
        {"root": "x", "fsync_interval_ms": 0},
        {"root": "x", "fsync_interval_ms": "5"},
        {"root": "x", "segment_bytes": 10},
        {"root": "x", "segment_bytes": True},
        {"root": "x", "colour": "blue"},
    ],
)
def test_settings_are_validated(settings: dict[str, object]) -> None:
    with pytest.raises(errors.InvalidArgument):
        registry.create("local", **settings)


async def test_root_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("")
    with pytest.raises(errors.InvalidArgument, match="not a directory"):
        LocalBackend(str(tmp_path / "file"))


@pytest.mark.parametrize("name", ["", "../up", "a/b", ".hidden", "x" * 300, "sp ace"])
async def test_pchannel_names_must_be_safe(tmp_path: Path, name: str) -> None:
    backend = LocalBackend(str(tmp_path))
    with pytest.raises(errors.InvalidArgument, match="pchannel"):
        await backend.open_writer(name, 1)
    with pytest.raises(errors.InvalidArgument):
        await backend.open_reader(name, StartPosition.earliest())
    assert not (tmp_path / "up").exists() and os.listdir(tmp_path) == []
    await backend.close()


@pytest.mark.skipif(not files.SYNC_WRITES, reason="the platform has no O_DSYNC")
def test_batch_fsync_opens_segments_with_synchronous_writes(tmp_path: Path) -> None:
    """With fsync every batch, a write is durable when pwrite returns (O_DSYNC),
    so the writer thread makes one system call per batch; interval fsync keeps
    plain descriptors and syncs on its timer."""
    assert WriterSettings("batch", 0.0, 1 << 20).sync_writes
    assert not WriterSettings("interval", 0.01, 1 << 20).sync_writes
    name = segment.SegmentName(1, 1, 0)
    fd = files.create_segment(str(tmp_path), segment.SegmentHeader(name, None, 0), sync_writes=True)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & files.SYNC_WRITES
    finally:
        os.close(fd)
    plain = files.create_segment(
        str(tmp_path), segment.SegmentHeader(name._replace(seq=1), None, 0)
    )
    try:
        assert not fcntl.fcntl(plain, fcntl.F_GETFL) & files.SYNC_WRITES
    finally:
        os.close(plain)


@pytest.mark.parametrize("count", [2, files.IOV_MAX, files.IOV_MAX + 1])
@pytest.mark.parametrize("short", [False, True])
def test_frames_are_written_whole_from_their_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, count: int, short: bool
) -> None:
    """The writer hands frame headers and bodies to ``pwritev`` as they are;
    more parts than one call takes, or a short write, still write every byte
    in order."""
    parts = [b"%d-" % i * (1 + i % 7) for i in range(count)]
    size = sum(map(len, parts))
    if short:
        real = os.pwritev

        def short_pwritev(fd: int, buffers: list[bytes], offset: int) -> int:
            return real(fd, [b"".join(buffers)[: size // 3]], offset)

        monkeypatch.setattr(files, "_PWRITEV", short_pwritev)
    path = tmp_path / "out"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        os.write(fd, b"head")
        files.write_parts(fd, parts, size, 4)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"head" + b"".join(parts)


async def test_records_of_many_calls_and_sizes_are_framed_in_one_write(tmp_path: Path) -> None:
    """Queued calls share one write of their frames; each record keeps its
    LSN, body and checksum whatever the record sizes."""
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 1)
    calls = [[b"r%d-%d" % (i, j) * (i * 997 % 5000) for j in range(i % 3 + 1)] for i in range(40)]
    results = await asyncio.gather(*(writer.append(call) for call in calls))
    flat = [body for call in calls for body in call]
    assert [mid for ids in results for mid in ids] == [LocalMessageID(i) for i in range(len(flat))]
    await backend.close()
    again = LocalBackend(str(tmp_path))
    assert [r.data for r in await read_all(again, P, len(flat))] == flat
    await again.close()


async def test_a_write_wakes_the_readers_that_wait_and_costs_no_event_otherwise(
    tmp_path: Path,
) -> None:
    channel = Channel(str(tmp_path), P)
    idle = channel.changed()
    channel.notify()
    assert idle.is_set()
    waiting = channel.changed()
    assert waiting is not idle and not waiting.is_set()
    channel.notify()
    channel.notify()
    assert waiting.is_set()
    assert channel.changed() is channel.changed()
    assert not channel.changed().is_set()

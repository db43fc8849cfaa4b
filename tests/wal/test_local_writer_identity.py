"""Two writers of one local WAL under the same term (issue #11, item 1).

A term alone does not tell two writers apart: two processes that open one
pchannel under the same term (a duplicated node id, a paused process whose
assignment was handed to a new process of the same id) must not both have
their records followed by the segment chain. Every open gets its own writer
identity (term, epoch) stored in the fence; the later open fences the earlier
one, whose appends then fail with FENCED, and everything acknowledged stays
readable after a restart.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import sys
import zlib
from pathlib import Path

import pytest

from headrace import errors
from headrace.tso import LocalTSO
from headrace.wal.api import WALState
from headrace.wal.contract import BackendWriter, StartPosition
from headrace.wal.framework import WAL
from headrace.wal.local import LocalBackend, files, segment
from headrace.wal.local.fence import Fence
from headrace.wal.local.writer import LocalWriter

from .conformance import read_all, read_n
from .test_framework import QUIET, backend_log, insert

P = "p0"


async def reopened_log(root: Path, term: int, count: int) -> list[bytes]:
    """Every record after a restart: a fresh backend (another process) opening under ``term``."""
    backend = LocalBackend(str(root))
    writer = await backend.open_writer(P, term)
    await writer.append([b"after-restart"])
    records = await read_all(backend, P, count + 1)
    await backend.close()
    assert records[-1].data == b"after-restart"
    return [r.data for r in records[:-1]]


async def test_second_writer_of_the_same_term_fences_the_first(tmp_path: Path) -> None:
    first_process, second_process = LocalBackend(str(tmp_path)), LocalBackend(str(tmp_path))
    first = await first_process.open_writer(P, 3)
    acked = [b"a1", b"a2"]
    await first.append(acked)
    second = await second_process.open_writer(P, 3)
    with pytest.raises(errors.Fenced) as fenced:
        await first.append([b"lost-if-acknowledged"])
    assert (fenced.value.term, fenced.value.current_term) == (3, 3)
    assert "epoch" in fenced.value.message
    await second.append([b"b1"])
    acked.append(b"b1")
    for backend in (first_process, second_process):
        assert [r.data for r in await read_all(backend, P, 3)] == acked
        await backend.close()
    assert await reopened_log(tmp_path, 4, 3) == acked


async def test_stale_writer_of_the_same_term_rolling_into_the_new_owners_position(
    tmp_path: Path,
) -> None:
    """The stale writer's full segment makes it roll exactly where the new owner
    started: its new (empty) segment must not become the head of the chain."""
    first_process = LocalBackend(str(tmp_path), segment_bytes=200)
    second_process = LocalBackend(str(tmp_path))
    first = await first_process.open_writer(P, 5)
    await first.append([bytes(300)])
    second = await second_process.open_writer(P, 5)
    await second.append([b"owner-1"])
    with pytest.raises(errors.Fenced):
        await first.append([b"stale"])
    await second.append([b"owner-2"])
    expected = [bytes(300), b"owner-1", b"owner-2"]
    assert [r.data for r in await read_all(second_process, P, 3)] == expected
    await first_process.close()
    await second_process.close()
    assert await reopened_log(tmp_path, 6, 3) == expected


async def test_readers_wait_while_a_same_term_owner_is_opening(tmp_path: Path) -> None:
    """A new identity stored before its segment exists makes the chain untrusted:
    a reader never delivers bytes of the fenced writer past what the new owner
    will measure."""
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 2)
    await writer.append([b"kept"])
    fd = files.open_term_file(str(tmp_path / P), write=True)
    try:
        stored = files.claim_fence(fd, str(tmp_path / P), 2, P)
    finally:
        os.close(fd)
    assert stored.term == 2
    with pytest.raises(errors.Fenced):
        await writer.append([b"never-acknowledged"])
    observer, new_owner = LocalBackend(str(tmp_path)), LocalBackend(str(tmp_path))
    reader = await observer.open_reader(P, StartPosition.earliest())
    assert await reader.next_batch(timeout=0.2) == []
    owner = await new_owner.open_writer(P, 2)
    await owner.append([b"next"])
    # The fenced writer's bytes were written before the new owner measured the
    # log, so they are part of it (not acknowledged does not mean not written).
    log = [b"kept", b"never-acknowledged", b"next"]
    assert [r.data for r in await read_all(new_owner, P, 3)] == log
    assert [r.data for r in await read_n(reader, 3)] == log
    for each in (observer, new_owner, backend):
        await each.close()


async def test_every_open_gets_a_new_identity_even_without_the_term_file(tmp_path: Path) -> None:
    backend = LocalBackend(str(tmp_path))
    identities = []
    for term in (1, 1, 2, 2):
        writer = await backend.open_writer(P, term)
        await writer.append([b"t%d" % term])
        assert isinstance(writer, LocalWriter)
        identities.append(writer.fence)
    assert len(set(identities)) == 4 and identities == sorted(identities)
    await backend.close()
    (tmp_path / P / files.TERM_FILE).unlink()
    again = LocalBackend(str(tmp_path))
    writer = await again.open_writer(P, 2)
    assert isinstance(writer, LocalWriter) and writer.fence > identities[-1]
    await writer.append([b"t2-again"])
    assert [r.data for r in await read_all(again, P, 5)] == [
        b"t1",
        b"t1",
        b"t2",
        b"t2",
        b"t2-again",
    ]
    await again.close()


async def test_data_of_the_previous_format_is_read_and_continued(tmp_path: Path) -> None:
    """A directory written before writer identities (format 1 segments, a
    12-byte term file) opens, and its records are kept."""
    directory = tmp_path / P
    directory.mkdir()
    term_value = struct.pack("<Q", 4)
    (directory / files.TERM_FILE).write_bytes(struct.pack("<QI", 4, zlib.crc32(term_value)))
    name = segment.SegmentName(0, 4, 0)
    header = segment.encode_header(segment.SegmentHeader(name, None, 0, version=1))
    assert struct.unpack_from("<H", header, 8) == (1,)
    (directory / name.filename).write_bytes(
        header + segment.encode_frames(0, [b"old-1", b"old-2"], version=1)
    )
    backend = LocalBackend(str(tmp_path))
    assert [r.data for r in await read_all(backend, P, 2)] == [b"old-1", b"old-2"]
    writer = await backend.open_writer(P, 4)
    assert isinstance(writer, LocalWriter) and writer.fence > Fence(4, 0)
    await writer.append([b"new"])
    await backend.close()
    assert await reopened_log(tmp_path, 5, 3) == [b"old-1", b"old-2", b"new"]


_WRITER_CHILD = r"""
import asyncio, json, sys
from headrace import errors
from headrace.wal.local import LocalBackend

async def main(root, name, term):
    backend = LocalBackend(root, segment_bytes=4096)
    writer = await backend.open_writer("p0", term)
    print("open", flush=True)
    acked, n = [], 0
    while True:
        batch = [f"{name}-{n + i}".encode() for i in range(3)]
        n += len(batch)
        try:
            await writer.append(batch)
        except errors.Fenced as exc:
            print(json.dumps({"acked": acked, "fenced": exc.message}), flush=True)
            return
        acked += [b.decode() for b in batch]
        await asyncio.sleep(0.002)
        if len(acked) % 30 == 0:
            print("progress", flush=True)

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


async def _start_writer(root: Path, name: str, term: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        _WRITER_CHILD,
        str(root),
        name,
        str(term),
        stdout=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        assert (await process.stdout.readline()).strip() == b"open"
        assert (await process.stdout.readline()).strip() == b"progress"
    return process


async def _outcome(process: asyncio.subprocess.Process) -> dict[str, object]:
    assert process.stdout is not None
    async with asyncio.timeout(60):
        while True:
            line = await process.stdout.readline()
            assert line, "the writer process ended without reporting"
            if line.startswith(b"{"):
                assert await process.wait() == 0
                result: dict[str, object] = json.loads(line)
                return result


async def _stop(process: asyncio.subprocess.Process) -> None:
    if process.returncode is None:
        process.kill()
        await process.wait()


@pytest.mark.parametrize("paused", [False, True], ids=["running", "sigstopped"])
async def test_two_processes_with_the_same_term_lose_no_acknowledged_record(
    tmp_path: Path, paused: bool
) -> None:
    """Two real processes write one WAL under one term: the first keeps writing
    (or is SIGSTOPped mid-stream and resumed) while the second takes over."""
    first = await _start_writer(tmp_path, "first", 7)
    second: asyncio.subprocess.Process | None = None
    try:
        if paused:
            first.send_signal(signal.SIGSTOP)
        second = await _start_writer(tmp_path, "second", 7)
        if paused:
            first.send_signal(signal.SIGCONT)
        first_result = await _outcome(first)
        assert "fenced" in first_result
        second.send_signal(signal.SIGKILL)
        await second.wait()
        assert second.stdout is not None
        lines = (await second.stdout.read()).decode().splitlines()
        assert all(line == "progress" for line in lines)
    finally:
        await _stop(first)
        if second is not None:
            await _stop(second)
    acked_first = [str(v).encode() for v in first_result["acked"]]  # type: ignore[attr-defined]
    log = await reopened_log_all(tmp_path, 8)
    # The first writer's records, then the second's: each in order, without
    # gaps. The first's include every one it acknowledged (and may include the
    # one it was fenced on: written before the second measured the log, so
    # kept, though not acknowledged); the second acknowledged at least 30.
    split = next((i for i, item in enumerate(log) if item.startswith(b"second-")), len(log))
    assert log[: len(acked_first)] == acked_first
    assert log[:split] == [b"first-%d" % i for i in range(split)]
    assert split - len(acked_first) <= 3
    seconds = log[split:]
    assert seconds == [b"second-%d" % i for i in range(len(seconds))] and len(seconds) >= 30


async def reopened_log_all(root: Path, term: int) -> list[bytes]:
    """The whole log after a restart (read until it ends), without the restart's own record."""
    backend = LocalBackend(str(root))
    writer: BackendWriter = await backend.open_writer(P, term)
    await writer.append([b"after-restart"])
    reader = await backend.open_reader(P, StartPosition.earliest())
    log: list[bytes] = []
    async with asyncio.timeout(60):
        while not log or log[-1] != b"after-restart":
            log += [r.data for r in await reader.next_batch()]
    await backend.close()
    return log[:-1]


_PAUSED_HOLDER = r"""
import fcntl, os, signal, sys
from headrace.wal.local import files

directory, which = sys.argv[1], sys.argv[2]
if which == "marker":
    lock = files.marker_lock(directory)
    lock.__enter__()
else:
    fd = os.open(os.path.join(directory, files.TERM_FILE), os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
print("locked", flush=True)
os.kill(os.getpid(), signal.SIGSTOP)
"""


async def _paused_holder(directory: Path, which: str) -> asyncio.subprocess.Process:
    """A process that took a lock of the pchannel's directory and was SIGSTOPped."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _PAUSED_HOLDER, str(directory), which, stdout=asyncio.subprocess.PIPE
    )
    assert process.stdout is not None
    async with asyncio.timeout(60):
        assert (await process.stdout.readline()).strip() == b"locked"
    return process


async def test_owner_paused_while_truncating_does_not_block_a_new_owner(tmp_path: Path) -> None:
    old = LocalBackend(str(tmp_path))
    writer = await old.open_writer(P, 1)
    ids = await writer.append([b"a", b"b", b"c"])
    paused = await _paused_holder(tmp_path / P, "marker")
    try:
        new = LocalBackend(str(tmp_path))
        async with asyncio.timeout(files.LOCK_WAIT):
            owner = await new.open_writer(P, 2)
            await owner.append([b"d"])
        with pytest.raises(errors.Fenced):
            await writer.append([b"stale"])
        with pytest.raises(errors.Unavailable, match="stayed locked by another process"):
            await new.truncate(P, ids[1])
    finally:
        await _stop(paused)
    await new.truncate(P, ids[1])
    assert [r.data for r in await read_all(new, P, 3)] == [b"b", b"c", b"d"]
    await old.close()
    await new.close()


async def test_opener_paused_inside_its_claim_delays_a_new_owner_only_boundedly(
    tmp_path: Path,
) -> None:
    """The term file's lock is held for one pwrite and fsync; a process paused
    right there makes other opens fail with a retryable error, not hang."""
    first = LocalBackend(str(tmp_path))
    await (await first.open_writer(P, 1)).append([b"a"])
    paused = await _paused_holder(tmp_path / P, "term")
    try:
        second = LocalBackend(str(tmp_path))
        async with asyncio.timeout(files.LOCK_WAIT * 4):
            with pytest.raises(
                errors.Unavailable, match="stayed locked by another process"
            ) as info:
                await second.open_writer(P, 2)
        assert info.value.retryable
    finally:
        await _stop(paused)
    owner = await second.open_writer(P, 2)
    await owner.append([b"b"])
    assert [r.data for r in await read_all(second, P, 2)] == [b"a", b"b"]
    await first.close()
    await second.close()


async def test_framework_wals_of_two_processes_with_one_term_keep_every_acknowledged_message(
    tmp_path: Path,
) -> None:
    """The issue's scenario on the framework WAL: two node processes hold one
    pchannel under one term, both appending; after a restart every message
    either of them acknowledged is in the log."""
    first_process, second_process = LocalBackend(str(tmp_path)), LocalBackend(str(tmp_path))
    first = await WAL.open(first_process, P, 4, tso=LocalTSO(), options=QUIET)
    acked: list[bytes] = []
    hundred = asyncio.Event()

    async def produce(wal: WAL, name: str, count: int) -> None:
        for i in range(count):
            payload = b"%s-%d" % (name.encode(), i)
            try:
                await wal.append(insert(payload=payload))
            except errors.Fenced:
                return
            acked.append(payload)
            if len(acked) == 100:
                hundred.set()
            await asyncio.sleep(0)

    producing = asyncio.create_task(produce(first, "first", 300))
    async with asyncio.timeout(30):
        await hundred.wait()
    second = await WAL.open(second_process, P, 4, tso=LocalTSO(), options=QUIET)
    await produce(second, "second", 300)
    await producing
    first_state = first.state
    for wal in (first, second):
        await wal.close()
    for backend in (first_process, second_process):
        await backend.close()

    restarted = LocalBackend(str(tmp_path))
    wal = await WAL.open(restarted, P, 5, tso=LocalTSO(), options=QUIET)
    logged = {e.message.payload for e in await backend_log(restarted, P)}
    await wal.close()
    await restarted.close()
    assert [p for p in acked if p not in logged] == []
    assert sum(p.startswith(b"second-") for p in acked) == 300
    assert first_state is WALState.UNAVAILABLE  # fenced by the second open

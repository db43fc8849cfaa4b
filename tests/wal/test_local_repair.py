"""``headrace wal repair``: keep the valid prefix, move the damaged rest aside."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headrace import errors
from headrace.wal.contract import StartPosition
from headrace.wal.local import LocalBackend, LocalMessageID, files
from headrace.wal.local.repair import repair
from headrace.wal.local.segment import FRAME

from .conformance import read_all, read_n
from .test_local_backend import P, damage, frame_offsets, segment_paths, write


def files_under(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.mark.parametrize("how", ["bad-crc", "garbage"])
async def test_repair_keeps_the_prefix_and_moves_the_damaged_rest_aside(
    tmp_path: Path, how: str
) -> None:
    await write(tmp_path, [b"record-%d" % i for i in range(10)])
    (path,) = segment_paths(tmp_path)
    offset = frame_offsets(path)[3]
    damage(path, offset, how)
    damaged = path.read_bytes()

    report = repair(str(tmp_path), P)

    assert report.damage is not None
    assert (report.damage.path, report.damage.offset, report.damage.lsn) == (str(path), offset, 3)
    quarantine = Path(report.quarantine)
    assert quarantine.parent == tmp_path / P and quarantine.name.startswith("quarantine-")
    assert files_under(quarantine) == {f"{path.name}.from-{offset}": damaged[offset:]}
    assert path.read_bytes() == damaged[:offset]
    assert report.moved_bytes == len(damaged) - offset
    assert "nothing was deleted" in report.summary()

    backend = LocalBackend(str(tmp_path))
    assert [r.data for r in await read_all(backend, P, 3)] == [b"record-%d" % i for i in range(3)]
    writer = await backend.open_writer(P, 2)
    assert await writer.append([b"after"]) == [LocalMessageID(3)]
    records = await read_all(backend, P, 4)
    assert [r.data for r in records] == [b"record-0", b"record-1", b"record-2", b"after"]
    await backend.close()


async def test_repair_of_a_closed_segment_moves_the_later_segments_aside(tmp_path: Path) -> None:
    await write(tmp_path, [b"a", b"b", b"c", b"d"])
    await write(tmp_path, [b"e", b"f"], term=2)
    await write(tmp_path, [b"g"], term=3)
    first, second, third = segment_paths(tmp_path)
    later = {second.name: second.read_bytes(), third.name: third.read_bytes()}
    offset = frame_offsets(first)[1]
    cut = offset + FRAME.size // 2
    with first.open("r+b") as fh:
        fh.truncate(cut)

    report = repair(str(tmp_path), P)

    assert report.damage is not None and report.damage.lsn == 1
    moved = files_under(Path(report.quarantine))
    assert {name: moved[name] for name in later} == later
    assert len(moved[f"{first.name}.from-{offset}"]) == cut - offset
    assert segment_paths(tmp_path) == [first]
    # The stored term is newer than the kept segment's: readers wait for the
    # next writer (the node's next try), which continues after the prefix.
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 4)
    assert await writer.append([b"next"]) == [LocalMessageID(1)]
    assert [r.data for r in await read_all(backend, P, 2)] == [b"a", b"next"]
    await backend.close()


async def test_a_torn_tail_is_not_damage_and_repair_changes_nothing(tmp_path: Path) -> None:
    await write(tmp_path, [b"r%d" % i for i in range(5)])
    (path,) = segment_paths(tmp_path)
    with path.open("ab") as fh:
        fh.write(FRAME.pack(100, 0, 5) + b"x" * 10)
    before = files_under(tmp_path)
    report = repair(str(tmp_path), P)
    assert report.damage is None and "nothing changed" in report.summary()
    assert files_under(tmp_path) == before


async def test_repair_refuses_while_a_writer_holds_the_pchannel(tmp_path: Path) -> None:
    await write(tmp_path, [b"a", b"b", b"c"])
    (path,) = segment_paths(tmp_path)
    damage(path, frame_offsets(path)[1], "bad-crc")
    await write(tmp_path / "other", [b"x"])  # another log, served below
    backend = LocalBackend(str(tmp_path / "other"))
    writer = await backend.open_writer(P, 2)
    before = files_under(tmp_path / "other")
    with pytest.raises(errors.Conflict, match="being written"):
        repair(str(tmp_path / "other"), P)
    assert files_under(tmp_path / "other") == before
    await writer.close()
    assert repair(str(tmp_path / "other"), P).damage is None
    await backend.close()


def test_bad_input_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument):
        repair(str(tmp_path), "../escape")
    with pytest.raises(errors.InvalidArgument, match="no local WAL"):
        repair(str(tmp_path), "missing")


async def test_cli_repair_prints_what_it_did_and_exits_2_on_bad_input(tmp_path: Path) -> None:
    await write(tmp_path, [b"record-%d" % i for i in range(6)])
    (path,) = segment_paths(tmp_path)
    offset = frame_offsets(path)[2]
    damage(path, offset, "bad-crc")

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "headrace.cli", "wal", "repair", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    done = cli("--dir", str(tmp_path), "--pchannel", P)
    assert done.returncode == 0, done.stderr
    assert f"byte offset {offset}" in done.stdout and "quarantine-" in done.stdout
    again = cli("--dir", str(tmp_path), "--pchannel", P)
    assert again.returncode == 0 and "nothing changed" in again.stdout
    missing = cli("--dir", str(tmp_path), "--pchannel", "nope")
    assert missing.returncode == 2 and "no local WAL" in missing.stderr
    backend = LocalBackend(str(tmp_path))
    reader = await backend.open_reader(P, StartPosition.earliest())
    assert [r.data for r in await read_n(reader, 2)] == [b"record-0", b"record-1"]
    assert await reader.next_batch(timeout=0.1) == []
    await backend.close()
    assert files.list_segments(str(tmp_path / P))


async def test_a_damaged_segment_header_moves_that_segment_and_the_later_ones_aside(
    tmp_path: Path,
) -> None:
    await write(tmp_path, [b"a", b"b"])
    await write(tmp_path, [b"c"], term=2)
    await write(tmp_path, [b"d"], term=3)
    first, second, third = segment_paths(tmp_path)
    data = bytearray(second.read_bytes())
    data[20] ^= 0xFF  # inside the header: its CRC fails
    second.write_bytes(bytes(data))
    later = {second.name: bytes(data), third.name: third.read_bytes()}

    backend = LocalBackend(str(tmp_path))
    with pytest.raises(errors.CorruptData) as refused:
        await backend.open_writer(P, 4)
    assert (refused.value.path, refused.value.offset) == (str(second), 0)
    await backend.close()

    report = repair(str(tmp_path), P)
    assert report.damage is not None
    assert (report.damage.path, report.damage.offset, report.damage.lsn) == (str(second), 0, 2)
    assert files_under(Path(report.quarantine)) == later
    assert segment_paths(tmp_path) == [first]
    backend = LocalBackend(str(tmp_path))
    writer = await backend.open_writer(P, 4)
    assert await writer.append([b"next"]) == [LocalMessageID(2)]
    assert [r.data for r in await read_all(backend, P, 3)] == [b"a", b"b", b"next"]
    await backend.close()

"""A damaged record in one pchannel's log does not take the standalone down.

Real processes: the standalone is stopped, a record in the middle of one
pchannel's segment is damaged, and the standalone started again comes up;
``headrace status`` shows that pchannel CORRUPT with the file and offset, the
other pchannels take messages, a consumer of the damaged one gets every
message before the damage and then CORRUPT, and ``headrace wal repair``
(beside the running standalone) moves the damaged rest aside.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headrace import errors
from headrace.client.client import HeadraceClient
from headrace.cluster import NEW_CLUSTER_ROUTING, default_pchannels, route
from headrace.message import records
from headrace.message.types import MessageType
from headrace.wal.local import files
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.local.segment import FRAME, HEADER_SIZE
from tests.test_standalone import Standalone, cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

PCHANNELS = default_pchannels(2)


def vchannel_of(pchannel: str) -> str:
    return next(
        v
        for v in (f"v{i}" for i in range(100))
        if route(v, PCHANNELS, NEW_CLUSTER_ROUTING) == pchannel
    )


def damage_middle_insert(directory: Path) -> tuple[Path, int, int]:
    """Damage the middle INSERT of the pchannel's first segment: file, offset,
    number of INSERTs before it."""
    name = files.list_segments(str(directory))[0]
    path = directory / name.filename
    data = bytearray(path.read_bytes())
    inserts: list[tuple[int, int]] = []  # (offset, messages) of records of INSERTs
    pos = HEADER_SIZE
    while pos + FRAME.size <= len(data):
        length = FRAME.unpack_from(data, pos)[0]
        body = bytes(data[pos + FRAME.size : pos + FRAME.size + length])
        entries = records.entries(LocalMessageID(0), body)  # either message format
        if all(e.message.type is MessageType.INSERT for e in entries):
            inserts.append((pos, len(entries)))
        pos += FRAME.size + length
    middle = len(inserts) // 2
    offset = inserts[middle][0]
    data[offset + FRAME.size + 1] ^= 0xFF
    path.write_bytes(bytes(data))
    return path, offset, sum(count for _, count in inserts[:middle])


async def test_standalone_stays_up_with_one_damaged_pchannel(tmp_path: Path) -> None:
    data = tmp_path / "data"
    bad, good = PCHANNELS
    bad_v, good_v = vchannel_of(bad), vchannel_of(good)
    first = Standalone(data, nodes=1, pchannels=2)
    try:
        async with HeadraceClient(first.url) as client:
            producer = client.producer()
            for i in range(40):
                await producer.send(bad_v, b"%d" % i)
            await producer.close()
        assert first.interrupt() == 0
    finally:
        if first.proc.poll() is None:
            first.kill_all()
    path, offset, before = damage_middle_insert(data / "wal" / bad)

    running = Standalone(data, nodes=1, pchannels=2)  # asserts the ready line
    try:
        status = cli("status", "--metastore", running.url, "--json")
        assert status.returncode == 0, status.stderr
        rows = {row["pchannel"]: row for row in json.loads(status.stdout)["pchannels"]}
        assert rows[good]["wal_state"] == "SERVING"
        assert rows[bad]["wal_state"] == "CORRUPT"
        assert str(path) in rows[bad]["wal_error"]
        assert f"byte offset {offset}" in rows[bad]["wal_error"]
        text = cli("status", "--metastore", running.url)
        assert "CORRUPT" in text.stdout and str(path) in text.stdout

        async with HeadraceClient(running.url) as client:
            producer = client.producer()
            await producer.send(good_v, b"served")
            with pytest.raises(errors.CorruptData):
                await producer.send(bad_v, b"refused")
            await producer.close()
            got = []
            async with client.consume(bad_v, start="earliest") as consumer:
                with pytest.raises(errors.CorruptData, match=f"byte offset {offset}"):
                    while True:
                        entry = await consumer.next(timeout=30)
                        assert entry is not None
                        if entry.message.type is MessageType.INSERT:
                            got.append(int(entry.message.payload))
            assert got == list(range(before))

        repaired = cli("wal", "repair", "--dir", str(data / "wal"), "--pchannel", bad)
        assert repaired.returncode == 0, repaired.stderr
        assert "quarantine-" in repaired.stdout
        assert running.proc.poll() is None
        assert running.interrupt() == 0
    finally:
        if running.proc.poll() is None:
            running.kill_all()

"""A full disk under a running standalone, on a real small file system.

The data directory is a tmpfs of a few dozen MiB (the test is skipped where
this process may not mount one). The WAL fills it up to its free-space
reserve: producers get STORAGE_FULL (naming the file) within their deadline,
not NOT_OWNER; the node keeps its session and pchannel (status stays
ASSIGNED/SERVING); a message sent while
the disk is full is written exactly once after space is freed; every
acknowledged message is consumed once, in order.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.client.client import HeadraceClient
from headrace.client.producer import ProducerOptions
from headrace.message.types import MessageType
from tests.test_standalone import Standalone, cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

FS_BYTES = 96 * 1024 * 1024


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "fs"
    mount.mkdir()
    if shutil.which("mount") is None:
        pytest.skip("no mount command here to make a small tmpfs")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={FS_BYTES}", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({done.stderr.strip()}); needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(mount: Path, leave: int) -> Path:
    """A filler file that leaves about ``leave`` bytes free."""
    stat = os.statvfs(mount)
    free = stat.f_bavail * stat.f_frsize
    filler = mount / "filler"
    with filler.open("wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, max(0, free - leave))
    return filler


async def produce_until_full(client: HeadraceClient) -> tuple[list[bytes], errors.HeadraceError]:
    """Send 16 KiB messages until one fails; the acknowledged ones and the error."""
    producer = client.producer(ProducerOptions(deadline=5.0))
    payload = os.urandom(16 * 1024)
    acked: list[bytes] = []
    try:
        for i in range(1000):
            body = b"%06d" % i + payload
            try:
                await producer.send("v", body)
            except errors.HeadraceError as exc:
                return acked, exc
            acked.append(body)
    finally:
        await producer.close()
    raise AssertionError("1000 messages of 16 KiB fitted on the small file system")


async def consume_inserts(client: HeadraceClient, count: int) -> list[bytes]:
    """The payloads of the first ``count`` INSERTs; asserts no further one follows."""
    got: list[bytes] = []
    async with client.consume("v", start="earliest") as consumer:
        while len(got) < count:
            entry = await consumer.next(timeout=30)
            assert entry is not None
            if entry.message.type is MessageType.INSERT:
                got.append(entry.message.payload)
        extra = await consumer.next(timeout=1.0)
        assert extra is None or extra.message.type is not MessageType.INSERT
    return got


async def test_full_disk_gives_storage_full_and_recovers_exactly_once(small_fs: Path) -> None:
    data = small_fs / "data"
    running = Standalone(data, nodes=1, pchannels=1)
    try:
        filler = fill(small_fs, FS_BYTES // 20 + 2 * 1024 * 1024)
        await asyncio.sleep(1.0)  # the WAL reads free space a few times a second
        async with HeadraceClient(running.url) as client:
            acked, full = await produce_until_full(client)
            assert isinstance(full, errors.StorageFull), repr(full)
            assert full.retryable and str(data / "wal") in full.message

            # The CLI warns at the first refusal and exits 1 with the error.
            produced = cli(
                "produce", "--metastore", running.url, "--vchannel", "v", "--count", "2",
                "--size", "20000",
            )  # fmt: skip
            assert produced.returncode == 1, produced
            assert "first_error=STORAGE_FULL" in produced.stdout
            assert "STORAGE_FULL" in produced.stderr  # the warning at the first refusal

            status = json.loads(cli("status", "--metastore", running.url, "--json").stdout)
            (row,) = status["pchannels"]
            assert (row["state"], row["wal_state"]) == ("ASSIGNED", "SERVING")

            # A message sent while the disk is full is retried by the client
            # and written once space is freed, within its deadline.
            patient = client.producer(ProducerOptions(deadline=60.0))
            late = b"late-" + uuid.uuid4().bytes
            pending = asyncio.create_task(patient.send("v", late))
            await asyncio.sleep(2.0)
            assert not pending.done()
            filler.unlink()
            await asyncio.wait_for(pending, 60)
            after = b"after-" + uuid.uuid4().bytes
            await patient.send("v", after)
            await patient.close()
            acked += [late, after]
            assert await consume_inserts(client, len(acked)) == acked
        assert running.interrupt() == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            if running.proc.poll() is None:
                running.kill_all()

"""One standalone per data directory (issue #11, item 1).

A second ``headrace standalone`` on a directory in use exits with status 2 at
once, naming the holder's pid, without starting anything or disturbing the
first; the lock goes with the first process when it dies (SIGKILL).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from headrace import dirlock, errors
from headrace.client.client import HeadraceClient
from headrace.cluster import Keys
from headrace.metastore.factory import open_metastore
from tests.test_standalone import Standalone, cli

_HOLDER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from headrace import dirlock
    with dirlock.hold(Path(sys.argv[1]), "headrace standalone"):
        print("held", flush=True)
        time.sleep(600)
    """
)


def test_lock_names_its_holder_and_goes_with_it(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        refusal = f"in use by another headrace standalone \\(pid {holder.pid}\\)"
        for _ in range(2):  # a refused attempt does not release the holder's lock
            with (
                pytest.raises(errors.InUse, match=refusal),
                dirlock.hold(tmp_path, "headrace standalone"),
            ):
                pass
    finally:
        holder.kill()
        holder.wait()
    with dirlock.hold(tmp_path, "headrace standalone"):
        assert (tmp_path / dirlock.LOCK_FILE).read_text().strip() == str(os.getpid())


def node_leases(url: str, cluster: str) -> dict[str, int]:
    async def read() -> dict[str, int]:
        store = await open_metastore(url)
        try:
            return {kv.key: kv.lease for kv in await store.get_prefix(Keys(cluster).nodes)}
        finally:
            await store.close()

    return asyncio.run(read())


async def round_trip(url: str, payload: bytes) -> bytes:
    async with HeadraceClient(url) as client:
        producer = client.producer()
        await producer.send("lock-test", payload)
        await producer.close()
        async with client.consume("lock-test", start="earliest") as consumer:
            entry = await consumer.next(timeout=30)
            assert entry is not None
            return entry.message.payload


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_second_standalone_on_a_directory_in_use_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = Standalone(data, nodes=1, pchannels=1)
    try:
        before = node_leases(first.url, "default")
        logs_before = sorted(p.name for p in (data / "logs").iterdir())
        second = cli("standalone", "--data-dir", str(data), "--nodes", "1", "--pchannels", "1")
        assert second.returncode == 2, second.stderr
        assert f"is in use by another headrace standalone (pid {first.proc.pid})" in second.stderr
        assert "Traceback" not in second.stderr and second.stdout == ""
        assert first.proc.poll() is None
        assert node_leases(first.url, "default") == before
        assert sorted(p.name for p in (data / "logs").iterdir()) == logs_before
        assert asyncio.run(round_trip(first.url, b"still served")) == b"still served"
        first.kill_all()
    finally:
        if first.proc.poll() is None:
            first.kill_all()
    again = Standalone(data, nodes=1, pchannels=1)
    try:
        assert asyncio.run(round_trip(again.url, b"after")) == b"still served"
        assert again.interrupt() == 0
    finally:
        if again.proc.poll() is None:
            os.killpg(again.proc.pid, signal.SIGKILL)
            again.proc.wait(30)

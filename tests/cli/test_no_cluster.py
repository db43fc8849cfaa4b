"""Client commands against a metastore that holds no cluster refuse at once.

A mistyped ``sqlite:///`` path must not create directories or an empty store
(and report ``0 node(s)``), nor make ``produce`` wait for a cluster that will
never exist: every client command exits 2 with a message saying what is
missing, and the disk is left as it was.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from headrace import errors
from headrace.cluster import ClusterConfig, Keys
from headrace.metastore.factory import open_metastore

pytestmark = pytest.mark.timeout(120)

COMMANDS = [
    ["status"],
    ["produce", "--vchannel", "v", "--count", "1"],
    ["consume", "--vchannel", "v", "--count", "1"],
    ["move", "--pchannel", "pchannel-000", "--to", "node-0"],
    ["drain", "--node", "node-0"],
    ["undrain", "--node", "node-0"],
    ["balancer", "suspend"],
]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=30,  # far below the 60 s a produce waited for the cluster
        check=False,
    )


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_mistyped_path_creates_nothing(command: list[str], tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/typo/data/meta.db"
    out = cli(command[0], "--metastore", url, *command[1:])
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "NOT_FOUND" in out.stderr and "does not exist" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr
    assert listing(tmp_path) == []


def listing(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir())


async def _store_with(path: Path, *clusters: str) -> None:
    store = await open_metastore(f"sqlite:///{path}")
    try:
        for name in clusters:
            config = ClusterConfig(pchannels=["pchannel-000"]).to_json()
            await store.put(Keys(name).config, config)
    finally:
        await store.close()


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
async def test_metastore_without_the_cluster_is_refused(command: list[str], tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    await _store_with(path)
    out = cli(command[0], "--metastore", f"sqlite:///{path}", *command[1:])
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "has no cluster 'default': it holds no cluster at all" in out.stderr, out.stderr


async def test_mistyped_cluster_names_the_clusters_there(tmp_path: Path) -> None:
    path = tmp_path / "meta.db"
    await _store_with(path, "default", "orders")
    out = cli("status", "--metastore", f"sqlite:///{path}", "--cluster", "ordres")
    assert out.returncode == 2
    assert "it holds cluster(s) default, orders" in out.stderr, out.stderr


async def test_client_open_never_creates_or_alters(tmp_path: Path) -> None:
    with pytest.raises(errors.NotFound, match="does not exist"):
        await open_metastore(f"sqlite:///{tmp_path}/a/b/meta.db", create=False)
    assert listing(tmp_path) == []

    # Another program's SQLite file: refused, not given our tables or WAL mode.
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = other.read_bytes()
    with pytest.raises(errors.NotFound, match="not a Headrace metastore"):
        await open_metastore(f"sqlite:///{other}", create=False)
    assert other.read_bytes() == before
    assert listing(tmp_path) == ["other.db"]

    # An existing store opens as before.
    await _store_with(tmp_path / "meta.db", "default")
    store = await open_metastore(f"sqlite:///{tmp_path}/meta.db", create=False)
    try:
        assert await store.get(Keys().config) is not None
    finally:
        await store.close()

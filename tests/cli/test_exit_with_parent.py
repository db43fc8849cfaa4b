"""``headrace node --exit-with-parent PID`` stops once PID is gone, even if it
was gone before the node started (the node's parent is then already init or
a subreaper, so comparing with the parent it has at start would never fire)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headrace.cli.main import build_parser
from headrace.cli.run import PARENT_AT_START, orphaned

STOPS_WITHIN = 60.0
"""Seconds: generous for a slow machine; a node that never stops hangs forever."""


def gone_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def node_argv(tmp_path: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "headrace.cli",
        "node",
        "--node-id",
        "orphan",
        "--metastore",
        f"sqlite://{tmp_path}/meta.db",
        "--cluster",
        "orphans",
        "--wal",
        "local",
        "--wal-dir",
        str(tmp_path / "wal"),
        *extra,
    ]


def test_a_node_whose_parent_is_already_gone_stops(tmp_path: Path) -> None:
    parent = gone_pid()
    try:
        done = subprocess.run(
            node_argv(tmp_path, "--exit-with-parent", str(parent)),
            capture_output=True,
            text=True,
            timeout=STOPS_WITHIN,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"the node outlived its parent {parent} by {STOPS_WITHIN:.0f}s")
    assert done.returncode == 0, done.stderr
    assert f"parent process {parent} is gone" in done.stderr


def test_the_bare_flag_still_means_the_parent_at_start() -> None:
    parser = build_parser()
    base = ["node", "--node-id", "n", "--metastore", "sqlite:///x"]
    assert parser.parse_args([*base, "--exit-with-parent"]).exit_with_parent == PARENT_AT_START
    assert parser.parse_args([*base, "--exit-with-parent", "42"]).exit_with_parent == 42
    assert parser.parse_args(base).exit_with_parent is None


def test_orphaned_compares_with_the_given_parent() -> None:
    assert not orphaned(1234, 1234)
    assert orphaned(1234, 1)
    assert orphaned(1234, 777)

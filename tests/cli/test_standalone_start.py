"""How the standalone starts its nodes, and how it says that it cannot.

* A ``headrace/`` package in the working directory (a clone's parent, say)
  does not shadow the installed package in the node processes.
* A node that exits at start-up stops the standalone at once with the node's
  exit code and the end of its log, instead of a restart loop.
* A data directory that cannot be written is a one-line usage error (exit 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.cli.standalone_proc import Standalone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@pytest.fixture
def cleanup() -> Iterator[list[Standalone]]:
    started: list[Standalone] = []
    yield started
    for running in started:
        running.kill_all()


def test_a_headrace_folder_in_the_working_directory_does_not_shadow_the_nodes(
    tmp_path: Path, cleanup: list[Standalone]
) -> None:
    work = tmp_path / "work"
    (work / "headrace").mkdir(parents=True)
    (work / "headrace" / "__init__.py").write_text(
        'raise SystemExit("a shadowing headrace package was imported")\n'
    )
    running = Standalone(tmp_path / "data", cwd=work)
    cleanup.append(running)
    assert running.ready, (running.line, running.stderr)
    log = (tmp_path / "data" / "logs" / "node-0.log").read_text()
    assert "shadowing" not in log
    assert running.interrupt() == 0


@pytest.mark.timeout(900)
def test_demo_from_a_shadowing_working_directory(tmp_path: Path) -> None:
    """The demo end to end, including its data pipeline step (Spark, Iceberg)."""
    work = tmp_path / "work"
    (work / "headrace").mkdir(parents=True)
    (work / "headrace" / "__init__.py").write_text(
        'raise SystemExit("a shadowing headrace package was imported")\n'
    )
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "headrace.cli",
            "demo",
            "--count",
            "40",
            "--data-dir",
            str(tmp_path / "data"),
        ],
        cwd=work,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert out.returncode == 0, (out.stdout, out.stderr)
    assert "demo: PASSED" in out.stdout
    assert "exactly the rows not deleted: yes" in out.stdout, out.stdout


def test_a_node_failing_at_start_up_is_reported_at_once(
    tmp_path: Path, cleanup: list[Standalone]
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import os, sys\n"
        "if 'node-1' in sys.argv:\n"
        "    print('simulated start-up failure of node-1', file=sys.stderr, flush=True)\n"
        "    os._exit(3)\n"
    )
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    running = Standalone(tmp_path / "data", env={**os.environ, "PYTHONPATH": path})
    cleanup.append(running)
    assert not running.ready, running.line
    assert running.proc.wait(60) == 1
    err = running.stderr
    assert "node node-1 exited with code 3 while the standalone was starting" in err, err
    assert "simulated start-up failure of node-1" in err, err
    assert "Traceback" not in err
    # Stopped, not restarted in a loop: the failing node was started once.
    log = (tmp_path / "data" / "logs" / "node-1.log").read_text()
    assert log.count("simulated start-up failure") == 1, log


def standalone_cli(data_dir: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "headrace.cli", "standalone", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


def test_data_dir_under_a_file_is_a_usage_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    out = standalone_cli(blocker / "data")
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--data-dir" in lines[0] and "cannot write there" in lines[0]


def make_read_only(path: Path) -> Callable[[], None]:
    """Make ``path`` unwritable (as root, whom permissions do not stop, by the
    immutable attribute); return the undo."""
    if os.geteuid() != 0:
        path.chmod(0o555)
        return lambda: path.chmod(0o755)
    subprocess.run(["chattr", "+i", str(path)], check=True)
    return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)


def test_read_only_data_dir_is_a_usage_error(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    undo = make_read_only(data)
    try:
        out = standalone_cli(data)
        listed = list(data.iterdir())
    finally:
        undo()
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write there" in lines[0], out.stderr
    assert listed == []

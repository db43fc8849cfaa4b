"""Every fenced snippet of README.md is run here, or listed as not run with why.

* "Using it", shell: run as written in a temporary directory (so ``./data`` is
  the data directory), with ``source scripts/bootstrap.sh`` against a ready
  virtualenv; the ``headrace standalone`` line runs in the background until its
  ready line (which must look like the one the README shows), every other
  line must exit 0, and Ctrl-C (SIGINT) must stop the standalone with 0.
* "Using it", Python: run against a standalone, the placeholder URL replaced.
* Others are listed in :data:`NOT_RUN` by section: a snippet in a section
  that is neither run nor listed, or a second snippet where one is expected,
  fails :func:`test_every_snippet_is_run_or_listed`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.cli.standalone_proc import Standalone

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
PLACEHOLDER_URL = "sqlite:///abs/data/meta.db"


@dataclass(frozen=True)
class Snippet:
    section: str
    language: str
    text: str
    line: int


def snippets(markdown: str) -> Iterator[Snippet]:
    """The fenced code blocks of ``markdown`` with their ``##`` section."""
    section = ""
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = re.match(r"^(```+)\s*(\S*)", line)
        if fence:
            start = i
            body: list[str] = []
            i += 1
            while i < len(lines) and not lines[i].startswith(fence.group(1)):
                body.append(lines[i])
                i += 1
            yield Snippet(section, fence.group(2), "\n".join(body) + "\n", start + 1)
        i += 1


RUN = {("Using it", "sh"): 1, ("Using it", "python"): 1}
"""Snippets run by this module: (section, language) -> how many there are."""

NOT_RUN = {
    "Set-up: two commands": "scripts/demo.sh and scripts/test.sh install into .venv and run the "
    "whole suite: CI runs them (.ci/run), not a test inside that suite",
    "Architecture": "a diagram, not code",
    "On Kubernetes": "needs a Kubernetes cluster, Helm and docker; the manifests are checked by "
    "the operator's tests",
}
"""Sections whose snippets are not run here, with the reason."""


def readme_snippets() -> list[Snippet]:
    return list(snippets(README.read_text()))


def test_every_snippet_is_run_or_listed() -> None:
    found = readme_snippets()
    assert found, "no snippets found: the extraction is broken"
    counts: dict[tuple[str, str], int] = {}
    for snippet in found:
        if snippet.section in NOT_RUN:
            continue
        key = (snippet.section, snippet.language)
        assert key in RUN, f"README line {snippet.line}: snippet {key} is neither run nor listed"
        counts[key] = counts.get(key, 0) + 1
    assert counts == RUN


def the_snippet(section: str, language: str) -> Snippet:
    (snippet,) = [s for s in readme_snippets() if (s.section, s.language) == (section, language)]
    return snippet


def ready_venv(root: Path) -> Path:
    """A virtualenv bootstrap.sh takes as installed, whose ``headrace`` runs this checkout."""
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    headrace = venv / "bin" / "headrace"
    headrace.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m headrace.cli "$@"\n')
    headrace.chmod(0o755)
    stamp = venv / ".headrace-install-base"
    stamp.touch()
    newer = (REPO / "pyproject.toml").stat().st_mtime + 60
    os.utime(stamp, (newer, newer))
    return venv


def shell_script(snippet: str, repo: Path) -> tuple[str, str]:
    """The README's shell lines as a script, and the ready line the README shows.

    The standalone line runs in the background (its stdout in ``standalone.out``)
    and the script waits for its ready line; ``source scripts/...`` is sourced
    from the checkout."""
    out = ["set -euo pipefail"]
    shown = ""
    for raw in snippet.splitlines():
        line = raw.strip()
        if line.startswith("# →"):
            shown = line.removeprefix("# →").strip()
            continue
        if not line or line.startswith("#"):
            continue
        line = line.replace("source scripts/", f"source {repo}/scripts/")
        if line.startswith("headrace standalone"):
            command = line.split("#", 1)[0].strip()
            out.append(f"{command} > standalone.out 2> standalone.err &")
            out.append("echo $! > standalone.pid")
            out.append(
                "for _ in $(seq 600); do grep -q 'standalone ready' standalone.out && break; "
                "kill -0 $(cat standalone.pid) || exit 9; sleep 0.2; done"
            )
            out.append("grep -q 'standalone ready' standalone.out")
            continue
        out.append(f"echo '+ {line.split('#', 1)[0].strip()}' >&2")
        out.append(line)
    return "\n".join(out) + "\n", shown


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_using_it_shell_snippet(tmp_path: Path) -> None:
    script, shown = shell_script(the_snippet("Using it", "sh").text, REPO)
    assert shown.startswith("headrace standalone ready metastore=sqlite:///")
    venv = ready_venv(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "HEADRACE_VENV": str(venv)}
    try:
        run = subprocess.run(
            ["bash", "-c", script],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=500,
            check=False,
        )
        assert run.returncode == 0, (run.stdout[-3000:], run.stderr[-3000:])
        ready = (work / "standalone.out").read_text().splitlines()[0]
        # The ready line has the shape the README shows (paths differ).
        expected = re.escape(shown.removesuffix("...").strip()).replace(
            re.escape("/abs/data/meta.db"), r"/\S+/data/meta\.db"
        )
        assert re.match(expected, ready), (shown, ready)
        assert (work / "acks.jsonl").read_text().count("\n") == 100
        assert (work / "data" / "logs" / "node-0.log").read_text()
    finally:
        pid_file = work / "standalone.pid"
        if pid_file.exists():
            pid = int(pid_file.read_text())
            os.kill(pid, signal.SIGINT)  # the README's Ctrl-C
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.2)
            assert not _alive(pid), "the standalone did not stop on SIGINT"


def _alive(pid: int) -> bool:
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return waited == 0


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_python_snippet(tmp_path: Path) -> None:
    code = the_snippet("Using it", "python").text
    assert code.count(PLACEHOLDER_URL) == 1
    running = Standalone(tmp_path / "data")
    try:
        assert running.ready, (running.line, running.stderr)
        out = subprocess.run(
            [sys.executable, "-c", code.replace(PLACEHOLDER_URL, running.url)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip().endswith("orders-0 b'payload'"), out.stdout
        assert running.interrupt() == 0
    finally:
        running.kill_all()

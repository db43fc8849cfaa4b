"""Every fenced snippet of README.md is run here, or listed as not run with why.

* "Using it", shell: run as written in a temporary directory (so ``./data`` is
  the data directory), with ``source scripts/bootstrap.sh`` against a ready
  virtualenv; the ``headrace standalone`` line runs in the background until its
  ready line (which must look like the one the README shows), every other
  line must exit 0, and Ctrl-C (SIGINT) must stop the standalone with 0.
* "Using it", Python: run against a standalone, the placeholder URL replaced.
* "Operating the local WAL", shell: a record in the middle of pchannel-003's
  log of a ``--pchannels 16`` standalone is damaged, then the lines run as
  written (``$M`` as "Using it" defines it) beside that standalone: both exit
  0, their output has the shape the README shows (the status comment, the
  ``# →`` lines), the damaged rest is in the quarantine directory, and after a
  ``headrace move`` the pchannel serves again with the records before the damage.
* Others are listed in :data:`NOT_RUN` by section: a snippet in a section
  that is neither run nor listed, or a second snippet where one is expected,
  fails :func:`test_every_snippet_is_run_or_listed`.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from headrace.client import api as client_api
from headrace.client.client import HeadraceClient
from headrace.cluster import NEW_CLUSTER_ROUTING, default_pchannels, route
from headrace.message.types import MessageType
from tests.cli.standalone_proc import Standalone
from tests.test_standalone_damage import damage_middle_insert

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


DAMAGE_SECTION = "Operating the local WAL: damaged records and full disks"

RUN = {("Using it", "sh"): 1, ("Using it", "python"): 1, (DAMAGE_SECTION, "sh"): 1}
"""Snippets run by this module: (section, language) -> how many there are."""

NOT_RUN = {
    "Set-up: two commands": "scripts/demo.sh and scripts/test.sh install into .venv and run the "
    "whole suite: CI runs them (.ci/run), not a test inside that suite",
    "Architecture": "a diagram, not code",
    "Collections": "the duckdb CLI is not part of the test bed; the same workflow (create, "
    "insert, delete, flush --wait, read the Iceberg table) runs in the demo "
    "(test_demo_from_a_shadowing_working_directory), the CLI in "
    "tests/cli/test_collections_cli.py and the end to end check with DuckDB in "
    "tests/spark_apps/test_collection_end_to_end.py; the snapshot read snippets need a "
    "flushed collection and a `written` from an insert: the same calls (read with columns, "
    "filter and as_of, read_batches, headrace read in every format) run in "
    "tests/client/test_snapshot_read.py against real nodes and the real flush job",
    "On Kubernetes": "needs a Kubernetes cluster, Helm and docker; the manifests (the "
    "StreamingCluster and the UpgradePlan) are checked by tests/headrace_operator/test_readme.py "
    "against the models and a real API server; the upgrade workflow runs in e2e/test_upgrade.py",
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


def shown_output(snippet: str) -> str:
    """The output a snippet shows: its ``# →`` line and the ``#`` lines after it, joined."""
    shown: list[str] = []
    for raw in snippet.splitlines():
        line = raw.strip()
        if line.startswith("# →"):
            shown.append(line.removeprefix("# →").strip())
        elif shown and line.startswith("#"):
            shown.append(line.removeprefix("#").strip())
        elif shown:
            break
    return " ".join(shown)


def shape(shown: str) -> re.Pattern[str]:
    """A pattern for output of the shape ``shown``: its numbers any numbers (a
    pchannel's name kept), ``...`` any text, ``<file>`` a path, spaces any spaces."""
    parts = re.split(r"(\.\.\.|<file>|pchannel-\d+|\d+|\s+)", shown)
    pattern = "".join(
        ".*"
        if part == "..."
        else r"\S+"
        if part == "<file>"
        else r"\d+"
        if part.isdigit()
        else r"\s+"
        if part.isspace()
        else re.escape(part)
        for part in parts
    )
    return re.compile(pattern, re.DOTALL)


def command_lines(snippet: str) -> list[str]:
    """The snippet's command lines, as written (trailing comments included)."""
    return [
        line.strip()
        for line in snippet.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


@dataclass(frozen=True)
class ReadmeShell:
    """Runs a README line with bash in ``work`` (so ``./data`` is the data
    directory), ``$M`` defined as the Using-it section defines it and
    ``headrace`` on the PATH."""

    work: Path
    define_m: str
    env: dict[str, str]

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{self.define_m}\n{line}\n"],
            cwd=self.work,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


@dataclass(frozen=True)
class Damage:
    segment: Path
    offset: int
    kept: int
    """How many of the written messages come before the damaged record."""


async def write_and_damage(data: Path, vchannel: str, pchannel: str) -> Damage:
    """Write 40 messages to ``vchannel`` (on ``pchannel``) with a stopped-again
    standalone, then damage a record in the middle of ``pchannel``'s log."""
    first = Standalone(data, nodes=2, pchannels=16, cwd=data.parent)
    try:
        assert first.ready, (first.line, first.stderr)
        async with HeadraceClient(first.url) as client:
            producer = client.producer()
            for i in range(40):
                await producer.send(vchannel, b"%d" % i)
            await producer.close()
        assert first.interrupt() == 0
    finally:
        first.kill_all()
    return Damage(*damage_middle_insert(data / "wal" / pchannel))


async def serving_after(url: str, pchannel: str) -> dict[str, Any]:
    """``pchannel``'s status row once its WAL serves (or after a minute)."""
    deadline = time.monotonic() + 60
    while True:
        report = await client_api.cluster_status(url)
        (row,) = [r for r in report["pchannels"] if r["pchannel"] == pchannel]
        if row["wal_state"] == "SERVING" or time.monotonic() > deadline:
            return dict(row)
        await asyncio.sleep(0.5)


async def inserts_after_writing(url: str, vchannel: str, last: bytes) -> list[bytes]:
    """Send ``last`` to ``vchannel``, then read its INSERT payloads from the earliest to it."""
    async with HeadraceClient(url) as client:
        producer = client.producer()
        await producer.send(vchannel, last)
        await producer.close()
        got: list[bytes] = []
        async with client.consume(vchannel, start="earliest") as consumer:
            while got[-1:] != [last]:
                entry = await consumer.next(timeout=30)
                assert entry is not None, got
                if entry.message.type is MessageType.INSERT:
                    got.append(entry.message.payload)
    return got


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_damaged_record_snippet(tmp_path: Path) -> None:
    snippet = the_snippet(DAMAGE_SECTION, "sh").text
    status_line, repair_line = command_lines(snippet)
    assert status_line.startswith("headrace status --metastore $M"), status_line
    assert repair_line.startswith("headrace wal repair --dir ./data/wal --pchannel "), repair_line
    pchannel = repair_line.split("--pchannel", 1)[1].split()[0]
    pchannels = default_pchannels(16)  # the Using-it standalone's --pchannels 16
    assert pchannel in pchannels
    vchannel = next(
        v
        for v in (f"orders-{i}" for i in range(1000))
        if route(v, pchannels, NEW_CLUSTER_ROUTING) == pchannel
    )
    work = tmp_path / "work"
    work.mkdir()
    data = work / "data"
    damage = await write_and_damage(data, vchannel, pchannel)
    (define_m,) = [
        line for line in the_snippet("Using it", "sh").text.splitlines() if line.startswith("M=")
    ]
    path = f"{ready_venv(tmp_path) / 'bin'}{os.pathsep}{os.environ['PATH']}"
    shell = ReadmeShell(work, define_m, {**os.environ, "PATH": path})

    running = Standalone(data, nodes=2, pchannels=16, cwd=work)
    try:
        assert running.ready, (running.line, running.stderr)
        status = shell.run(status_line)
        assert status.returncode == 0, status.stderr
        (row,) = [r.split() for r in status.stdout.splitlines() if r.split()[:1] == [pchannel]]
        assert (row[1], row[4]) == ("ASSIGNED", "CORRUPT"), status.stdout
        error = re.search(
            rf"^{pchannel}: CORRUPT: (\S+): record (\d+) at byte offset (\d+) ", status.stdout, re.M
        )
        assert error, status.stdout
        assert (error[1], int(error[3])) == (str(damage.segment), damage.offset), error[0]
        record = int(error[2])
        shown_status = status_line.split("#", 1)[1].strip()
        assert shape(shown_status).search(status.stdout), (shown_status, status.stdout)

        repaired = shell.run(repair_line)
        assert repaired.returncode == 0, repaired.stderr
        out = repaired.stdout.strip()
        assert shape(shown_output(snippet)).fullmatch(out), (shown_output(snippet), out)
        where = f"byte offset {damage.offset} of ./{damage.segment.relative_to(work)};"
        assert out.startswith(f"pchannel {pchannel}: damaged record {record} at {where}")
        quarantine = work / out.split(" aside into ", 1)[1].split(": ", 1)[0]
        assert quarantine.parent == data / "wal" / pchannel, quarantine
        assert quarantine.name.endswith(f"-lsn{record}"), quarantine
        assert (quarantine / f"{damage.segment.name}.from-{damage.offset}").is_file()

        # "or sooner after a `headrace move` to another node": it serves the pchannel again
        other = "node-0" if row[2] == "node-1" else "node-1"
        moved = shell.run(f"headrace move --metastore $M --pchannel {pchannel} --to {other}")
        assert moved.returncode == 0, moved.stderr
        served = await serving_after(running.url, pchannel)
        assert (served["node"], served["wal_state"]) == (other, "SERVING"), served
        # The valid prefix is kept and writing goes on after it.
        got = await inserts_after_writing(running.url, vchannel, b"after repair")
        assert got == [b"%d" % i for i in range(damage.kept)] + [b"after repair"]
        assert running.interrupt() == 0
    finally:
        running.kill_all()

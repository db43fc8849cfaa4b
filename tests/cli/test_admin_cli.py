"""The admin and data commands against a running standalone (2 nodes, 4 pchannels).

drain / undrain / status (frozen and draining nodes, the balancer), balancer
suspend / resume, a move to the current owner, ``produce --acks``, exit codes
of rejected messages, a closed stdout, and the node logs in normal operation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headrace.message.formats import RELEASE_FORMATS, describe
from tests.cli.closed_pipe import cli_into_closed_pipe
from tests.cli.standalone_proc import Standalone

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    running = Standalone(tmp_path_factory.mktemp("admin") / "data")
    assert running.ready, (running.line, running.stderr)
    yield running
    running.kill_all()


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def status(url: str) -> dict[str, Any]:
    out = cli("status", "--metastore", url, "--json")
    assert out.returncode == 0, out.stderr
    report: dict[str, Any] = json.loads(out.stdout)
    return report


def node_row(report: dict[str, Any], node: str) -> dict[str, Any]:
    return next(n for n in report["nodes"] if n["node_id"] == node)


def wait_status(url: str, check: Any, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        report = status(url)
        if check(report) or time.monotonic() > deadline:
            return report
        time.sleep(0.3)


def test_drain_freezes_until_undrain(standalone: Standalone) -> None:
    url = standalone.url
    out = cli("drain", "--metastore", url, "--node", "node-1", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["frozen"] is True

    report = status(url)
    row = node_row(report, "node-1")
    assert row["frozen"] is True and row["draining"] is True and row["alive"] is True
    assert all(p["owner"] == "node-0" for p in report["pchannels"])
    text = cli("status", "--metastore", url).stdout
    line = next(s for s in text.splitlines() if s.startswith("node-1"))
    assert "frozen" in line, text

    out = cli("move", "--metastore", url, "--pchannel", "pchannel-000", "--to", "node-1")
    assert out.returncode == 2 and "frozen" in out.stderr, out.stderr

    out = cli("undrain", "--metastore", url, "--node", "node-1", "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"node": "node-1", "was": "draining", "frozen": False}
    report = wait_status(
        url,
        lambda r: any(p["owner"] == "node-1" and p["state"] == "ASSIGNED" for p in r["pchannels"]),
    )
    assert node_row(report, "node-1")["frozen"] is False
    assert any(p["owner"] == "node-1" for p in report["pchannels"]), report

    out = cli("undrain", "--metastore", url, "--node", "node-9")
    assert out.returncode == 2 and "neither registered nor frozen" in out.stderr


def test_balancer_suspend_and_resume(standalone: Standalone) -> None:
    url = standalone.url
    assert status(url)["balancer"] == "active"
    out = cli("balancer", "--metastore", url, "suspend")
    assert out.returncode == 0, out.stderr
    assert status(url)["balancer"] == "suspended"
    assert "balancer suspended" in cli("status", "--metastore", url).stdout
    out = cli("balancer", "--metastore", url, "resume")
    assert out.returncode == 0, out.stderr
    assert status(url)["balancer"] == "active"


def test_move_to_the_current_owner_answers_at_once(standalone: Standalone) -> None:
    url = standalone.url
    row = status(url)["pchannels"][0]
    out = cli(
        "move",
        "--metastore",
        url,
        "--pchannel",
        row["pchannel"],
        "--to",
        row["owner"],
        "--timeout",
        "60",
        "--json",
        timeout=40,
    )
    assert out.returncode == 0, out.stderr
    outcome = json.loads(out.stdout)
    assert outcome["moved"] is False and outcome["term"] == row["term"]
    assert status(url)["pchannels"][0]["term"] == row["term"]


def test_produce_acks_file_lists_every_acknowledged_message(
    standalone: Standalone, tmp_path: Path
) -> None:
    url = standalone.url
    acks = tmp_path / "acks.jsonl"
    out = cli(
        "produce",
        "--metastore",
        url,
        "--vchannel",
        "acks-a",
        "--vchannel",
        "acks-b",
        "--count",
        "200",
        "--size",
        "10",
        "--acks",
        str(acks),
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["acked"] == 200
    lines = [json.loads(line) for line in acks.read_text().splitlines()]
    assert sorted(a["index"] for a in lines) == list(range(200))
    assert all(set(a) == {"index", "vchannel", "id", "timetick", "term"} for a in lines)
    assert all(a["vchannel"] == ("acks-a" if a["index"] % 2 == 0 else "acks-b") for a in lines)
    out = cli(
        "consume",
        "--metastore",
        url,
        "--vchannel",
        "acks-a",
        "--count",
        "100",
        "--json",
        "--timeout",
        "20",
    )
    assert out.returncode == 0, out.stderr
    consumed = [json.loads(line)["id"] for line in out.stdout.splitlines()]
    acked_a = sorted((a for a in lines if a["vchannel"] == "acks-a"), key=lambda a: a["timetick"])
    assert consumed == [a["id"] for a in acked_a]

    # '-': the acknowledgements on stdout, the summary on stderr.
    out = cli(
        "produce",
        "--metastore",
        url,
        "--vchannel",
        "acks-c",
        "--count",
        "5",
        "--acks",
        "-",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    assert len([json.loads(line) for line in out.stdout.splitlines()]) == 5
    assert json.loads(out.stderr.strip().splitlines()[-1])["acked"] == 5

    out = cli(
        "produce", "--metastore", url, "--vchannel", "x", "--acks", str(tmp_path / "no" / "f")
    )
    assert out.returncode == 2 and "--acks" in out.stderr


def test_rejected_messages_exit_2(standalone: Standalone) -> None:
    out = cli(
        "produce",
        "--metastore",
        standalone.url,
        "--vchannel",
        "big",
        "--count",
        "2",
        "--size",
        str(9 * 1024 * 1024),
        "--json",
    )
    assert out.returncode == 2, out.stderr
    result = json.loads(out.stdout)
    assert result["failed"] == 2 and "TOO_LARGE" in result["first_error"]


def test_status_into_a_closed_pipe_ends_quietly(standalone: Standalone) -> None:
    out = cli_into_closed_pipe("status", "--metastore", standalone.url)
    assert out.returncode == 141 and out.stderr == "", out.stderr


def test_node_logs_in_normal_operation(standalone: Standalone) -> None:
    logs = standalone.data_dir / "logs"
    text = (logs / "node-0.log").read_text()
    assert "node node-0 starting" in text, text
    assert "serves pchannel-" in text and "at term" in text, text
    assert "Traceback" not in text


def test_format_show_and_a_refused_switch(standalone: Standalone) -> None:
    """The standalone creates its cluster in the newest format its release
    writes; its nodes advertise this release's formats; a switch to a format no
    node writes is refused, naming each node's, and so is one backwards."""
    url = standalone.url
    reads, writes = sorted(RELEASE_FORMATS.reads), sorted(RELEASE_FORMATS.writes)
    out = cli("format", "show", "--metastore", url, "--json")
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    newest = max(writes)
    assert shown["message_format"] == newest and shown["common_writable"] == newest
    assert shown["nodes"] == {
        "node-0": {"reads": reads, "writes": writes},
        "node-1": {"reads": reads, "writes": writes},
    }
    unwritten = max(reads) + 1
    out = cli("format", "set", str(unwritten), "--metastore", url)
    assert out.returncode == 2, out.stderr
    each = f"(reads {describe(reads)}, writes {describe(writes)})"
    assert (
        f"cannot switch cluster 'default' to message format {unwritten}: not every registered "
        f"node can read and write format {unwritten}: node-0 {each}, node-1 {each}"
    ) in out.stderr
    out = cli("format", "set", str(newest), "--metastore", url, "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "message_format": newest,
        "previous": newest,
        "changed": False,
    }
    if newest > 1:
        out = cli("format", "set", "1", "--metastore", url)
        assert out.returncode == 2 and "formats only move forward" in out.stderr, out.stderr
    report = status(url)
    assert report["message_format"] == newest
    assert {(n["node_id"], tuple(n["reads"]), tuple(n["writes"])) for n in report["nodes"]} == {
        ("node-0", tuple(reads), tuple(writes)),
        ("node-1", tuple(reads), tuple(writes)),
    }
    # A log without a record counts as format 1 (logs from before formats were
    # recorded): the first open adds the cluster's format to that.
    logs = sorted({1, newest})
    assert all(p["formats"] == logs and p["reason"] == "" for p in report["pchannels"])
    assert f"message format {newest}" in cli("status", "--metastore", url).stdout

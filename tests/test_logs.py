"""JSON logs: one event per line, with node, pchannel and term where they apply."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace import logs
from headrace.cli.main import LOG_FORMAT_ENV, build_parser
from tests.cli.standalone_proc import Standalone


@pytest.fixture
def json_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    logs.configure(logging.INFO, logs.LogFormat.JSON, stream)
    try:
        yield stream
    finally:
        for handler in list(root.handlers):
            root.removeHandler(handler)
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


def events(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_context_fields_reach_records_and_tasks_created_in_the_block(
    json_lines: io.StringIO,
) -> None:
    log = logging.getLogger("headrace.test")

    async def scenario() -> None:
        with logs.bound(node="node-1"):
            with logs.bound(pchannel="p-0", term=3):
                task = asyncio.get_running_loop().create_task(asyncio.sleep(0.01))
                later = asyncio.get_running_loop().create_task(_log_after(task, log))
            log.info("node only")
        log.warning("nothing bound")
        await later

    asyncio.run(scenario())
    by_message = {e["message"]: e for e in events(json_lines)}
    assert by_message["node only"]["node"] == "node-1"
    assert "pchannel" not in by_message["node only"]
    after = by_message["from a task, after the block"]
    assert (after["node"], after["pchannel"], after["term"]) == ("node-1", "p-0", 3)
    bare = by_message["nothing bound"]
    assert bare["level"] == "WARNING" and bare["logger"] == "headrace.test"
    assert not {"node", "pchannel", "term"} & bare.keys() and "time" in bare


async def _log_after(task: asyncio.Task[None], log: logging.Logger) -> None:
    await task
    log.info("from a task, after the block")


def test_extra_wins_over_the_context_and_exceptions_stay_on_one_line(
    json_lines: io.StringIO,
) -> None:
    log = logging.getLogger("headrace.test")
    with logs.bound(pchannel="p-0", term=1):
        log.info("explicit", extra={"pchannel": "p-9"})
        try:
            raise ValueError("boom\nsecond line")
        except ValueError:
            log.exception("failed")
    lines = json_lines.getvalue().splitlines()
    assert len(lines) == 2
    explicit, failed = (json.loads(line) for line in lines)
    assert (explicit["pchannel"], explicit["term"]) == ("p-9", 1)
    assert "ValueError: boom" in str(failed["exc_info"])


def test_every_command_takes_log_format_and_the_variable_sets_its_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = build_parser().parse_args(["node", "--node-id", "n", "--metastore", "sqlite:///x"])
    assert args.log_format is logs.LogFormat.TEXT
    args = build_parser().parse_args(["status", "--metastore", "m", "--log-format", "json"])
    assert args.log_format is logs.LogFormat.JSON
    monkeypatch.setenv(LOG_FORMAT_ENV, "json")
    assert build_parser().parse_args(["status", "--metastore", "m"]).log_format is (
        logs.LogFormat.JSON
    )
    monkeypatch.setenv(LOG_FORMAT_ENV, "xml")
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["status", "--metastore", "m"])
    assert exit_info.value.code == 2


def test_a_standalone_with_json_logs_writes_json_node_logs(tmp_path: Path) -> None:
    running = Standalone(
        tmp_path / "data", nodes=1, pchannels=2, extra=["--log-format", "json", "--no-flush"]
    ).require_ready()
    try:
        assert running.interrupt() == 0
    finally:
        running.kill_all()
    lines = (tmp_path / "data" / "logs" / "node-0.log").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert records and len(records) == len([line for line in lines if line.strip()])
    served = [r for r in records if str(r["message"]).startswith("node node-0 serves")]
    assert {(r["node"], r["pchannel"], r["term"]) for r in served} == {
        ("node-0", "pchannel-000", 1),
        ("node-0", "pchannel-001", 1),
    }

"""Broker faults of chaos runs, without a broker: the signals and the test bed's state file."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from headrace import errors
from headrace.bench import broker_faults
from headrace.bench.procs import FaultTimings

_RUNNER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    state = sys.argv[1]
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    restarts = 0
    def write():
        with open(state + ".partial", "w") as f:
            json.dump({"pid": child.pid, "runner": os.getpid(), "restarts": restarts}, f)
        os.replace(state + ".partial", state)
    def on_hup(*_):
        global child, restarts
        child.kill(); child.wait()
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        restarts += 1
        write()
    signal.signal(signal.SIGHUP, on_hup)
    write()
    while True:
        time.sleep(0.1)
    """
)


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + 30
    while not path.exists():
        assert time.monotonic() < deadline, "the fake runner wrote no state"
        time.sleep(0.05)


async def _stall_then_restart(broker: broker_faults.TestbedBroker) -> None:
    first = broker.pid()
    stalling = asyncio.create_task(broker_faults.stall(broker, 1.0))
    await asyncio.sleep(0.3)
    assert _process_state(first) == "T", "the broker process is not stopped"
    await stalling
    assert _process_state(first) != "T", "the broker process was not continued"
    await broker.restart()
    assert broker.pid() != first


def test_a_testbed_broker_is_stalled_and_restarted_through_its_state_file(
    tmp_path: Path,
) -> None:
    state = tmp_path / broker_faults.STATE_FILE
    runner = subprocess.Popen([sys.executable, "-c", _RUNNER, str(state)])
    try:
        _wait_for(state)
        asyncio.run(_stall_then_restart(broker_faults.TestbedBroker(tmp_path, 30)))
        assert json.loads(state.read_text())["restarts"] == 1
    finally:
        runner.kill()
        runner.wait()
        if state.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(json.loads(state.read_text())["pid"], signal.SIGKILL)


def test_a_missing_or_foreign_state_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="headrace_testbed"):
        broker_faults.TestbedBroker(tmp_path)
    (tmp_path / broker_faults.STATE_FILE).write_text('{"pid": "x"}')
    with pytest.raises(errors.InvalidArgument, match="not a test bed state file"):
        broker_faults.TestbedBroker(tmp_path)


def test_unknown_broker_fault_kinds_are_refused() -> None:
    with pytest.raises(errors.InvalidArgument, match="broker faults"):
        FaultTimings(broker_kinds=("broker_explode",))
    with pytest.raises(errors.InvalidArgument, match="broker faults"):
        FaultTimings(broker_kinds=())

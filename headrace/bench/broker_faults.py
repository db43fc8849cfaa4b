"""Faults of the broker itself in chaos runs: stall it, restart it.

A chaos run on Kafka or Pulsar may be handed a :class:`BrokerControl`: the
broker's process id (the fault injector stops it with SIGSTOP for some
seconds, then SIGCONT, as a long GC pause or a frozen VM would) and a way to
restart it on the same ports and data (a crash and supervisor restart, as seen
by clients). :class:`TestbedBroker` controls a broker that the project's test
bed serves (``python -m headrace_testbed.kafka run DIR``, or ``.pulsar``)
through the state file the test bed keeps in ``DIR``; tests hand over their
in-process broker with an object of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path
from typing import Any, Protocol

from headrace import errors

STATE_FILE = "testbed.json"
"""The test bed's state file in a broker's data dir (``pid``, ``runner``, ``restarts``)."""
RESTART_TIMEOUT_S = 240.0
_POLL_S = 0.2


class BrokerControl(Protocol):
    """A broker a chaos run may stall and restart."""

    def pid(self) -> int:
        """The broker's process (the JVM), the one to SIGSTOP and SIGCONT."""
        ...

    async def restart(self) -> None:
        """Stop the broker and start it again on the same ports and data;
        return once it serves again. A Headrace error if it does not."""
        ...


def read_state(path: Path) -> dict[str, int]:
    """The test bed's state file: ``pid``, ``runner`` and ``restarts``."""
    try:
        raw: Any = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise errors.InvalidArgument(
            f"cannot read the test bed's broker state {path}: {exc} (start the broker with "
            "'PYTHONPATH=scripts python -m headrace_testbed.kafka run DIR', or .pulsar, and "
            "pass that DIR)"
        ) from None
    fields = ("pid", "runner", "restarts")
    if not isinstance(raw, dict) or not all(isinstance(raw.get(f), int) for f in fields):
        raise errors.InvalidArgument(f"{path} is not a test bed state file (needs {fields})")
    return {f: int(raw[f]) for f in fields}


class TestbedBroker:
    """A broker served by the test bed's ``run`` command, whose data dir is ``data_dir``."""

    __test__ = False  # not a pytest test class

    def __init__(self, data_dir: Path, restart_timeout_s: float = RESTART_TIMEOUT_S) -> None:
        self.path = Path(data_dir) / STATE_FILE
        self.restart_timeout_s = restart_timeout_s
        read_state(self.path)

    def pid(self) -> int:
        return read_state(self.path)["pid"]

    async def restart(self) -> None:
        """SIGHUP the test bed's runner, then wait until its state names the new process."""
        before = read_state(self.path)
        _signal(before["runner"], signal.SIGHUP)
        deadline = time.monotonic() + self.restart_timeout_s
        while time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
            if read_state(self.path)["restarts"] > before["restarts"]:
                return
        raise errors.Unavailable(
            f"the test bed broker of {self.path.parent} did not serve again within "
            f"{self.restart_timeout_s:g} s of a restart"
        )


async def stall(broker: BrokerControl, seconds: float) -> None:
    """SIGSTOP the broker for ``seconds``, then SIGCONT it (also when cancelled)."""
    pid = broker.pid()
    _signal(pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        _signal(pid, signal.SIGCONT)


def _signal(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        raise errors.Unavailable(
            f"the broker process {pid} is gone ({sig.name} not sent)"
        ) from None

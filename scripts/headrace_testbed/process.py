"""What every test-bed server process shares: starting it until it serves,
stopping it, reading its log's tail, and being a context manager that stops
on exit."""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar

from headrace_testbed import TestbedError
from headrace_testbed.cache import file_lock


def stop_process(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM ``process``, and SIGKILL it if it has not exited after ``timeout_s``."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout_s)


def log_tail(path: Path, limit: int = 4000) -> str:
    """The last ``limit`` characters of the log at ``path`` ("" if unreadable)."""
    try:
        return path.read_text(errors="replace")[-limit:]
    except OSError:
        return ""


class StopOnExit(abc.ABC):
    """A server that ``with`` stops on exit; subclasses say how in :meth:`stop`."""

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class Launched(Protocol):
    """A server process just launched, as :func:`start_server` handles it."""

    process: subprocess.Popen[bytes]

    def stop(self) -> None: ...

    def log_tail(self) -> str: ...


S = TypeVar("S", bound=Launched)


@dataclasses.dataclass(frozen=True, slots=True)
class StartOptions:
    attempts: int
    """Launches at the most; another comes only after ``address already in use``."""
    timeout_s: float
    """How long one launch may take to become ready."""
    poll_s: float
    lock: Path | None = None
    """A file lock held from launch until ready, so that concurrent test
    sessions choose and bind ports one at a time."""


def start_server(
    launch: Callable[[], S], ready: Callable[[S], bool], failure: str, options: StartOptions
) -> S:
    """``launch()`` until ``ready(server)``; a launch whose ports were taken
    meanwhile is retried. Otherwise a TestbedError ``{failure}; log tail: ...``."""
    last_log = ""
    for _ in range(options.attempts):
        with file_lock(options.lock) if options.lock else contextlib.nullcontext():
            server = launch()
            deadline = time.monotonic() + options.timeout_s
            while time.monotonic() < deadline and server.process.poll() is None:
                if ready(server):
                    return server
                time.sleep(options.poll_s)
        server.stop()
        last_log = server.log_tail()
        if "address already in use" not in last_log:
            break
    raise TestbedError(f"{failure}; log tail:\n{last_log}")

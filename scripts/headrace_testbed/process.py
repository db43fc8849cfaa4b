"""What every test-bed server process shares: stopping it, reading its log's
tail, and being a context manager that stops on exit."""

from __future__ import annotations

import abc
import signal
import subprocess
from pathlib import Path
from types import TracebackType
from typing import Self


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

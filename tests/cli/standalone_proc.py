"""A ``headrace standalone`` process for the CLI tests (run with ``python -P``,
so the test's own working directory is never on its ``sys.path``)."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

from headrace.cli.run import standalone_command


def child_pids(parent: int, pattern: str) -> list[int]:
    """Pids of ``parent``'s children whose command line contains ``pattern``."""
    found = subprocess.run(
        ["pgrep", "-P", str(parent), "-f", "--", pattern],
        check=False,
        capture_output=True,
        text=True,
    )
    return [int(pid) for pid in found.stdout.split()]


class Standalone:
    def __init__(
        self,
        data_dir: Path,
        *,
        nodes: int = 2,
        pchannels: int = 4,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
        extra: Sequence[str] = (),
    ) -> None:
        self.data_dir = data_dir
        self.stderr_path = data_dir.parent / f"{data_dir.name}-standalone.err"
        with self.stderr_path.open("w") as err:
            self.proc = subprocess.Popen(
                [
                    *standalone_command(data_dir, nodes=nodes, pchannels=pchannels),
                    "--lease-ttl",
                    "2",
                    *extra,
                ],
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
                cwd=cwd,
                env=dict(env) if env is not None else None,
            )
        assert self.proc.stdout is not None
        self.line = self.proc.stdout.readline().strip()
        self.ready = self.line.startswith("headrace standalone ready")
        self.url = self.line.split("metastore=", 1)[1].split()[0] if self.ready else ""

    def require_ready(self) -> Standalone:
        """This process, asserted ready (else the test fails with its first line and stderr)."""
        assert self.ready, (self.line, self.stderr)
        return self

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(60)

    def children(self, pattern: str) -> list[int]:
        """This standalone's child processes whose command line contains ``pattern``."""
        return child_pids(self.proc.pid, pattern)

    def kill_all(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

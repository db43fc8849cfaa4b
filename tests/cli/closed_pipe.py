"""Running the ``headrace`` CLI with its stdout a pipe whose reader is gone."""

from __future__ import annotations

import os
import subprocess
import sys


def cli_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m headrace.cli ARGS`` writing into a pipe already closed at the
    reading end (as ``| head`` leaves it); stderr is captured."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "headrace.cli", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)

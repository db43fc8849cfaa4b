"""An exclusive lock on a data directory, held for the life of a process.

``flock`` on ``DIR/LOCK``: the kernel drops it when the holding process ends,
however it ends, so there is never a stale lock to clean up. The holder writes
its pid into the file, so a second process can say who holds the directory.
The descriptor is not inherited by child processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from headrace import errors

LOCK_FILE = "LOCK"


def _holder(fd: int) -> str:
    """The pid the holder wrote, as text ("unknown" while it is writing it)."""
    text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    return text if text.isdigit() else "unknown"


@contextlib.contextmanager
def hold(directory: Path, what: str) -> Iterator[None]:
    """Hold ``directory`` exclusively; InUse naming the holder's pid if another
    process holds it. ``what`` names the holder kind in that message."""
    path = directory / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise errors.Unavailable(f"cannot open {path}: {exc.strerror}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise errors.InUse(
                f"data directory {directory} is in use by another {what} (pid {_holder(fd)}); "
                "stop it first or use another directory"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)

"""Where the test bed keeps built binaries and downloads."""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path


def cache_dir() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/headrace``, created on demand."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    path = Path(base) / "headrace"
    path.mkdir(parents=True, exist_ok=True)
    return path


def bin_dir() -> Path:
    """Directory of cached executables (``<cache>/bin``)."""
    path = cache_dir() / "bin"
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing) across processes,
    so concurrent test runs build or download a cached artefact only once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)

"""Where the test bed keeps built binaries and downloads."""

from __future__ import annotations

import os
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

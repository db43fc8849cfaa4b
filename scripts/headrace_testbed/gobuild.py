"""Shared pieces of the test bed's Go builds (etcd, Kubernetes, Helm wrappers)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

from headrace_testbed import TestbedError

_GO_FALLBACK = "/usr/local/go/bin/go"


def go_binary(needed_for: str) -> str:
    """The ``go`` executable; TestbedError saying what it is ``needed_for`` if absent."""
    found = shutil.which("go") or (_GO_FALLBACK if os.access(_GO_FALLBACK, os.X_OK) else None)
    if found is None:
        raise TestbedError(f"Go is not installed (no `go` on PATH): {needed_for}")
    return found


def required_version(source_dir: Path, module: str) -> str:
    """The version of ``module`` that the wrapper module in ``source_dir`` requires."""
    pattern = re.compile(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", re.MULTILINE)
    try:
        text = (source_dir / "go.mod").read_text()
    except OSError as exc:
        raise TestbedError(f"cannot read {source_dir / 'go.mod'}: {exc}") from exc
    match = pattern.search(text)
    if match is None:
        raise TestbedError(f"{source_dir / 'go.mod'} does not require {module}")
    return match.group(1)

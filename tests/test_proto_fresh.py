"""The committed generated modules match what streaming.proto generates now."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROTO = Path("headrace/proto/streaming.proto")
GENERATED = ("streaming_pb2.py", "streaming_pb2.pyi", "streaming_pb2_grpc.py")


def test_generated_modules_are_fresh(tmp_path: Path) -> None:
    pytest.importorskip("grpc_tools")
    (tmp_path / PROTO.parent).mkdir(parents=True)
    shutil.copy(ROOT / PROTO, tmp_path / PROTO)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-I",
            ".",
            "--python_out=.",
            "--pyi_out=.",
            "--grpc_python_out=.",
            str(PROTO),
        ],
        cwd=tmp_path,
        check=True,
        capture_output=True,
    )
    stale = [
        name
        for name in GENERATED
        if (tmp_path / PROTO.parent / name).read_bytes()
        != (ROOT / PROTO.parent / name).read_bytes()
    ]
    assert not stale, f"regenerate with scripts/gen_proto.sh: {stale} differ from streaming.proto"

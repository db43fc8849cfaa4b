"""Exit codes and argument checks of the ``headrace`` command, without servers.

One mapping decides every exit code (input errors 2, others 1); numeric flags
refuse values that make no sense before anything starts; a closed stdout ends
the command quietly; errors quote long user input cut short.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from headrace import errors
from headrace.cli import exits
from headrace.cli.main import main
from headrace.message.types import validate_vchannel
from headrace.standalone import StandaloneConfig
from tests.cli.closed_pipe import cli_into_closed_pipe

E = errors.ErrorCode


def test_one_mapping_from_error_code_to_exit_code() -> None:
    for code in (E.INVALID_ARGUMENT, E.TOO_LARGE, E.NOT_FOUND, E.TRUNCATED):
        assert exits.exit_code(code) == exits.EXIT_USAGE, code
    for code in (E.UNAVAILABLE, E.CORRUPT, E.CONFLICT, E.INTERNAL, E.STORAGE_FULL, E.NOT_OWNER):
        assert exits.exit_code(code) == exits.EXIT_ERROR, code
    # Every code is mapped to 1 or 2, and the error classes agree with their codes.
    for code in E:
        assert exits.exit_code(errors.error_class(code)("x").code) in (1, 2)
    assert exits.exit_code_of([]) == 0
    assert exits.exit_code_of([E.TOO_LARGE, E.TOO_LARGE]) == 2
    assert exits.exit_code_of([E.TOO_LARGE, E.UNAVAILABLE]) == 1


def test_not_found_from_a_command_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["wal", "dump", "--dir", str(tmp_path), "--pchannel", "nope"]) == 2
    assert "NOT_FOUND" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["consume", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--count", "-1"],
        ["consume", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--timeout", "-1"],
        ["consume", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--timeout", "nan"],
        ["produce", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--count", "-5"],
        ["produce", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--concurrency", "0"],
        ["produce", "--metastore", "sqlite:///x.db", "--vchannel", "v", "--size", "-1"],
        [
            "move",
            "--metastore",
            "sqlite:///x.db",
            "--pchannel",
            "p",
            "--to",
            "n",
            "--timeout",
            "-1",
        ],
        ["drain", "--metastore", "sqlite:///x.db", "--node", "n", "--timeout", "0"],
        ["standalone", "--data-dir", "d", "--timetick-interval-ms", "0"],
        ["standalone", "--data-dir", "d", "--nodes", "0"],
        ["standalone", "--data-dir", "d", "--lease-ttl", "-3"],
        ["node", "--node-id", "n", "--metastore", "sqlite:///x.db", "--timetick-interval-ms", "0"],
        ["wal", "dump", "--dir", "d", "--pchannel", "p", "--limit", "-1"],
    ],
)
def test_meaningless_numbers_are_usage_errors(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    os.chdir(tmp_path)
    with pytest.raises(SystemExit) as stopped:
        main(argv)
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert "must be" in err or "expected" in err, err
    assert list(tmp_path.iterdir()) == [], "nothing may be created for a refused command"


def test_timetick_interval_checked_by_the_standalone_config_too() -> None:
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(errors.InvalidArgument, match="timetick-interval-ms"):
            StandaloneConfig(data_dir=Path("d"), timetick_interval_ms=bad).validate()


def test_long_input_is_quoted_short() -> None:
    name = "x" * 10_000 + "!"
    with pytest.raises(errors.InvalidArgument) as caught:
        validate_vchannel(name)
    text = str(caught.value)
    assert len(text) < 400 and "(10001 bytes)" in text
    assert errors.quoted("short") == "'short'"
    assert errors.quoted("é" * 101).endswith("… (202 bytes)")


def cli(*args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        **kwargs,  # type: ignore[call-overload]
    )


@pytest.mark.parametrize(
    "args",
    [
        ["produce", "--vchannel", "v" * 10_000 + "!"],
        ["consume", "--vchannel", "ok", "--from", "z" * 10_000],
        ["status", "--cluster", "c/" + "y" * 10_000],
    ],
)
def test_cli_error_does_not_echo_10_kb_of_input(args: list[str], tmp_path: Path) -> None:
    out = cli(args[0], "--metastore", f"sqlite:///{tmp_path}/meta.db", *args[1:])
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("headrace: error: INVALID_ARGUMENT"), out.stderr
    assert len(out.stderr) < 500 and "bytes)" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_closed_stdout_ends_quietly(tmp_path: Path) -> None:
    (tmp_path / "wal" / "pchannel-000").mkdir(parents=True)
    out = cli_into_closed_pipe(
        "wal", "dump", "--dir", str(tmp_path / "wal"), "--pchannel", "pchannel-000"
    )
    assert out.returncode == exits.EXIT_BROKEN_PIPE, out.stderr
    assert out.stderr == "", out.stderr

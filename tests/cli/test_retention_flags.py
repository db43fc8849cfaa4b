"""Retention and back-pressure flags: one options object, forwarded by the standalone."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from headrace import errors
from headrace.cli.exits import EXIT_ERROR, exit_code
from headrace.cli.main import build_parser
from headrace.cli.retentionflags import forward_retention_flags, retention_options
from headrace.cli.run import standalone_config
from headrace.client.errors import from_proto
from headrace.node.errors import STATUS_OF_CODE, to_json, to_proto
from headrace.standalone import node_command
from headrace.wal.progress import RetentionOptions


def test_flags_not_given_keep_the_defaults() -> None:
    args = build_parser().parse_args(["node", "--node-id", "n1", "--metastore", "sqlite:///m"])
    assert retention_options(args) == RetentionOptions()
    assert forward_retention_flags(args) == []


def test_node_flags_build_the_options() -> None:
    args = build_parser().parse_args(
        [
            *("node", "--node-id", "n1", "--metastore", "sqlite:///m"),
            *("--retention-s", "none", "--retention-bytes", "1000000"),
            *("--truncate-margin-s", "5", "--truncate-margin-bytes", "0"),
            *("--flush-soft-bytes", "100", "--flush-hard-bytes", "200"),
            *("--flush-max-delay-s", "0.2", "--housekeeping-interval-s", "1"),
        ]
    )
    assert retention_options(args) == RetentionOptions(
        max_age_s=None,
        max_bytes=1_000_000,
        margin_s=5.0,
        margin_bytes=0,
        soft_bytes=100,
        hard_bytes=200,
        max_delay_s=0.2,
        pass_interval_s=1.0,
    )


def test_contradicting_watermarks_are_refused_before_any_node_starts(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            *("standalone", "--data-dir", str(tmp_path)),
            *("--flush-soft-bytes", "300", "--flush-hard-bytes", "200"),
        ]
    )
    with pytest.raises(errors.InvalidArgument, match="soft_bytes"):
        standalone_config(args)


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_bad_values_are_usage_errors(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(
            ["node", "--node-id", "n1", "--metastore", "sqlite:///m", "--retention-s", value]
        )
    assert exited.value.code == 2
    assert "--retention-s" in capsys.readouterr().err


def test_the_standalone_forwards_given_flags_to_its_nodes(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            *("standalone", "--data-dir", str(tmp_path)),
            *("--retention-s", "none", "--flush-soft-bytes", "4000", "--flush-hard-bytes", "5000"),
        ]
    )
    command = node_command(standalone_config(args), "node-1")
    node_args = build_parser().parse_args(command[command.index("node") :])
    assert retention_options(node_args) == RetentionOptions(
        max_age_s=None, soft_bytes=4000, hard_bytes=5000
    )


def test_flush_behind_is_retryable_on_the_wire_and_a_non_usage_exit() -> None:
    """FLUSH_BEHIND is mapped once: gRPC status, wire round trip, CLI exit code."""
    behind = errors.FlushBehind("the flush of pchannel p is behind")
    back = from_proto(to_proto(behind))
    assert isinstance(back, errors.FlushBehind) and back.retryable
    assert '"retryable":true' in to_json(behind)
    assert STATUS_OF_CODE[errors.ErrorCode.FLUSH_BEHIND] is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert exit_code(errors.ErrorCode.FLUSH_BEHIND) == EXIT_ERROR

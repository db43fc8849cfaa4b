"""``--segment-lifetime-s``: the node's segment policy, forwarded by the standalone."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace.cli.main import build_parser
from headrace.cli.run import segment_policy, standalone_config
from headrace.standalone import node_command
from headrace.wal.interceptors.segments import SegmentPolicy

NODE = ("node", "--node-id", "n1", "--metastore", "sqlite:///m")


def test_without_the_flag_the_policy_keeps_its_defaults(tmp_path: Path) -> None:
    assert segment_policy(build_parser().parse_args(list(NODE))) == SegmentPolicy()
    cfg = standalone_config(build_parser().parse_args(["standalone", "--data-dir", str(tmp_path)]))
    assert "--segment-lifetime-s" not in node_command(cfg, "node-0")


def test_the_node_flag_sets_the_lifetime_and_nothing_else() -> None:
    args = build_parser().parse_args([*NODE, "--segment-lifetime-s", "15"])
    assert segment_policy(args) == SegmentPolicy(lifetime_s=15.0)


def test_the_standalone_forwards_the_lifetime_to_its_nodes(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["standalone", "--data-dir", str(tmp_path), "--segment-lifetime-s", "2.5"]
    )
    command = node_command(standalone_config(args), "node-0")
    node_args = build_parser().parse_args(command[command.index("node") :])
    assert segment_policy(node_args).lifetime_s == 2.5


@pytest.mark.parametrize("value", ["0", "-1", "abc"])
def test_bad_lifetimes_are_usage_errors(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*NODE, "--segment-lifetime-s", value])
    assert exited.value.code == 2
    assert "--segment-lifetime-s" in capsys.readouterr().err

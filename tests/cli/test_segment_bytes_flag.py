"""``--segment-bytes``: the local WAL's segment size, on the node and forwarded by
the standalone; refused with a broker WAL."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace import errors
from headrace.cli.main import build_parser
from headrace.cli.run import standalone_config, wal_settings
from headrace.standalone import node_command


def test_the_node_passes_the_segment_size_to_the_local_backend(tmp_path: Path) -> None:
    base = ["node", "--node-id", "n1", "--metastore", "sqlite:///m", "--wal-dir", str(tmp_path)]
    assert "segment_bytes" not in wal_settings(build_parser().parse_args(base))
    args = build_parser().parse_args([*base, "--segment-bytes", "4096"])
    assert wal_settings(args)["segment_bytes"] == 4096


def test_the_standalone_forwards_it_to_its_nodes(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        ["standalone", "--data-dir", str(tmp_path), "--segment-bytes", "65536"]
    )
    command = node_command(standalone_config(args), "node-0")
    assert command[command.index("--segment-bytes") + 1] == "65536"
    plain = standalone_config(build_parser().parse_args(["standalone", "--data-dir", "d"]))
    assert "--segment-bytes" not in node_command(plain, "node-0")


@pytest.mark.parametrize("value", ["0", "-5", "x"])
def test_a_bad_size_is_a_usage_error(value: str) -> None:
    with pytest.raises(SystemExit) as caught:
        build_parser().parse_args(["standalone", "--data-dir", "d", "--segment-bytes", value])
    assert caught.value.code == 2


def test_a_broker_wal_refuses_it(tmp_path: Path) -> None:
    args = build_parser().parse_args(
        [
            *("standalone", "--data-dir", str(tmp_path), "--segment-bytes", "4096"),
            *("--wal", "kafka", "--kafka-bootstrap", "127.0.0.1:9"),
        ]
    )
    with pytest.raises(errors.InvalidArgument, match="--segment-bytes is for --wal local"):
        standalone_config(args)

"""How the standalone starts its flush runner (pure parts, fast)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from headrace import standalone
from headrace.cli import run


def config(tmp_path: Path, *flags: str) -> standalone.StandaloneConfig:
    parser = argparse.ArgumentParser()
    run.add_standalone_args(parser)
    return run.standalone_config(parser.parse_args(["--data-dir", str(tmp_path), *flags]))


def test_the_runner_writes_to_the_data_directory_by_default(tmp_path: Path) -> None:
    cfg = config(tmp_path)
    assert cfg.flush
    argv = standalone.runner_command(cfg, parent=4242)
    assert argv[1:4] == ["-P", "-m", "spark_apps.runner"]
    assert argv[argv.index("--warehouse") + 1] == str((tmp_path / "warehouse").resolve())
    assert argv[argv.index("--metastore") + 1] == cfg.metastore_url
    assert argv[argv.index("--master") + 1] == "local[2]"
    assert argv[argv.index("--exit-with-parent") + 1] == "4242"


def test_warehouse_and_master_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = config(tmp_path, "--warehouse", "wh", "--spark-master", "local[1]")
    assert cfg.warehouse_location == str(tmp_path / "wh")
    assert config(tmp_path, "--warehouse", "s3://b/p").warehouse_location == "s3://b/p"
    argv = standalone.runner_command(cfg, parent=1)
    assert argv[argv.index("--master") + 1] == "local[1]"


def test_no_flush_or_no_pyspark_means_no_runner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def names(cfg: standalone.StandaloneConfig) -> list[str]:
        return [p.node_id for p in standalone.supervised_processes(cfg)]

    assert names(config(tmp_path)) == ["node-0", "flush-runner"]
    assert names(config(tmp_path, "--no-flush")) == ["node-0"]
    monkeypatch.setattr(standalone, "pipeline_installed", lambda: False)
    assert names(config(tmp_path)) == ["node-0"]

"""``headrace bench wal --backend kafka|pulsar``: the raw-producer baseline, real brokers.

Tiny runs only: the figures must be there, positive and consistent with each
other; speed targets live in BENCHMARKS.md, never here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from headrace.bench import broker
from headrace.cli.main import EXIT_USAGE, main

pytestmark = pytest.mark.timeout(180)

_POSITIVE = (
    "msgs_per_s",
    "baseline_msgs_per_s",
    "ratio",
    "msgs_per_s_2p",
    "ratio_2p",
    "baseline_msgs_per_s_2p",
    "p50_ms",
    "p99_ms",
    "baseline_p50_ms",
    "baseline_p99_ms",
    "scan_msgs_per_s",
    "backend_append_msgs_per_s",
    "backend_scan_records_per_s",
    "decode_msgs_per_s",
)


def _broker_args(request: pytest.FixtureRequest, backend: str) -> list[str]:
    if backend == "kafka":
        return ["--kafka-bootstrap", request.getfixturevalue("kafka_bootstrap")]
    return ["--pulsar-url", request.getfixturevalue("pulsar_url")]


def _close(value: float, expected: float, tolerance: float) -> bool:
    return abs(value - expected) <= tolerance


@pytest.mark.parametrize(
    "backend",
    [
        pytest.param("kafka", marks=pytest.mark.kafka),
        pytest.param("pulsar", marks=pytest.mark.pulsar),
    ],
)
def test_broker_bench_prints_consistent_figures(
    backend: str,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    argv = ["bench", "wal", "--backend", backend, *_broker_args(request, backend)]
    argv += ["--messages", "192", "--batch", "32", "--rounds", "1", "--dir", str(tmp_path)]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    assert result["backend"] == backend
    assert result["producers"] == 1
    assert "1 batch(es) of 32 in flight" in result["baseline"]
    for key in _POSITIVE:
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["p99_ms"] >= result["p50_ms"]
    assert result["baseline_p99_ms"] >= result["baseline_p50_ms"]
    # One round: the headline figures are that round's, each rounded on its own.
    (only,) = result["rounds"]
    assert only["ratio"] == result["ratio"]
    ratio = result["msgs_per_s"] / result["baseline_msgs_per_s"]
    assert _close(result["ratio"], ratio, 0.0006 + ratio * 1e-3), (result["ratio"], ratio)
    ratio_2p = result["msgs_per_s_2p"] / result["baseline_msgs_per_s_2p"]
    assert _close(result["ratio_2p"], ratio_2p, 0.0006 + ratio_2p * 1e-3)
    overhead = result["p99_ms"] - result["baseline_p99_ms"]
    assert _close(result["p99_overhead_ms"], overhead, 0.002)
    assert only["baseline"] == result["baseline_msgs_per_s"]
    assert only["baseline_2p"] == result["baseline_msgs_per_s_2p"]
    assert sorted(os.listdir(tmp_path)) == [], "the benchmark cleans up after itself"


def test_a_broker_bench_without_its_address_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "wal", "--backend", "kafka", "--json"]) == EXIT_USAGE
    assert "--kafka-bootstrap" in capsys.readouterr().err
    assert main(["bench", "wal", "--backend", "pulsar", "--json"]) == EXIT_USAGE
    assert "--pulsar-url" in capsys.readouterr().err


def test_the_raw_kafka_producer_keeps_the_writers_settings_without_transactions() -> None:
    settings = broker.backend_settings("kafka", "127.0.0.1:9", None)
    from headrace.wal.kafka.settings import parse_settings  # noqa: PLC0415

    config = broker.kafka_producer_config(parse_settings(settings), "t")
    assert "transactional.id" not in config
    assert "transaction.timeout.ms" not in config
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["bootstrap.servers"] == "127.0.0.1:9"


def test_the_window_counts_batches_and_reports_failures() -> None:
    window = broker.Window(depth=2)
    first = window.open(2)
    second = window.open(1)
    assert window.outstanding == 2
    assert not window.wait(1, timeout=0.01)
    first(None)
    second("broker said no")
    assert window.outstanding == 1
    assert window.wait(1, timeout=0.01)
    first(None)
    assert window.wait(0, timeout=0.01)
    assert len(window.latencies) == 2
    assert window.failure == "broker said no"

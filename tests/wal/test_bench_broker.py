"""``headrace bench wal --backend kafka|pulsar``: the raw-producer baseline, real brokers.

Tiny runs only: the figures must be there, positive and consistent with each
other; speed targets live in BENCHMARKS.md, never here.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from headrace import errors
from headrace.bench import broker
from headrace.bench.report import txn_round_figures, txn_summary
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
_POSITIVE_TXN = (
    "baseline_txn_msgs_per_s",
    "ratio_vs_txn",
    "baseline_txn_p50_ms",
    "baseline_txn_p99_ms",
)
_TXN_ROUND = ("baseline_txn", "ratio_vs_txn", "baseline_txn_p99_ms", "p99_overhead_vs_txn_ms")


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
    if backend == "kafka":
        _check_txn_baseline(result, only)
    else:
        assert "baseline_txn" not in result
        assert not [k for k in (*result, *only) if "txn" in k], "Pulsar has no such baseline"
    assert sorted(os.listdir(tmp_path)) == [], "the benchmark cleans up after itself"


def _check_txn_baseline(result: dict[str, Any], only: dict[str, Any]) -> None:
    """Kafka's transactional baseline: present, positive, consistent with its round."""
    assert "one transaction per 1 batch(es) of 32" in result["baseline_txn"]
    for key in _POSITIVE_TXN:
        assert isinstance(result[key], float) and result[key] > 0, key
    txn_rate, txn_p99 = result["baseline_txn_msgs_per_s"], result["baseline_txn_p99_ms"]
    assert txn_p99 >= result["baseline_txn_p50_ms"]
    overhead = result["p99_ms"] - txn_p99
    assert _close(result["p99_overhead_vs_txn_ms"], overhead, 0.002)
    ratio = result["msgs_per_s"] / txn_rate
    assert _close(result["ratio_vs_txn"], ratio, 0.0006 + ratio * 1e-3)
    assert only["baseline_txn"] == txn_rate
    assert only["ratio_vs_txn"] == result["ratio_vs_txn"]
    assert only["baseline_txn_p99_ms"] == txn_p99
    assert only["p99_overhead_vs_txn_ms"] == result["p99_overhead_vs_txn_ms"]


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


def test_the_transactional_kafka_baseline_keeps_the_writers_transactions_under_its_own_id() -> None:
    from headrace.wal.kafka.settings import parse_settings  # noqa: PLC0415
    from headrace.wal.kafka.writer import producer_config  # noqa: PLC0415

    settings = parse_settings(broker.backend_settings("kafka", "127.0.0.1:9", None))
    config = broker.kafka_txn_producer_config(settings, "t", "bench-txn-1")
    writer = producer_config(settings, "t")
    assert config["transactional.id"] == "bench-txn-1" != writer["transactional.id"]
    assert {k: v for k, v in config.items() if k != "transactional.id"} == {
        k: v for k, v in writer.items() if k != "transactional.id"
    }
    assert config["transaction.timeout.ms"] == settings.transaction_timeout_ms
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"


def test_transactions_take_the_in_flight_batches_in_order() -> None:
    batches = [[bytes([i])] for i in range(5)]
    assert broker.transaction_groups(batches, 1) == [[b] for b in batches]
    assert broker.transaction_groups(batches, 2) == [batches[0:2], batches[2:4], batches[4:]]
    assert broker.transaction_groups(batches, 8) == [batches]
    assert broker.transaction_groups([], 2) == []
    with pytest.raises(errors.InvalidArgument):
        broker.transaction_groups(batches, 0)


def test_delivery_reports_of_a_transaction_must_all_succeed() -> None:
    delivered = broker.Delivered()
    delivered(None, None)
    delivered(None, None)
    delivered.check(2, "t")
    with pytest.raises(errors.Unavailable, match="2 of 3 records acknowledged"):
        delivered.check(3, "t")
    delivered(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    with pytest.raises(errors.Unavailable, match="t: a send failed"):
        delivered.check(2, "t")


async def test_only_kafka_has_a_transactional_baseline() -> None:
    run = broker.RawRun("pulsar", {"service_url": "pulsar://127.0.0.1:9"}, "p", 4, 1, True)
    with pytest.raises(errors.InvalidArgument, match="Kafka's only"):
        await broker.raw_producer(run, [b"x"])


def test_the_wal_against_the_transactional_baseline() -> None:
    latencies = [0.001 * k for k in range(1, 101)]  # 1 .. 100 ms
    one = txn_round_figures(500.0, 120.0, 1000.0, latencies)
    assert one["baseline_txn"] == 1000.0
    assert one["ratio_vs_txn"] == 0.5
    assert one["baseline_txn_p99_ms"] == pytest.approx(99.0)
    assert one["p99_overhead_vs_txn_ms"] == pytest.approx(21.0)
    assert txn_round_figures(500.0, 1.0, 0.0, [])["ratio_vs_txn"] == 0.0

    rounds = [
        one,
        txn_round_figures(900.0, 5.0, 1200.0, [0.004]),
        txn_round_figures(400.0, 5.0, 1600.0, [0.002]),
    ]
    summary = txn_summary(rounds, latencies, 110.0)
    assert summary == {
        "baseline_txn_msgs_per_s": 1600.0,
        "ratio_vs_txn": round(statistics.median([0.5, 0.75, 0.25]), 3),
        "baseline_txn_p50_ms": round(statistics.median(latencies) * 1000, 3),
        "baseline_txn_p99_ms": 99.0,
        "p99_overhead_vs_txn_ms": 11.0,
    }

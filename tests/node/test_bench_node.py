"""``headrace bench node`` end to end, small: a real node process and the tail probe process."""

from __future__ import annotations

from pathlib import Path

import pytest

from headrace import errors
from headrace.bench.node import bench_metrics, bench_node, bench_tls, due
from headrace.bench.tailprobe import main as probe_main


async def test_the_node_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    result = await bench_node(messages=2048, root=tmp_path, tail_seconds=1.0)
    for key in ("msgs_per_s", "baseline_msgs_per_s", "ratio", "append_p99_ms", "tail_p99_ms"):
        assert isinstance(result[key], float) and result[key] > 0, key
    # The probe process saw every message the paced producer sent (for 1 s,
    # by schedule), each with a delay measured from the stamp in its payload.
    for run, step in (("tail", 1.0), ("tail_burst5ms", 5.0)):
        assert result[f"{run}_step_ms"] == step
        assert result[f"{run}_samples"] == result[f"{run}_sent"] >= 100
        assert result[f"{run}_p99_ms"] >= result[f"{run}_p50_ms"] > 0
        # Diagnostic: each step's time to its acknowledgement.
        assert result[f"{run}_ack_p99_ms"] >= result[f"{run}_ack_p50_ms"] > 0
        # The rate reported is the one achieved: what was sent over the time
        # the sending took (at least the 1 s asked for), never above the rate
        # asked for (the schedule never runs ahead).
        achieved = result[f"{run}_rate_msgs_per_s"]
        assert 0 < achieved <= result[f"{run}_sent"]
        assert achieved <= result["tail_requested_rate_msgs_per_s"] + 0.1
    assert 0 < result["node_idle_rss_mib"] <= result["node_rss_mib"]


def test_a_paced_sender_owes_what_the_schedule_says_not_what_it_managed() -> None:
    # On time: 1 ms at 100k msgs/s is 100 messages.
    assert due(100_000, 0.001, 0) == 100
    # Woken late (3 ms in, 100 sent): it owes the 200 the late wake skipped,
    # so the rate holds instead of the period stretching by the delay.
    assert due(100_000, 0.003, 100) == 200
    # Ahead of the schedule (a fraction of a message due): nothing.
    assert due(100_000, 0.00301, 301) == 0
    assert due(100_000, 0.0, 0) == 0


async def test_the_node_benchmark_refuses_a_run_smaller_than_a_chunk(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="messages >= 256"):
        await bench_node(messages=100, root=tmp_path)


def test_the_tail_probe_needs_its_two_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert probe_main(["sqlite:///x.db"]) == 2
    assert "usage" in capsys.readouterr().err


async def test_the_metrics_benchmark_compares_fresh_nodes_and_checks_the_scrape(
    tmp_path: Path,
) -> None:
    result = await bench_metrics(messages=1024, root=tmp_path, rounds=2)
    off, on = result["msgs_per_s_metrics_off"], result["msgs_per_s_metrics_on"]
    assert len(off) == len(on) == 2 and all(x > 0 for x in off + on)
    per_round = [round(b / a, 3) for a, b in zip(off, on, strict=True)]
    assert result["metrics_ratio_per_round"] == per_round
    assert result["metrics_ratio"] in per_round


async def test_the_tls_benchmark_runs_plaintext_and_mutual_tls_nodes(tmp_path: Path) -> None:
    result = await bench_tls(messages=1024, root=tmp_path, rounds=1, tail_seconds=1.0)
    plain, tls = result["msgs_per_s_plaintext"], result["msgs_per_s_tls"]
    assert len(plain) == len(tls) == 1 and plain[0] > 0 and tls[0] > 0
    assert result["tls_ratio"] == round(tls[0] / plain[0], 3)
    # The tail probe, a client process of its own, read over mutual TLS too.
    assert result["tls_tail_samples"] == result["tls_tail_sent"] > 0
    assert result["tls_tail_p99_ms"] >= result["tls_tail_p50_ms"] > 0
    assert result["tls_tail_ack_p99_ms"] >= result["tls_tail_ack_p50_ms"] > 0

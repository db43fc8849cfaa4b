"""``headrace bench flush-lag``: the lag decisions, and a tiny run end to end
(the real run is in BENCHMARKS.md)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from headrace import errors
from headrace.bench.flush_lag import (
    Acked,
    LagOptions,
    bench_flush_lag,
    lags,
    newly_visible,
    runner_flush_seconds,
)
from headrace.wal.memory.message_id import MemoryMessageID


def _acked(*offsets: int) -> list[Acked]:
    return [Acked(MemoryMessageID(o), float(o)) for o in offsets]


def test_a_checkpoint_makes_visible_the_inserts_it_covers_and_no_later_one() -> None:
    acked = _acked(1, 2, 5, 9)
    at = MemoryMessageID(5)
    assert newly_visible(acked, 0, lambda target: not at < target) == 3
    assert newly_visible(acked, 3, lambda target: not at < target) == 3
    assert newly_visible(acked, 0, lambda target: False) == 0


def test_an_insert_never_visible_counts_the_drain_timeout() -> None:
    acked = _acked(1, 2, 3)
    assert lags(acked, {0: 4.0, 1: 4.5}, 99.0) == [3.0, 2.5, 99.0]


def test_the_runner_log_gives_each_committed_flush() -> None:
    text = (
        "x INFO spark_apps.runner pchannel-000: flushing (a, b] under term 1\n"
        "x INFO spark_apps.runner pchannel-000: flushed to local:00000001.0 in 1.6s\n"
        "x WARNING spark_apps.runner pchannel-000: flush failed after 2.0s: boom\n"
        "x INFO spark_apps.runner pchannel-000: flushed to local:00000002.0 in 12.25s\n"
    )
    assert runner_flush_seconds(text) == [1.6, 12.25]


@pytest.mark.parametrize(
    "bad",
    [
        {"duration_s": 0},
        {"rate_bytes_s": -1.0},
        {"flush_every_s": 0},
        {"segment_lifetime_s": -1.0},
        {"shards": 0},
    ],
)
def test_bad_options_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidArgument):
        LagOptions(**bad)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_the_lag_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    options = LagOptions(
        duration_s=4.0, rate_bytes_s=200_000.0, batch_rows=100, flush_every_s=1.0,
        drain_timeout_s=120.0,
    )  # fmt: skip
    result = await bench_flush_lag(tmp_path, options)
    assert result["measured_inserts"] > 0
    assert result["invisible_inserts"] == 0
    for key in ("flush_lag_p50_s", "flush_lag_p99_s", "flush_lag_max_s"):
        assert math.isfinite(result[key]) and result[key] > 0, key
    assert result["flush_lag_p50_s"] <= result["flush_lag_p99_s"] <= result["flush_lag_max_s"]
    assert result["achieved_mb_per_s"] > 0
    assert result["runner_flushes"] >= 1
    assert result["checkpoint_advances"] >= 1
    assert result["met"] == (result["flush_lag_p99_s"] <= 30.0)

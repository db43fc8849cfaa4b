"""``headrace bench flush`` end to end, tiny (the real run is in BENCHMARKS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from headrace import errors
from headrace.bench.flush import bench_flush, make_rows, ratio

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


async def test_the_flush_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    result = await bench_flush(3000, tmp_path, shards=2, batch_rows=500)
    assert result["rows"] == 3000
    for key in ("rows_per_s", "baseline_rows_per_s", "ratio", "startup_s", "flush_s"):
        assert isinstance(result[key], float) and result[key] > 0, key
    assert result["ratio"] == pytest.approx(
        result["rows_per_s"] / result["baseline_rows_per_s"], rel=0.01
    )


async def test_a_bad_size_is_refused(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="must be positive"):
        await bench_flush(0, tmp_path)


def test_the_ratio_keeps_three_significant_digits() -> None:
    # A slow tiny run under load: rounding to 3 decimals made it 0.0 (and the smoke flaky).
    assert ratio(45.0, 100_000.0) == 0.00045
    assert ratio(97_972.0, 178_436.0) == 0.549
    assert ratio(1.0, 0.0) == 0.0


def test_the_rows_have_the_benchmark_shape() -> None:
    rows = make_rows(10, 5)
    assert rows["pk"].to_pylist() == [10, 11, 12, 13, 14]
    assert [len(v) for v in rows["vector"].to_pylist()] == [128] * 5
    assert rows["name"].to_pylist()[0] == "n10"


def test_the_cli_refuses_a_bad_row_count() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "headrace.cli", "bench", "flush", "--rows", "0", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done
    assert "--rows" in done.stderr

"""``headrace bench upgrade``: its measures (pure) and a short run on the test bed."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.bench_upgrade import MoveGap, breakdown_ms, delivery, max_gap_ms, move_gaps
from headrace.bench.handoff import Sample
from headrace.cli.bench import UPGRADE_SCRIPT, upgrade_argv
from headrace.cluster import Assignment, AssignmentState


def test_delivery_counts_lost_duplicated_and_reordered_messages() -> None:
    acked = {"a": [0, 2, 4], "b": [1, 3]}
    assert delivery(acked, {"a": [0, 2, 4], "b": [1, 3]}) == {
        "lost": 0,
        "duplicates": 0,
        "reordered_vchannels": 0,
        "consumed": 5,
    }
    # a lost 4; b read 1 twice and 3 before 1
    assert delivery(acked, {"a": [0, 2], "b": [3, 1, 1]}) == {
        "lost": 1,
        "duplicates": 1,
        "reordered_vchannels": 1,
        "consumed": 5,
    }
    # a message written but never acknowledged may be read: not a loss nor a reorder
    assert delivery({"a": [0, 2]}, {"a": [0, 1, 2]})["reordered_vchannels"] == 0


def test_stall_and_move_gaps_come_from_the_acknowledgement_times() -> None:
    assert max_gap_ms([10.1, 10.2, 11.5, 11.6], 10.0, 12.0) == pytest.approx(1300.0)
    assert max_gap_ms([], 10.0, 10.25) == pytest.approx(250.0)
    assert max_gap_ms([9.0, 13.0], 10.0, 10.5) == pytest.approx(500.0), "only inside the window"
    samples = [
        Sample(0.0, 1.00, 3),
        Sample(0.0, 1.02, 3),
        Sample(0.0, 1.30, 4),
        Sample(0.0, 1.32, 4),
        Sample(0.0, 2.00, 6),
    ]
    assert move_gaps("p", samples, 0.0, 3.0) == [
        MoveGap("p", 4, 1.30, pytest.approx(280.0), 3, 1.02),
        MoveGap("p", 6, 2.00, pytest.approx(680.0), 4, 1.32),
    ]
    assert move_gaps("p", samples, 1.5, 3.0) == [
        MoveGap("p", 6, 2.00, pytest.approx(680.0), 4, 1.32)
    ], "a move before the window (the cluster settling) is not the upgrade's"


def test_a_move_gap_splits_by_the_assignment_stamps() -> None:
    def record(state: AssignmentState, term: int, at: float) -> Assignment:
        return Assignment(pchannel="p", node="n", term=term, state=state, updated_at=at)

    records = [
        record(AssignmentState.ASSIGNED, 3, 0.5),
        record(AssignmentState.UNASSIGNING, 3, 10.1),
        record(AssignmentState.UNASSIGNED, 3, 10.3),
        record(AssignmentState.ASSIGNING, 4, 10.35),
        record(AssignmentState.ASSIGNED, 4, 10.5),
    ]
    gap = MoveGap("p", 4, 10.6, 600.0, old_term=3, last_ack=10.0)
    assert breakdown_ms(gap, records) == {
        "ack_to_unassigning": pytest.approx(100.0),
        "release": pytest.approx(200.0),
        "reassign": pytest.approx(50.0),
        "open": pytest.approx(150.0),
        "client": pytest.approx(100.0),
    }
    failover = breakdown_ms(gap, [r for r in records if r.term == 4])
    assert failover["release"] is None and failover["open"] == pytest.approx(150.0)


def test_the_cli_runs_the_benchmark_script_with_its_options() -> None:
    args = argparse.Namespace(
        nodes=2, pchannels=4, rate=50.0, batch=8, probe_interval=0.05, soak=1, dir="/tmp/x"
    )
    assert upgrade_argv(args) == [
        sys.executable,
        str(UPGRADE_SCRIPT),
        "--nodes=2",
        "--pchannels=4",
        "--rate=50",
        "--batch=8",
        "--probe-interval=0.05",
        "--soak=1",
        "--workdir=/tmp/x",
    ]
    assert UPGRADE_SCRIPT.is_file()


NUMBERS = (
    "failed_writes",
    "lost",
    "duplicates",
    "acked",
    "consumed",
    "probe_acks",
    "max_stall_ms",
    "max_stall_ms_load",
    "max_stall_ms_probes",
    "seconds_per_node",
    "plan_seconds",
    "move_unavailable_p50_ms",
    "move_unavailable_p99_ms",
    "move_unavailable_max_ms",
    "moves_measured",
    "moves",
    "failovers",
    "loadavg_start",
    "loadavg_end",
)


@pytest.mark.kube
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_short_run_reports_numbers_measured_in_it(tmp_path: Path) -> None:
    """2 nodes, 2 pchannels, 100 messages/s: the command ends 0 with one JSON
    object whose figures are numbers consistent with each other and with the run."""
    argv = [sys.executable, "-m", "headrace.cli", "bench", "upgrade", "--json"]
    argv += ["--nodes=2", "--pchannels=2", "--rate=100", "--soak=1", f"--dir={tmp_path}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=850, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout)
    for key in NUMBERS:
        value = result[key]
        assert isinstance(value, int | float) and not isinstance(value, bool), (key, value)
        assert math.isfinite(value) and value >= 0, (key, value)
    assert result["plan_phase"] == "Succeeded"
    assert (result["failed_writes"], result["lost"], result["duplicates"]) == (0, 0, 0)
    assert result["reordered_vchannels"] == 0
    # 100 messages/s over warm-up, plan and 3 s after it
    assert result["acked"] >= 300 and result["consumed"] == result["acked"]
    assert result["probe_acks"] > 2 * 20
    # every node was drained: its pchannels moved, each move seen by a probe
    assert 1 <= result["moves_measured"] <= result["moves"]
    assert result["failovers"] == 0
    assert 0 < result["move_unavailable_p50_ms"] <= result["move_unavailable_p99_ms"]
    assert result["move_unavailable_p99_ms"] <= result["move_unavailable_max_ms"]
    assert result["max_stall_ms"] == max(result["max_stall_ms_load"], result["max_stall_ms_probes"])
    assert result["max_stall_ms_load"] >= 1000 * 16 / 100, "at least the pacing interval"
    assert set(result["node_seconds"]) == {"upgrade-node-0", "upgrade-node-1"}
    assert all(0 < s <= result["plan_seconds"] for s in result["node_seconds"].values())
    assert result["seconds_per_node"] == pytest.approx(result["plan_seconds"] / 2, abs=0.1)
    assert not list(tmp_path.iterdir()), "the test bed's directory is removed"

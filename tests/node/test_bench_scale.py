"""``headrace bench scale``: its pure parts, and a small run end to end."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from headrace import cluster, errors
from headrace.bench.scale import (
    ScaleOptions,
    bench_scale,
    cpu_pct,
    cpu_seconds,
    same_pchannel_names,
)
from headrace.cluster import NEW_CLUSTER_ROUTING, ClusterConfig


def test_cpu_time_is_read_from_proc_and_turned_into_percent_of_a_core() -> None:
    before = cpu_seconds(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass  # burn CPU in this process
    assert cpu_seconds(os.getpid()) > before
    assert cpu_pct(1.0, 1.5, 10.0) == 5.0
    assert cpu_pct(1.0, 1.5, 0.0) == 0.0
    with pytest.raises(errors.Unavailable):
        cpu_seconds(2**22 + 12345)  # above the kernel's pid limit


def test_the_vchannels_all_route_to_the_chosen_pchannel() -> None:
    config = ClusterConfig(pchannels=cluster.default_pchannels(16), routing=NEW_CLUSTER_ROUTING)
    names = same_pchannel_names(config, "pchannel-003", 50)
    assert len(set(names)) == 50
    assert {config.route(name) for name in names} == {"pchannel-003"}


def test_options_are_checked() -> None:
    with pytest.raises(errors.InvalidArgument, match="vchannels"):
        ScaleOptions(vchannels=0)
    with pytest.raises(errors.InvalidArgument, match="idle_window_s"):
        ScaleOptions(idle_window_s=0)


async def test_the_scale_benchmark_runs_end_to_end(tmp_path: Path) -> None:
    options = ScaleOptions(
        pchannels=4, idle_settle_s=0.5, idle_window_s=1.0, vchannels=20, messages=512, rounds=1
    )
    result = await bench_scale(tmp_path, options)
    assert result["pchannels"] == 4 and result["vchannels"] == 20
    assert result["idle_cpu_pct"] >= 0
    assert result["vchannels_ratio"] > 0 and len(result["round_ratios"]) == 1
    assert result["single_vchannel_msgs_per_s"] > 0 < result["many_vchannels_msgs_per_s"]
    for side in ("node_cpu_us_per_msg", "client_cpu_us_per_msg"):
        assert set(result[side]) == {"single", "many"}
        assert result[side]["single"] >= 0 <= result[side]["many"], side  # /proc counts in ticks
    assert result["client_cpu_us_per_msg"]["many"] > 0

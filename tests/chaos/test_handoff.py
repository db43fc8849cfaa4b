"""The handoff benchmark on real node processes (no timing assertions)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from headrace.bench import handoff
from headrace.bench.procs import ClusterSpec, ProcCluster
from headrace.cli.main import main
from headrace.client import HeadraceClient
from headrace.cluster import NEW_CLUSTER_ROUTING, default_pchannels, route

HANG_GUARD = 30.0
"""Seconds after which a wait is a hang, not slowness."""


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert handoff.percentile(values, 0.5) == 10.0
    assert handoff.percentile(values, 0.99) == 20.0
    assert handoff.percentile([], 0.5) == 0.0


def test_probe_vchannel_routes_to_the_measured_pchannel() -> None:
    names = default_pchannels(3, "handoff")
    for pchannel in names:
        assert (
            route(handoff.probe_vchannel(pchannel, names), names, NEW_CLUSTER_ROUTING) == pchannel
        )


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_moves_and_failover_land_with_higher_terms(tmp_path: Path) -> None:
    result = await handoff.bench_handoff(tmp_path, moves=3, failovers=1, lease_ttl_s=2.0)
    assert (result["moves"], result["failovers"]) == (3, 1)
    moves = [r for r in result["rounds"] if r["kind"] == "move"]
    for move in moves:
        assert move["to"] == move["target"] != move["from"], move
        assert move["term"] > move["old_term"], move
        assert move["unavailable_ms"] is not None, move
    (crash,) = [r for r in result["rounds"] if r["kind"] == "failover"]
    assert crash["to"] != crash["from"] and crash["term"] > crash["old_term"], crash
    terms = [r["term"] for r in result["rounds"]]
    assert terms == sorted(terms) and len(set(terms)) == len(terms)
    assert result["probe_acks"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_cli_prints_the_handoff_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(
        ["bench", "handoff", "--moves", "1", "--failovers", "0", "--dir", str(tmp_path), "--json"]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    assert result["moves"] == 1 and result["failovers"] == 0
    assert result["graceful_p99_ms"] > 0


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_producer_leaves_a_paused_owner_for_the_new_one(tmp_path: Path) -> None:
    """A stalled owner answers nothing; the producer must follow the failover
    while the old owner is still paused, not wait for it to wake up."""
    spec = ClusterSpec(root=tmp_path, nodes=2, pchannels=1, lease_ttl_s=1.5)
    (pchannel,) = spec.pchannel_names
    async with ProcCluster(spec) as procs:
        await procs.admin.suspend_balance(True)
        async with HeadraceClient(spec.metastore_url, spec.cluster) as client:
            probe = handoff.Probe(client, handoff.probe_vchannel(pchannel, spec.pchannel_names))
            probe.start()
            try:
                await probe.wait_samples(10, HANG_GUARD)
                old = (await procs.snapshot()).assignments[pchannel]
                owner = procs.nodes[old.node]
                owner.pause()
                first, _ = await probe.first_above(old.term, HANG_GUARD)
                assert owner.paused, "the owner was resumed before the producer moved on"
                new = (await procs.snapshot()).assignments[pchannel]
                assert first.term == new.term > old.term and new.node != old.node
                owner.resume()
                await probe.wait_samples(10, HANG_GUARD)
            finally:
                await probe.stop()

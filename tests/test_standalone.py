"""The embedded standalone as a user runs it: real processes, the CLI, SIGKILL.

``headrace standalone`` runs in its own process group; 100,000 messages move
across 8 vchannels through the client; every acknowledged message is consumed
once and in order per vchannel; after SIGKILL of the whole process group and a
restart on the same directory, every acknowledged message is still there.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from headrace import errors
from headrace.client.client import HeadraceClient
from headrace.message.types import Message, MessageType
from tests.cli.standalone_proc import Standalone, child_pids

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

VCHANNELS = [f"collection-{i}" for i in range(8)]


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[Standalone]:
    running = Standalone(tmp_path / "data").require_ready()
    yield running
    running.kill_all()


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "headrace.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


async def produce_all(url: str, per_vchannel: int) -> dict[str, list[int]]:
    """Send ``<vchannel>:<seq>`` messages; return the acknowledged seqs per vchannel."""
    acked: dict[str, list[int]] = {v: [] for v in VCHANNELS}
    async with HeadraceClient(url) as client:
        producer = client.producer()

        async def one_vchannel(vch: str) -> None:
            for start in range(0, per_vchannel, 1000):
                seqs = range(start, min(start + 1000, per_vchannel))
                batch = [Message(MessageType.INSERT, vch, f"{vch}:{s}".encode()) for s in seqs]
                outcomes = await producer.send_many(batch)
                acked[vch] += [
                    s
                    for s, o in zip(seqs, outcomes, strict=True)
                    if not isinstance(o, errors.HeadraceError)
                ]

        await asyncio.gather(*(one_vchannel(v) for v in VCHANNELS))
        await producer.close()
    return acked


async def consume_all(url: str, vch: str, expected: int) -> list[int]:
    seqs: list[int] = []
    async with HeadraceClient(url) as client, client.consume(vch, start="earliest") as consumer:
        while len(seqs) < expected:
            entry = await consumer.next(timeout=30)
            if entry is None:
                break
            name, _, seq = entry.message.payload.decode().partition(":")
            assert name == vch
            seqs.append(int(seq))
    return seqs


async def test_hundred_thousand_messages_survive_sigkill(tmp_path: Path) -> None:
    running = Standalone(tmp_path / "data").require_ready()
    try:
        acked = await produce_all(running.url, 100_000 // len(VCHANNELS))
        assert sum(len(s) for s in acked.values()) == 100_000
        for vch in VCHANNELS:
            assert await consume_all(running.url, vch, len(acked[vch])) == acked[vch]
        running.kill_all()
    finally:
        running.kill_all()
    restarted = Standalone(tmp_path / "data").require_ready()
    try:
        for vch in VCHANNELS:
            assert await consume_all(restarted.url, vch, len(acked[vch])) == acked[vch]
        assert restarted.interrupt() == 0
    finally:
        restarted.kill_all()


def test_cli_produce_consume_status_dump(standalone: Standalone) -> None:
    url = standalone.url
    out = cli(
        "produce",
        "--metastore",
        url,
        "--vchannel",
        "cli-a",
        "--vchannel",
        "cli-b",
        "--count",
        "500",
        "--size",
        "100",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["acked"] == 500 and result["failed"] == 0
    assert set(result) >= {"acked", "failed", "msgs_per_s", "p50_ms", "p99_ms"}

    out = cli(
        "consume",
        "--metastore",
        url,
        "--vchannel",
        "cli-a",
        "--from",
        "earliest",
        "--count",
        "250",
        "--json",
        "--timeout",
        "20",
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 250
    assert {r["vchannel"] for r in rows} == {"cli-a"}
    assert all(r["size"] == 100 and r["type"] == "INSERT" for r in rows)
    timeticks = [r["timetick"] for r in rows]
    assert timeticks == sorted(timeticks)

    # Start from a position: the 101st message's id, inclusive.
    out = cli(
        "consume",
        "--metastore",
        url,
        "--vchannel",
        "cli-a",
        "--from",
        rows[100]["id"],
        "--count",
        "150",
        "--json",
        "--timeout",
        "20",
    )
    assert out.returncode == 0, out.stderr
    assert [json.loads(line)["id"] for line in out.stdout.splitlines()] == [
        r["id"] for r in rows[100:]
    ]

    out = cli("status", "--metastore", url, "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert len(report["nodes"]) == 2
    assert {p["state"] for p in report["pchannels"]} == {"ASSIGNED"}
    assert all(p["term"] >= 1 and p["owner"] for p in report["pchannels"])

    pchannel = report["pchannels"][0]["pchannel"]
    out = cli(
        "wal",
        "dump",
        "--dir",
        str(standalone.data_dir / "wal"),
        "--pchannel",
        pchannel,
        "--json",
        "--limit",
        "5",
    )
    assert out.returncode == 0, out.stderr
    dumped = [json.loads(line) for line in out.stdout.splitlines()]
    assert 1 <= len(dumped) <= 5
    assert dumped[0]["type"] == "FENCE"
    assert all({"id", "type", "vchannel", "timetick", "term", "size"} <= set(d) for d in dumped)


def test_cli_bad_input_is_a_clear_error(standalone: Standalone) -> None:
    url = standalone.url
    out = cli("produce", "--metastore", url, "--vchannel", "bad name!", "--count", "1")
    assert out.returncode == 2
    assert "invalid vchannel" in out.stderr

    out = cli(
        "produce",
        "--metastore",
        url,
        "--vchannel",
        "big",
        "--count",
        "1",
        "--size",
        str(9 * 1024 * 1024),
        "--json",
    )
    assert out.returncode == 2  # a message refused as too large is bad input
    assert json.loads(out.stdout)["failed"] == 1
    assert "TOO_LARGE" in out.stdout

    out = cli("consume", "--metastore", url, "--vchannel", "x", "--from", "nonsense")
    assert out.returncode == 2
    assert "malformed message id" in out.stderr

    out = cli("status", "--metastore", "etcd://127.0.0.1:1")
    assert out.returncode == 1
    assert "UNAVAILABLE" in out.stderr

    out = cli("status", "--metastore", "mysql://somewhere")
    assert out.returncode == 2


def node_pids(parent: int, node_id: str) -> list[str]:
    return [str(pid) for pid in child_pids(parent, f"--node-id {node_id} ")]


async def served_layout(url: str) -> dict[str, list[str]]:
    """node -> pchannels it serves now, per the metastore (session-checked)."""
    return {node: [p for p, _ in served] for node, served in (await served_terms(url)).items()}


async def served_terms(url: str) -> dict[str, list[tuple[str, int]]]:
    """node -> (pchannel, term) it serves now, per the metastore (session-checked)."""
    from headrace import cluster, standalone  # noqa: PLC0415
    from headrace.metastore.factory import open_metastore  # noqa: PLC0415

    keys = cluster.Keys()
    store = await open_metastore(url)
    try:
        records = [
            cluster.Assignment.from_json(kv.value) for kv in await store.get_prefix(keys.pchannels)
        ]
        leases = {
            cluster.NodeInfo.from_json(kv.value).node_id: kv.lease
            for kv in await store.get_prefix(keys.nodes)
        }
    finally:
        await store.close()
    served = set(standalone.serving(records, leases))
    layout: dict[str, list[tuple[str, int]]] = {}
    for r in records:
        if r.pchannel in served:
            layout.setdefault(r.node, []).append((r.pchannel, r.term))
    return layout


async def test_three_nodes_balanced_and_failover_after_kill(tmp_path: Path) -> None:
    running = Standalone(tmp_path / "data", nodes=3, pchannels=16).require_ready()
    try:
        layout = await served_layout(running.url)
        assert sorted(len(p) for p in layout.values()) == [5, 5, 6]
        node0 = node_pids(running.proc.pid, "node-0")
        assert len(node0) == 1
        terms_before = dict((await served_terms(running.url))["node-0"])
        os.kill(int(node0[0]), signal.SIGKILL)
        # Served again: every pchannel is served, the killed node's under a newer
        # term (a new owner opened it; the restarted node-0 may get some back
        # from the balancer right after the failover, which is fine).
        for _ in range(400):
            await asyncio.sleep(0.05)
            after = await served_terms(running.url)
            served = dict(pair for pairs in after.values() for pair in pairs)
            if len(served) == 16 and all(served[p] > t for p, t in terms_before.items()):
                break
        else:
            pytest.fail(f"pchannels of the killed node were not served again: {after}")
        assert len(served) == 16
        assert running.interrupt() == 0
    finally:
        running.kill_all()

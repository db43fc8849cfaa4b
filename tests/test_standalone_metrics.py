"""A standalone with --metrics-listen: its own endpoint and its nodes' next to it."""

from __future__ import annotations

import asyncio
import socket
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from headrace.client import HeadraceClient
from headrace.standalone import node_metrics_listen
from tests.cli.standalone_proc import Standalone


def free_consecutive_ports(count: int) -> int:
    """A port ``p`` with ``p .. p + count - 1`` free just now on loopback."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = int(probe.getsockname()[1])
        if base + count > 65535:
            continue
        held = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return base
    raise AssertionError("no run of free ports found")


def samples(address: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_node_ports_follow_the_standalone_port() -> None:
    assert node_metrics_listen("", 0) == ""
    assert node_metrics_listen("127.0.0.1:9400", 0) == "127.0.0.1:9401"
    assert node_metrics_listen("127.0.0.1:9400", 2) == "127.0.0.1:9403"
    assert node_metrics_listen("0.0.0.0:0", 1) == "0.0.0.0:0"


def test_a_standalone_serves_its_own_and_its_nodes_metrics(tmp_path: Path) -> None:
    base = free_consecutive_ports(3)
    running = Standalone(
        tmp_path / "data",
        nodes=2,
        pchannels=2,
        extra=["--metrics-listen", f"127.0.0.1:{base}", "--no-flush"],
    ).require_ready()
    try:
        own = samples(f"127.0.0.1:{base}")
        for node in ("node-0", "node-1"):
            assert own[("headrace_standalone_process_up", frozenset({("process", node)}))] == 1
            restarts = (
                "headrace_standalone_process_restarts_total",
                frozenset({("process", node)}),
            )
            assert own[restarts] == 0

        async def produce() -> None:
            async with (
                HeadraceClient(running.url, "default") as client,
                client.producer() as producer,
            ):
                for i in range(40):
                    await producer.send(f"v{i % 8}", b"payload")

        asyncio.run(produce())
        appended = 0.0
        for port in (base + 1, base + 2):
            for (name, _labels), value in samples(f"127.0.0.1:{port}").items():
                if name == "headrace_append_messages_total":
                    appended += value
        assert appended == 40
    finally:
        running.kill_all()

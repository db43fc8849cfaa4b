"""``headrace status`` as text: the cluster's message format, and why a
pchannel waits (an UNAVAILABLE record's reason)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from headrace.cli import admin
from headrace.client import api as client_api

WHY = (
    "no eligible node: node-0: its log holds message format {2}, which a node that reads {1}, "
    "writes {1} cannot read"
)


async def test_status_text_names_the_format_and_why_a_pchannel_waits(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    async def report(_url: str, cluster: str = "default") -> dict[str, Any]:
        node = {"node_id": "node-0", "address": "a:1", "alive": True, "frozen": False}
        node.update({"draining": False, "pchannels": ["pchannel-001"]})
        row = {"pchannel": "pchannel-000", "state": "UNAVAILABLE", "node": "", "term": 3}
        row.update({"reason": WHY, "unflushed_bytes": None})
        served = {"pchannel": "pchannel-001", "state": "ASSIGNED", "node": "node-0", "term": 1}
        served.update({"reason": "", "unflushed_bytes": 0})
        return {
            "balancer": "active",
            "message_format": 1,
            "nodes": [node],
            "pchannels": [row, served],
            "writes": {"stopped": False},
        }

    monkeypatch.setattr(client_api, "cluster_status", report)
    args = argparse.Namespace(metastore="sqlite:///x", cluster="default", json=False)
    assert await admin.status(args) == 0
    out = capsys.readouterr().out
    assert "message format 1" in out.splitlines()[0]
    assert f"pchannel-000 waits: {WHY}" in out.splitlines()
    assert "pchannel-001 waits" not in out
    assert out.splitlines()[-1] == "writes: flowing"

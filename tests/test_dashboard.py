"""The Grafana dashboard queries only metrics the code exports."""

from __future__ import annotations

import json
import re
import types
from pathlib import Path

from headrace.node.housekeeping import Kept
from headrace.node.metrics import HousekeepingCollector, NodeMetrics, WALCollector
from headrace.standalone import ProcessCollector
from headrace_operator.metrics import OperatorMetrics
from headrace_operator.results import PassResult, failed

DASHBOARD = (
    Path(__file__).resolve().parents[1] / "charts/headrace-operator/dashboards/headrace.json"
)
SUFFIXES = ("_bucket", "_count", "_sum", "_total")


def exported_samples() -> set[str]:
    """Every sample name the node, standalone and operator registries produce."""
    wal = types.SimpleNamespace(
        term=1,
        state=types.SimpleNamespace(value="SERVING"),
        stats=lambda: {"buffer_bytes": 1, "buffer_entries": 1, "appended_total": 1},
    )
    failure = types.SimpleNamespace(attempts=1)
    manager = types.SimpleNamespace(held={"p": wal}, failures={"q": failure})
    node = NodeMetrics()
    node.registry.register(WALCollector(manager))  # type: ignore[arg-type]
    node.appended("p", messages=1, size=1, failed={"INTERNAL": 1}, seconds=0.1)
    node.consumed("p", messages=1, size=1, newest=0, tail=0)
    node.opened("served", 0.1)
    node.released(True, 0.1)
    operator = OperatorMetrics()
    operator.failed("StreamingCluster", retryable=True, seconds=0.1)
    broken = PassResult(steps=(("pods", failed("x", retryable=True)),))
    operator.observed("StreamingCluster", broken, 0.1)
    kept = Kept(unflushed_bytes=10, checkpoint_timetick=1, tail_timetick=2, truncations=1)
    housekeeper = types.SimpleNamespace(kept={"p": kept}, manager=manager)
    node.registry.register(HousekeepingCollector(housekeeper))  # type: ignore[arg-type]
    processes = ProcessCollector([])
    names = {
        sample.name
        for registry in (node.registry, operator.registry)
        for family in registry.collect()
        for sample in family.samples
    }
    names |= {family.name for family in processes.collect()}
    return names


def test_every_dashboard_query_names_an_exported_metric() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    queried = {
        name
        for panel in panels
        for target in panel["targets"]
        for name in re.findall(r"headrace_[a-z_]+", target["expr"])
    }
    assert len(queried) >= 10
    exported = exported_samples()
    missing = sorted(
        name
        for name in queried
        if name not in exported and not any(name + s in exported for s in SUFFIXES)
    )
    assert not missing, f"the dashboard queries metrics nobody exports: {missing}"

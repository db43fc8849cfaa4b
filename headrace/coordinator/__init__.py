"""The coordinator: election, assignment state machine, balancer, loop.

Decisions are pure functions (:mod:`.state`, :mod:`.reconcile`,
:mod:`.balancer`, :mod:`.status`); all I/O goes through the metastore contract
(:mod:`.election`, :mod:`.coordinator`, :mod:`.control`, :mod:`.snapshot`,
:mod:`.checkpoint`). The same code runs in ``headrace standalone`` and in the
Kubernetes operator.
"""

from headrace.coordinator.checkpoint import CheckpointWriter
from headrace.coordinator.control import ClusterAdmin
from headrace.coordinator.coordinator import Coordinator, CoordinatorConfig
from headrace.coordinator.snapshot import ClusterSnapshot, read_snapshot, wait_for
from headrace.coordinator.status import layout_summary

__all__ = [
    "CheckpointWriter",
    "ClusterAdmin",
    "ClusterSnapshot",
    "Coordinator",
    "CoordinatorConfig",
    "layout_summary",
    "read_snapshot",
    "wait_for",
]

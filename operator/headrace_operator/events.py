"""Kubernetes Events with machine-readable reasons.

Every restart, move and failure the operator causes or sees is recorded as a
``v1`` Event on the StreamingCluster (or the PChannelAssignment) with one of the
``Reason`` values, so ``kubectl get events --field-selector reason=NodeDrained``
and alerting rules can match on them. :func:`event_object` is pure;
:class:`KubeEventSink` posts through :class:`~.interfaces.KubeApi` and never
lets a failure to record an Event break a reconcile pass.
"""

from __future__ import annotations

import datetime
import enum
import logging
from collections.abc import Mapping
from typing import Any

from headrace import errors
from headrace_operator.interfaces import KubeApi

log = logging.getLogger(__name__)
COMPONENT = "headrace-operator"


class Reason(enum.StrEnum):
    NODE_POD_CREATED = "NodePodCreated"
    NODE_POD_RESTARTED = "NodePodRestarted"
    NODE_RESTARTING = "NodeRestarting"
    NODE_DRAIN_STARTED = "NodeDrainStarted"
    NODE_DRAINED = "NodeDrained"
    NODE_DRAIN_CANCELLED = "NodeDrainCancelled"
    NODE_POD_DELETED = "NodePodDeleted"
    NODE_UNFROZEN = "NodeUnfrozen"
    PCHANNEL_MOVED = "PChannelMoved"
    PCHANNEL_MOVE_REQUESTED = "PChannelMoveRequested"
    PCHANNEL_PIN_FAILED = "PChannelPinFailed"
    BACKEND_UNREACHABLE = "BackendUnreachable"
    COORDINATOR_FAILED = "CoordinatorFailed"
    RECOVERED = "Recovered"
    INVALID_SPEC = "InvalidSpec"
    RECONCILE_FAILED = "ReconcileFailed"
    RECONCILIATION_PAUSED = "ReconciliationPaused"
    RECONCILIATION_RESUMED = "ReconciliationResumed"
    UPGRADE_NODE_STARTED = "UpgradeNodeStarted"
    UPGRADE_NODE_DONE = "UpgradeNodeDone"
    UPGRADE_BLOCKED = "UpgradeBlocked"
    UPGRADE_SUCCEEDED = "UpgradeSucceeded"
    UPGRADE_ROLLED_BACK = "UpgradeRolledBack"
    UPGRADE_FORMAT_SWITCHED = "UpgradeFormatSwitched"
    UPGRADE_WRITES_STOPPED = "UpgradeWritesStopped"
    UPGRADE_WRITES_RESUMED = "UpgradeWritesResumed"
    UPGRADE_FLUSH_REQUESTED = "UpgradeFlushRequested"
    UPGRADE_FLUSHED = "UpgradeFlushed"
    SPARK_RUN_CREATED = "SparkRunCreated"
    SPARK_RUN_COMPLETED = "SparkRunCompleted"
    SPARK_RUN_FAILED = "SparkRunFailed"
    SPARK_RUN_TIMED_OUT = "SparkRunTimedOut"
    SPARK_RUN_VANISHED = "SparkRunVanished"
    FLUSH_BLOCKED = "FlushBlocked"


def involved_ref(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata", {})
    ref = {
        "apiVersion": obj.get("apiVersion", ""),
        "kind": obj.get("kind", ""),
        "name": meta.get("name", ""),
        "namespace": meta.get("namespace", ""),
    }
    for key in ("uid", "resourceVersion"):
        if meta.get(key):
            ref[key] = meta[key]
    return ref


def event_object(
    involved: Mapping[str, Any],
    reason: str,
    message: str,
    *,
    warning: bool,
    now: datetime.datetime,
    instance: str,
) -> dict[str, Any]:
    """A core/v1 Event about ``involved`` (an object with apiVersion, kind, metadata)."""
    ref = involved_ref(involved)
    stamp = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    micro = now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{ref['name']}.", "namespace": ref["namespace"]},
        "involvedObject": ref,
        "reason": reason,
        "message": message[:1024],
        "type": "Warning" if warning else "Normal",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "action": reason,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "eventTime": micro,
        "count": 1,
    }


class KubeEventSink:
    """Posts Events; a failure is logged, not raised (Events are best effort)."""

    def __init__(self, kube: KubeApi, instance: str) -> None:
        self.kube = kube
        self.instance = instance

    async def emit(
        self, involved: Mapping[str, Any], reason: str, message: str, *, warning: bool = False
    ) -> None:
        now = datetime.datetime.now(datetime.UTC)
        body = event_object(
            involved, reason, message, warning=warning, now=now, instance=self.instance
        )
        log.log(logging.WARNING if warning else logging.INFO, "event %s: %s", reason, message)
        try:
            await self.kube.create(body)
        except errors.HeadraceError as exc:
            log.warning("could not record event %s (%s): %s", reason, message, exc)

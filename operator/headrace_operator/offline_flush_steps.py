"""The flush step of an Offline UpgradePlan: its observations and its request.

:func:`observe_flush` reads what :func:`.offline_flush.next_flush` decides on:
whether the cluster has a flush section, the request recorded in the plan's
status, and the recorded pchannels' checkpoints now (one metastore read),
compared with their targets by :func:`headrace.client.flushing.progress`. It
leaves the status record, rebuilt from that observation, in ``p.flush``.
:func:`request_flush` asks every shard owner of every collection for a flush
(:meth:`~.interfaces.ClusterControl.request_flush`) and records the targets.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from headrace import errors
from headrace.client.flushing import progress
from headrace_operator.events import Reason
from headrace_operator.interfaces import ClusterControl
from headrace_operator.offline_flush import (
    FlushFacts,
    done_message,
    new_record,
    observed_record,
    previous_record,
    recorded_targets,
    runs_problem,
)
from headrace_operator.status import timestamp

if TYPE_CHECKING:
    from headrace_operator.upgrade_steps import UpgradePass

log = logging.getLogger(__name__)


async def observe_flush(p: UpgradePass, control: ClusterControl) -> FlushFacts:
    """The flush as this pass sees it; ``p.flush`` the status record to write."""
    cluster_spec = p.cluster_spec
    assert cluster_spec is not None
    configured = cluster_spec.flush is not None
    runs = runs_problem(p.cluster)
    record, problem = previous_record(p.previous)
    targets, unparsed = recorded_targets(record) if record is not None else ({}, "")
    if problem or unparsed:
        why = problem or unparsed
        log.warning("%s/%s: %s; the flush is requested anew", p.namespace, p.name, why)
        record = None
    p.flush = record
    if record is None:
        return FlushFacts(configured, runs=runs)
    try:
        checkpoints = await control.checkpoints(sorted(targets))
        state = progress(targets, checkpoints)
    except errors.CorruptData as exc:
        return FlushFacts(configured, record, unreadable=exc.message, runs=runs)
    p.flush = observed_record(record, checkpoints, state, timestamp(p.now))
    return FlushFacts(configured, p.flush, state, runs=runs)


async def request_flush(p: UpgradePass, control: ClusterControl) -> str:
    """Request a flush of every collection and record its targets in
    ``p.flush``; why it could not be requested ("" when it was)."""
    try:
        requested = await control.request_flush()
    except errors.HeadraceError as exc:
        return f"cannot request a flush of every collection: {exc.message}"
    p.flush = new_record(requested, timestamp(p.now))
    names = ", ".join(requested.collections) or "none"
    await p.event(
        Reason.UPGRADE_FLUSH_REQUESTED,
        f"flush of every collection requested ({names}) on "
        f"{len(requested.targets)} pchannel(s); the nodes stop once every checkpoint reaches it",
    )
    return ""


async def flush_events(p: UpgradePass) -> None:
    """``UpgradeFlushed`` once every checkpoint is first seen at its target."""
    before, _ = previous_record(p.previous)
    record = p.flush
    if record is not None and record.done and (before is None or not before.done):
        await p.event(Reason.UPGRADE_FLUSHED, done_message(record))

"""The reconcile step that launches flush and compaction runs as SparkApplications.

Order within the step: the SparkApplication API the cluster serves (API
discovery, :func:`.sparkapps.choose_api`), the metastore's flush records of
every pchannel (:meth:`~.interfaces.ClusterControl.flush_channels`), the
cluster's runs (listed by label), then per pchannel and job the pure plan of
:func:`.flushplan.plan_run`, carried out: hung runs deleted, outcomes recorded
as Events, new runs created (never edited afterwards). The step leaves the
flush part of the status and the ``FlushHealthy`` condition in ``p.flush``
(:class:`.flushplan.FlushReport`); :func:`.steps.write_status` writes them.

Run failures do not degrade the cluster: they show in ``FlushHealthy`` and
Events and are retried with back-off. What stops every run (no Spark operator
installed, the metastore unreadable) is a failure of this step as well.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import string
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from headrace import errors
from headrace_operator import models, sparkapps
from headrace_operator.events import Reason
from headrace_operator.flushplan import (
    FlushReport,
    PlanOptions,
    RunInputs,
    flush_health,
    flush_lag_s,
    plan_run,
)
from headrace_operator.models import FlushRunStatus, FlushSpec, FlushStatus, RunJob
from headrace_operator.results import DONE, StepResult, failed, waiting_on
from headrace_operator.sparkapps import AppView, app_view
from spark_apps.schedule import Channel, RetryPolicy, Unreadable

if TYPE_CHECKING:
    from headrace_operator.steps import Pass

log = logging.getLogger(__name__)
_ALPHABET = string.ascii_lowercase + string.digits


def nonce() -> str:
    """A fresh name suffix for a run."""
    return "".join(secrets.choice(_ALPHABET) for _ in range(6))


def previous_flush(status: Mapping[str, Any] | None) -> FlushStatus:
    """The flush status the last pass wrote (empty when missing or unreadable)."""
    raw = (status or {}).get("flush")
    if not isinstance(raw, dict):
        return FlushStatus()
    try:
        return FlushStatus.model_validate(raw)
    except ValueError:
        log.warning("the previous flush status does not parse; starting a new history")
        return FlushStatus()


def plan_options(flush: FlushSpec) -> PlanOptions:
    return PlanOptions(
        retry=RetryPolicy(
            base_s=float(flush.backoff_seconds),
            cap_s=float(flush.max_backoff_seconds),
            poison_s=float(max(flush.max_backoff_seconds, flush.backoff_seconds)),
        ),
        deadline_s=float(flush.deadline_seconds),
        compaction_interval_s=float(flush.compaction.interval_seconds),
    )


async def _served(p: Pass) -> dict[str, bool]:
    return {
        api: await p.kube.served(api, sparkapps.KIND)
        for api in (sparkapps.KUBEFLOW_API, sparkapps.APACHE_API)
    }


def _blocked(previous: FlushStatus, problem: str, api: str = "") -> FlushReport:
    kept = previous.model_copy(update={"spark_api": api})
    return FlushReport(kept, False, "FlushBlocked", problem)


async def _announce_blocked(p: Pass, problem: str) -> None:
    conditions: list[dict[str, Any]] = (p.body.get("status") or {}).get("conditions") or []
    before: Mapping[str, Any] = next(
        (c for c in conditions if c.get("type") == models.ConditionType.FLUSH_HEALTHY.value),
        {},
    )
    if before.get("reason") != "FlushBlocked" or before.get("message") != problem:
        await p.event(Reason.FLUSH_BLOCKED, problem, warning=True)


async def reconcile_flush(p: Pass) -> StepResult:
    """Launch, watch and retry the cluster's flush and compaction runs."""
    spec = p.need_spec()
    if spec.flush is None:
        p.flush = FlushReport(None)
        return DONE
    flush = spec.flush
    previous = previous_flush(p.body.get("status"))
    api, problem = sparkapps.choose_api(flush.spark_operator, await _served(p))
    if not api:
        p.flush = _blocked(previous, problem)
        await _announce_blocked(p, problem)
        return failed(problem, retryable=True)
    if p.control is None:  # nothing observed: the last flush status and condition stay
        return waiting_on("flush runs wait for the metastore connection")
    try:
        channels = await p.control.flush_channels()
    except errors.HeadraceError as exc:
        problem = f"cannot read the flush records: {exc.message}"
        p.flush = _blocked(previous, problem, api)
        await _announce_blocked(p, problem)
        return failed(problem, retryable=exc.retryable)
    apps = [
        app_view(obj)
        for obj in await p.kube.list(
            api, sparkapps.KIND, p.ref.namespace, sparkapps.run_labels(p.ref.name)
        )
    ]
    runs, completed, failures = await _carry_out(p, Observed(api, flush, channels, previous, apps))
    now = p.now.timestamp()
    lag = flush_lag_s(channels, now)
    unreadable = [
        f"{c.pchannel}: its records cannot be read: {c.error}"
        for c in channels
        if isinstance(c, Unreadable)
    ]
    healthy, reason, message = flush_health(runs, unreadable, lag)
    p.flush = FlushReport(
        FlushStatus(
            spark_api=api,
            lag_seconds=lag,
            lag=f"{lag}s",
            runs_completed=previous.runs_completed + completed,
            runs_failed=previous.runs_failed + failures,
            runs=runs,
        ),
        healthy,
        reason,
        message,
    )
    return DONE


@dataclasses.dataclass(frozen=True, slots=True)
class Observed:
    """What the step read before planning."""

    api: str
    flush: FlushSpec
    channels: Sequence[Channel | Unreadable]
    previous: FlushStatus
    apps: Sequence[AppView]


async def _carry_out(p: Pass, seen: Observed) -> tuple[list[FlushRunStatus], int, int]:
    """Plan and carry out every pchannel's jobs; their new statuses and the
    runs that completed and failed this pass."""
    spec, api, flush, apps = p.need_spec(), seen.api, seen.flush, seen.apps
    jobs = [RunJob.FLUSH] + ([RunJob.COMPACT] if flush.compaction.enabled else [])
    by_channel = {c.pchannel: c for c in seen.channels}
    before: dict[tuple[str, RunJob], FlushRunStatus] = {
        (r.pchannel, r.job): r for r in seen.previous.runs
    }
    pchannels = sorted(
        set(by_channel) | {r.pchannel for r in seen.previous.runs} | {a.pchannel for a in apps}
    )
    options = plan_options(flush)
    runs: list[FlushRunStatus] = []
    completed = failures = 0
    for pchannel in pchannels:
        if pchannel not in spec.pchannel_names:
            continue
        for job in jobs:
            inputs = RunInputs(
                job,
                pchannel,
                by_channel.get(pchannel),
                before.get((pchannel, job)),
                [a for a in apps if a.pchannel == pchannel and a.job is job],
            )
            plan = plan_run(
                inputs,
                p.now.timestamp(),
                options,
                cluster=p.ref.name,
                nonce=nonce(),
            )
            for name in plan.delete:
                await p.kube.delete(api, sparkapps.KIND, p.ref.namespace, name)
            for note in plan.notes:
                await p.event(note.reason, note.message, warning=note.warning)
            if plan.create is not None:
                app = sparkapps.spark_app(api, p.ref, spec, plan.create)
                await p.kube.create(app)
                await p.event(
                    Reason.SPARK_RUN_CREATED,
                    f"{job.value} run {app['metadata']['name']} of {pchannel} created",
                )
            runs.append(plan.status)
            completed += plan.completed
            failures += plan.failed
    return runs, completed, failures

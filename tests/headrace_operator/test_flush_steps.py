"""The flush step on the in-memory API server: discovery of the SparkApplication
API, runs created once per pchannel, outcomes written by a Spark operator
recorded in the cluster's status, FlushHealthy and Events, hung runs deleted.

The real API server (the stand-in Spark operator running the flush job) is
``e2e/test_flush.py``."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

import headrace.wal.memory  # noqa: F401 - registers the memory: message ids
from headrace.cluster import Assignment, AssignmentState
from headrace.table.records import CheckpointRecord, SealRecord
from headrace_operator import models, sparkapps
from headrace_operator.flush_steps import reconcile_flush
from headrace_operator.results import PassResult
from headrace_operator.steps import Pass, parse_spec, write_status
from spark_apps.schedule import Channel, Unreadable
from tests.headrace_operator.fake_kube import FakeKube
from tests.headrace_operator.test_models import flush_section, valid

NS = "data"
T0 = datetime.datetime(2026, 11, 24, 3, 0, tzinfo=datetime.UTC)


class Records:
    """The part of :class:`ClusterControl` the flush step uses."""

    def __init__(self) -> None:
        self.channels: list[Channel | Unreadable] = []

    async def flush_channels(self) -> Sequence[Channel | Unreadable]:
        return list(self.channels)


def channel(p: str, seal: int, checkpoint: int | None) -> Channel:
    return Channel(
        p,
        SealRecord(pchannel=p, position=f"memory:{seal}"),
        None
        if checkpoint is None
        else CheckpointRecord(pchannel=p, position=f"memory:{checkpoint}"),
        Assignment(pchannel=p, state=AssignmentState.ASSIGNED, term=2, node="n"),
    )


async def cluster(kube: FakeKube, **flush: Any) -> None:
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": "lake", "namespace": NS, "uid": "u1"},
        "spec": valid(pchannels=2, flush=flush_section(deadlineSeconds=30, **flush)),
    }
    await kube.apply(body)


async def run(kube: FakeKube, records: Records, now: datetime.datetime) -> dict[str, Any]:
    body = await kube.get(models.API_VERSION, "StreamingCluster", NS, "lake")
    assert body is not None
    p = Pass(body=body, kube=kube, events=Events(kube), probe=None, connect=None, now=now)  # type: ignore[arg-type]
    await parse_spec(p)
    p.control = records  # type: ignore[assignment]
    result = await reconcile_flush(p)
    return await write_status(p, PassResult((("flush", result),)))


class Events:
    def __init__(self, kube: FakeKube) -> None:
        self.kube = kube
        self.reasons: list[str] = []

    async def emit(
        self, involved: Any, reason: str, message: str, *, warning: bool = False
    ) -> None:
        self.reasons.append(reason)
        EVENTS.append((reason, message))


EVENTS: list[tuple[str, str]] = []


def apps(kube: FakeKube, api: str = sparkapps.KUBEFLOW_API) -> dict[str, dict[str, Any]]:
    return {key[3]: obj for key, obj in kube.objects.items() if key[:2] == (api, sparkapps.KIND)}


def set_state(kube: FakeKube, name: str, state: str, message: str = "") -> None:
    obj = apps(kube)[name]
    obj["status"] = {"applicationState": {"state": state, "errorMessage": message}}


def condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "FlushHealthy")


async def test_runs_are_launched_recorded_and_retried() -> None:
    EVENTS.clear()
    kube, records = FakeKube(), Records()
    kube.clock = lambda: T0
    await cluster(kube)
    # No Spark operator served: blocked, said so, nothing created.
    status = await run(kube, records, T0)
    assert condition(status)["status"] == "False"
    assert condition(status)["reason"] == "FlushBlocked"
    assert ("FlushBlocked", condition(status)["message"]) in EVENTS
    kube.served_kinds.add((sparkapps.APACHE_API, sparkapps.KIND))
    kube.served_kinds.add((sparkapps.KUBEFLOW_API, sparkapps.KIND))
    records.channels = [channel("pchannel-000", 20, 10), channel("pchannel-001", 5, 5)]
    status = await run(kube, records, T0)
    (name,) = apps(kube)
    assert status["flush"]["sparkApi"] == sparkapps.KUBEFLOW_API
    assert apps(kube, sparkapps.APACHE_API) == {}, "Kubeflow's API is preferred"
    runs = {r["pchannel"]: r for r in status["flush"]["runs"]}
    assert runs["pchannel-000"]["run"] == name and runs["pchannel-000"]["phase"] == "Pending"
    assert "at or past the last seal" in runs["pchannel-001"]["waiting"]
    # Another pass while it is SUBMITTED creates nothing more.
    set_state(kube, name, "SUBMITTED")
    status = await run(kube, records, T0 + datetime.timedelta(seconds=5))
    assert list(apps(kube)) == [name]
    assert condition(status)["status"] == "True"
    # It fails: recorded once, FlushHealthy False, a Warning Event; retried after the back-off.
    set_state(kube, name, "FAILED", "driver container failed with ExitCode: 5, Reason: Error")
    status = await run(kube, records, T0 + datetime.timedelta(seconds=6))
    assert status["flush"]["runsFailed"] == 1
    assert condition(status)["reason"] == "RunsFailing"
    assert "SparkRunFailed" in [e[0] for e in EVENTS]
    status = await run(kube, records, T0 + datetime.timedelta(seconds=7))
    assert status["flush"]["runsFailed"] == 1 and len(apps(kube)) == 1
    status = await run(kube, records, T0 + datetime.timedelta(seconds=17))
    (retry,) = set(apps(kube)) - {name}
    # The retry hangs in SUBMITTED past the 30 s deadline: deleted, retried.
    kube.clock = lambda: T0 + datetime.timedelta(seconds=17)
    set_state(kube, retry, "SUBMITTED")
    status = await run(kube, records, T0 + datetime.timedelta(seconds=48))
    assert retry not in apps(kube)
    assert status["flush"]["runsFailed"] == 2
    assert "SparkRunTimedOut" in [e[0] for e in EVENTS]
    status = await run(kube, records, T0 + datetime.timedelta(seconds=48 + 21))
    (third,) = set(apps(kube)) - {name}
    set_state(kube, third, "COMPLETED")
    records.channels = [channel("pchannel-000", 20, 20), channel("pchannel-001", 5, 5)]
    status = await run(kube, records, T0 + datetime.timedelta(seconds=80))
    assert status["flush"]["runsCompleted"] == 1
    assert condition(status)["status"] == "True"
    assert {r["pchannel"]: r["failures"] for r in status["flush"]["runs"]} == {
        "pchannel-000": 0,
        "pchannel-001": 0,
    }
    assert "SparkRunCompleted" in [e[0] for e in EVENTS]


async def test_apache_api_when_asked_and_no_flush_section_no_status() -> None:
    kube, records = FakeKube(), Records()
    kube.served_kinds.add((sparkapps.APACHE_API, sparkapps.KIND))
    kube.served_kinds.add((sparkapps.KUBEFLOW_API, sparkapps.KIND))
    await cluster(kube, sparkOperator="apache")
    records.channels = [channel("pchannel-000", 20, None)]
    status = await run(kube, records, T0)
    assert status["flush"]["sparkApi"] == sparkapps.APACHE_API
    assert len(apps(kube, sparkapps.APACHE_API)) == 1 and apps(kube) == {}
    body = await kube.get(models.API_VERSION, "StreamingCluster", NS, "lake")
    assert body is not None
    await kube.apply({**body, "spec": valid(pchannels=2)})
    status = await run(kube, records, T0)
    assert "flush" not in status
    assert all(c["type"] != "FlushHealthy" for c in status["conditions"])

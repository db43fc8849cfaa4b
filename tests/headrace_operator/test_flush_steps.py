"""The flush step on the in-memory and on the real API server: discovery of
the SparkApplication API, runs created once per pchannel (valid against the
Spark operators' CRDs on the real server), outcomes written by a Spark
operator recorded in the cluster's status, FlushHealthy and Events, hung runs
deleted at their deadline.

The whole path with the operator process and the stand-in Spark operator
running the flush job is ``e2e/test_flush.py``."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

import headrace.wal.memory  # noqa: F401 - registers the memory: message ids
from e2e.spark_standin import crds as spark_crds
from headrace.cluster import Assignment, AssignmentState
from headrace.table.records import CheckpointRecord, SealRecord
from headrace_operator import models, sparkapps
from headrace_operator.flush_steps import reconcile_flush
from headrace_operator.interfaces import KubeApi
from headrace_operator.kube import KubernetesApi
from headrace_operator.results import PassResult
from headrace_operator.steps import Pass, parse_spec, write_status
from spark_apps.schedule import Channel, Unreadable
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.fake_kube import FakeKube
from tests.headrace_operator.op_harness import install_crds
from tests.headrace_operator.test_models import flush_section, valid


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


@dataclasses.dataclass
class Server:
    kube: KubeApi
    ns: str
    fake: FakeKube | None
    t0: datetime.datetime = dataclasses.field(default_factory=_now)
    """The time of the test's first pass (a real API server stamps objects
    with its own clock: the passes' times are counted from it)."""

    async def serve_spark(self) -> None:
        """Install both SparkApplication APIs."""
        if self.fake is not None:
            self.fake.served_kinds.add((sparkapps.APACHE_API, sparkapps.KIND))
            self.fake.served_kinds.add((sparkapps.KUBEFLOW_API, sparkapps.KIND))
            return
        for crd in spark_crds():
            await self.kube.apply(crd)
        for api in (sparkapps.KUBEFLOW_API, sparkapps.APACHE_API):
            for _ in range(200):
                if await self.kube.served(api, sparkapps.KIND):
                    break
                await asyncio.sleep(0.1)

    async def apps(self, api: str = sparkapps.KUBEFLOW_API) -> dict[str, dict[str, Any]]:
        listed = await self.kube.list(api, sparkapps.KIND, self.ns, {})
        return {
            a["metadata"]["name"]: a for a in listed if not a["metadata"].get("deletionTimestamp")
        }

    async def set_state(self, name: str, state: str, message: str = "") -> None:
        status = {"applicationState": {"state": state, "errorMessage": message}}
        await self.kube.patch_merge(
            sparkapps.KUBEFLOW_API,
            sparkapps.KIND,
            self.ns,
            name,
            {"status": status},
            subresource="status",
        )


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kube)])
async def server(request: pytest.FixtureRequest) -> AsyncIterator[Server]:
    ns = f"flush-{uuid.uuid4().hex[:8]}"
    if request.param == "fake":
        fake = FakeKube()
        server = Server(fake, ns, fake)
        fake.clock = lambda: server.t0
        yield server
        return
    testbed: KubeTestbed = request.getfixturevalue("kube_cluster")
    api = KubernetesApi(testbed.api_client())
    await install_crds(api)
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    try:
        yield Server(api, ns, None)
    finally:
        await api.delete("v1", "Namespace", "", ns)
        api.close()


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


async def cluster(server: Server, **flush: Any) -> None:
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": "lake", "namespace": server.ns},
        "spec": valid(pchannels=2, flush=flush_section(deadlineSeconds=30, **flush)),
    }
    await server.kube.apply(body)


class Events:
    """Records the Events a pass emits (reason, message)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    async def emit(
        self, involved: Any, reason: str, message: str, *, warning: bool = False
    ) -> None:
        self.seen.append((reason, message))

    @property
    def reasons(self) -> list[str]:
        return [reason for reason, _ in self.seen]


async def run(
    server: Server, records: Records | None, events: Events, after_s: float = 0.0
) -> dict[str, Any]:
    """One flush step (and the status write) ``after_s`` after the first."""
    body = await server.kube.get(models.API_VERSION, "StreamingCluster", server.ns, "lake")
    assert body is not None
    now = server.t0 + datetime.timedelta(seconds=after_s)
    p = Pass(body=body, kube=server.kube, events=events, probe=None, connect=None, now=now)  # type: ignore[arg-type]
    await parse_spec(p)
    p.control = records  # type: ignore[assignment]
    result = await reconcile_flush(p)
    if records is None:
        assert result.waiting == ("flush runs wait for the metastore connection",)
    return await write_status(p, PassResult((("flush", result),)))


def condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "FlushHealthy")


async def test_runs_are_launched_recorded_and_retried(server: Server) -> None:
    records, events = Records(), Events()
    await cluster(server)
    if server.fake is not None:
        # No Spark operator served: blocked, said so, nothing created.
        status = await run(server, records, events)
        assert condition(status)["status"] == "False"
        assert condition(status)["reason"] == "FlushBlocked"
        assert ("FlushBlocked", condition(status)["message"]) in events.seen
    await server.serve_spark()
    records.channels = [channel("pchannel-000", 20, 10), channel("pchannel-001", 5, 5)]
    status = await run(server, records, events)
    (name,) = await server.apps()
    assert status["flush"]["sparkApi"] == sparkapps.KUBEFLOW_API
    assert await server.apps(sparkapps.APACHE_API) == {}, "Kubeflow's API is preferred"
    runs = {r["pchannel"]: r for r in status["flush"]["runs"]}
    assert runs["pchannel-000"]["run"] == name and runs["pchannel-000"]["phase"] == "Pending"
    assert "at or past the last seal" in runs["pchannel-001"]["waiting"]
    # Another pass while it is SUBMITTED creates nothing more.
    await server.set_state(name, "SUBMITTED")
    status = await run(server, records, events, 5)
    assert list(await server.apps()) == [name]
    assert condition(status)["status"] == "True"
    # It fails: recorded once, FlushHealthy False, a Warning Event; retried after the back-off.
    await server.set_state(
        name, "FAILED", "driver container failed with ExitCode: 5, Reason: Error"
    )
    status = await run(server, records, events, 6)
    assert status["flush"]["runsFailed"] == 1
    assert condition(status)["reason"] == "RunsFailing"
    assert "SparkRunFailed" in events.reasons
    status = await run(server, records, events, 7)
    assert status["flush"]["runsFailed"] == 1 and len(await server.apps()) == 1
    status = await run(server, records, events, 17)
    (retry,) = set(await server.apps()) - {name}
    # The retry hangs in SUBMITTED past the 30 s deadline: deleted, retried.
    await server.set_state(retry, "SUBMITTED")
    status = await run(server, records, events, 48)
    assert retry not in await server.apps()
    assert status["flush"]["runsFailed"] == 2
    assert "SparkRunTimedOut" in events.reasons
    status = await run(server, records, events, 48 + 21)
    (third,) = set(await server.apps()) - {name}
    await server.set_state(third, "COMPLETED")
    records.channels = [channel("pchannel-000", 20, 20), channel("pchannel-001", 5, 5)]
    status = await run(server, records, events, 80)
    assert status["flush"]["runsCompleted"] == 1
    assert condition(status)["status"] == "True"
    assert {r["pchannel"]: r["failures"] for r in status["flush"]["runs"]} == {
        "pchannel-000": 0,
        "pchannel-001": 0,
    }
    assert "SparkRunCompleted" in events.reasons
    # The run was never changed after creation: only its status moved.
    app = (await server.apps())[third]
    assert app["metadata"].get("generation", 1) == 1
    assert app["metadata"]["ownerReferences"][0]["kind"] == "StreamingCluster"


async def test_apache_api_when_asked_and_no_flush_section_no_status(server: Server) -> None:
    records, events = Records(), Events()
    await server.serve_spark()
    await cluster(server, sparkOperator="apache")
    records.channels = [channel("pchannel-000", 20, None)]
    status = await run(server, records, events)
    assert status["flush"]["sparkApi"] == sparkapps.APACHE_API
    assert len(await server.apps(sparkapps.APACHE_API)) == 1
    assert await server.apps() == {}
    await server.kube.patch_merge(
        models.API_VERSION, "StreamingCluster", server.ns, "lake", {"spec": {"flush": None}}
    )
    await run(server, records, events)
    body = await server.kube.get(models.API_VERSION, "StreamingCluster", server.ns, "lake")
    assert body is not None
    assert "flush" not in body["status"], "the stored status loses the flush part"
    assert all(c["type"] != "FlushHealthy" for c in body["status"]["conditions"])


async def test_without_the_metastore_the_last_flush_status_stays(server: Server) -> None:
    records, events = Records(), Events()
    await server.serve_spark()
    await cluster(server)
    records.channels = [channel("pchannel-000", 20, 10)]
    first = await run(server, records, events)
    later = await run(server, None, events, 30)
    assert later["flush"] == first["flush"]
    assert condition(later) == condition(first)

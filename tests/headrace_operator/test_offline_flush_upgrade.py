"""The Offline UpgradePlan of a cluster with a flush section, on the fake and
on the real API server (``bed``).

The plan requests a flush of every collection once the nodes are fenced,
records the targets, and stops the nodes only once every checkpoint reached
its target. The cluster's own pass launches the flush runs as
SparkApplications, as always; here the test plays the Spark operator: it
completes a run by moving its pchannel's checkpoint to the pchannel's seal (a
flush job commits exactly that range), and only when the test lets it. On the
real bed the collections, their rows and the flush requests go through real
nodes; on the fake bed the simulated nodes answer the request
(:class:`~tests.headrace_operator.op_harness.FlushRecorder`). The flush job
itself, writing the rows to the tables, runs in ``e2e/test_upgrade_offline.py``.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pyarrow as pa
import pytest

from headrace.client import HeadraceClient
from headrace.client.flushing import progress
from headrace.cluster import ClusterConfig
from headrace.message import ids
from headrace.table.collections import CollectionSpec, CollectionStore
from headrace.table.records import CheckpointRecord
from headrace_operator import sparkapps
from headrace_operator.coordinator_runner import MetastoreControl
from headrace_operator.models import RunJob, RunPhase
from headrace_operator.offline_flush import ROLLED_BACK_UNFLUSHED
from spark_apps.schedule import Channel
from tests.headrace_operator.op_harness import Bed, condition, is_ready
from tests.headrace_operator.test_models import flush_section
from tests.headrace_operator.test_offline_upgrade import OFFLINE_ACTIONS, drive, write_stop
from tests.headrace_operator.test_upgrade_steps import (
    TARGET,
    UP,
    create_plan,
    images,
    plan_body,
    upgrade_pass,
)

pytestmark = pytest.mark.timeout(600)

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
COLLECTIONS = {"orders": 2, "users": 1}
"""Collection -> shards."""


async def flushing_cluster(bed: Bed, name: str, nodes: int) -> None:
    await bed.serve_spark()
    flush = flush_section(deadlineSeconds=600, backoffSeconds=1, maxBackoffSeconds=2)
    await bed.create_cluster(name, nodes=nodes, pchannels=4, flush=flush)
    await bed.converge(name, is_ready, what="Ready")


async def control_of(bed: Bed, cluster: str) -> MetastoreControl:
    control = await bed.control(cluster)
    assert isinstance(control, MetastoreControl)
    return control


async def add_collections(bed: Bed, cluster: str) -> None:
    """The collections of :data:`COLLECTIONS`; on the real bed through a
    client (the nodes announce each shard), with rows in each."""
    if not bed.real:
        control = await control_of(bed, cluster)
        store = CollectionStore(control.metastore, control.keys)
        for name, shards in COLLECTIONS.items():
            await store.create(CollectionSpec(name, SCHEMA, "pk", shards))
        return
    url = f"etcd://{bed.etcd_endpoint}"
    async with HeadraceClient(url, f"{bed.namespace}.{cluster}") as client:
        producer = client.producer()
        for name, shards in COLLECTIONS.items():
            await client.create_collection(name, SCHEMA, primary_key="pk", shards=shards)
            rows = pa.table(
                {"pk": pa.array(range(50), pa.int64()), "name": [f"n{i}" for i in range(50)]},
                schema=SCHEMA,
            )
            await producer.insert(name, rows)
        await producer.close()


async def carrying_pchannels(bed: Bed, cluster: str) -> list[str]:
    """The pchannels carrying a shard of a collection."""
    control = await control_of(bed, cluster)
    config_kv = await control.metastore.get(control.keys.config)
    assert config_kv is not None
    config = ClusterConfig.from_json(config_kv.value)
    collections = await CollectionStore(control.metastore, control.keys).list()
    return sorted({config.route(v) for c in collections for v in c.vchannels})


class SparkPlayer:
    """Plays the Spark operator for the cluster's flush runs: completes each
    run by committing its pchannel's checkpoint at the pchannel's seal, when
    ``running``."""

    def __init__(self, bed: Bed, cluster: str) -> None:
        self.bed, self.cluster = bed, cluster
        self.running = False
        self.completed: list[str] = []

    async def play(self) -> None:
        if not self.running:
            return
        bed = self.bed
        apps = await bed.kube.list(
            sparkapps.KUBEFLOW_API,
            sparkapps.KIND,
            bed.namespace,
            sparkapps.run_labels(self.cluster),
        )
        control = await control_of(bed, self.cluster)
        seals = {
            c.pchannel: c.seal
            for c in await control.flush_channels()
            if isinstance(c, Channel) and c.seal is not None
        }
        for app in apps:
            view = sparkapps.app_view(app)
            if view.job is not RunJob.FLUSH or view.phase is not RunPhase.PENDING:
                continue
            seal = seals.get(view.pchannel)
            if seal is not None:
                record = CheckpointRecord(
                    pchannel=view.pchannel, position=seal.position, node=seal.node, term=seal.term
                )
                await control.metastore.put(
                    control.keys.checkpoint(view.pchannel), record.to_json()
                )
            status = {"applicationState": {"state": "COMPLETED", "errorMessage": ""}}
            await bed.kube.patch_merge(
                sparkapps.KUBEFLOW_API,
                sparkapps.KIND,
                bed.namespace,
                view.name,
                {"status": status},
                subresource="status",
            )
            self.completed.append(view.pchannel)


def flush_step(body: dict[str, Any]) -> dict[str, Any]:
    return dict(next(s for s in body["status"].get("plan", []) if s["action"] == "flush"))


async def checkpoints_reached(bed: Bed, cluster: str, recorded: dict[str, Any]) -> bool:
    targets = {t["pchannel"]: ids.parse(t["target"]) for t in recorded["pchannels"]}
    control = await control_of(bed, cluster)
    return progress(targets, await control.checkpoints(sorted(targets))).done


def uids_of(pods: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: pod["metadata"]["uid"] for name, pod in pods.items()}


async def requested_and_waiting(bed: Bed, carrying: list[str]) -> dict[str, Any]:
    """Drive plan ``lake-up`` until its flush is requested, then some more
    passes: it waits, every node still up. The recorded flush."""

    async def waiting_on_the_flush() -> bool:
        await upgrade_pass(bed, "lake-up")
        body = await plan_body(bed, "lake-up")
        step = flush_step(body) if body["status"].get("plan") else {}
        return step.get("state") == "Running" and bool(body["status"].get("flush"))

    before = uids_of(await bed.pods("lake"))
    await bed.until("lake", waiting_on_the_flush, what="the flush requested", timeout=120)
    recorded = dict((await plan_body(bed, "lake-up"))["status"]["flush"])
    assert recorded["collections"] == len(COLLECTIONS)
    assert [t["pchannel"] for t in recorded["pchannels"]] == carrying
    assert len(bed.flush_requests) == 1
    assert set(bed.flush_requests[0].collections) == set(COLLECTIONS)
    for _ in range(10):
        await bed.reconcile("lake")
        await upgrade_pass(bed, "lake-up")
        await asyncio.sleep(0.3 if bed.real else 0.05)
    body = await plan_body(bed, "lake-up")
    step = flush_step(body)
    assert step["state"] == "Running", step
    assert step["message"].startswith("waiting on "), step["message"]
    behind = [t["pchannel"] for t in body["status"]["flush"]["pchannels"] if not t["reached"]]
    assert behind and all(p in step["message"] for p in behind), step["message"]
    assert uids_of(await bed.pods("lake")) == before, (
        "no node stops before every checkpoint reaches the flush request"
    )
    assert condition(body, "WritesStopped")["status"] == "True"
    apps = await bed.kube.list(
        sparkapps.KUBEFLOW_API, sparkapps.KIND, bed.namespace, sparkapps.run_labels("lake")
    )
    assert {sparkapps.app_view(a).pchannel for a in apps} >= set(carrying), (
        "the cluster's pass launched a flush run for every pchannel the request sealed"
    )
    return recorded


async def restart_keeps_the_targets(bed: Bed, recorded: dict[str, Any]) -> None:
    """The operator goes away; its successor waits on the same targets."""
    await bed.runners.stop_all()
    for _ in range(3):
        await bed.reconcile("lake")
        await upgrade_pass(bed, "lake-up")
    assert len(bed.flush_requests) == 1, "an operator restart does not request anew"
    targets = [(t["pchannel"], t["target"]) for t in recorded["pchannels"]]
    again = (await plan_body(bed, "lake-up"))["status"]["flush"]["pchannels"]
    assert [(t["pchannel"], t["target"]) for t in again] == targets


async def test_offline_upgrade_flushes_every_collection_before_the_nodes_stop(bed: Bed) -> None:
    nodes = 2
    await flushing_cluster(bed, "lake", nodes)
    await add_collections(bed, "lake")
    carrying = await carrying_pchannels(bed, "lake")
    before = uids_of(await bed.pods("lake"))
    await create_plan(bed, "lake-up", "lake", mode="Offline")
    recorded = await requested_and_waiting(bed, carrying)
    await restart_keeps_the_targets(bed, recorded)

    # The runs complete: the nodes stop only after every checkpoint is there.
    spark = SparkPlayer(bed, "lake")
    spark.running = True
    stopped_early: list[dict[str, str]] = []

    async def each(body: dict[str, Any]) -> None:
        await spark.play()
        uids = uids_of(await bed.pods("lake"))
        if uids != before and not await checkpoints_reached(bed, "lake", recorded):
            stopped_early.append(uids)

    seen: dict[str, set[str]] = {}
    body = await drive(bed, "lake", "lake-up", ("Succeeded", "Blocked"), seen=seen, each=each)
    status = body["status"]
    assert status["phase"] == "Succeeded", status
    assert not stopped_early, "a node stopped before every checkpoint reached its target"
    assert set(spark.completed) >= set(carrying)
    assert [(s["action"], s["state"]) for s in status["plan"]] == [
        (a, "Done") for a in OFFLINE_ACTIONS
    ]
    assert flush_step(body)["message"].startswith(
        f"flushed {len(COLLECTIONS)} collection(s): every checkpoint reached the plan's flush "
    )
    assert status["flush"]["done"] and all(t["reached"] for t in status["flush"]["pchannels"])
    assert {n: len(u) for n, u in seen.items()} == {f"lake-node-{i}": 2 for i in range(nodes)}
    assert set((await images(bed, "lake")).values()) == {TARGET}
    assert (await write_stop(bed, "lake")).stop is None
    reasons = await bed.event_reasons()
    assert reasons.count("UpgradeFlushRequested") == 1
    assert reasons.count("UpgradeFlushed") == 1
    assert "UpgradeBlocked" not in reasons


async def test_a_flush_that_never_finishes_blocks_the_plan_then_rolls_back(bed: Bed) -> None:
    if bed.real:
        pytest.skip("the decision and the timeout are the same on both beds; the fake is enough")
    await flushing_cluster(bed, "mire", 2)
    await add_collections(bed, "mire")
    before = {n: p["metadata"]["uid"] for n, p in (await bed.pods("mire")).items()}
    await create_plan(bed, "mire-up", "mire", mode="Offline", flushTimeoutSeconds=10)
    body = await drive(bed, "mire", "mire-up", ("Blocked", "Succeeded"), seen={}, timeout=60)
    assert body["status"]["phase"] == "Blocked"
    blocked = condition(body, "Blocked")["message"]
    assert blocked.startswith("flush has not finished within 10s: waiting on pchannel-"), blocked
    assert "checkpoint no checkpoint yet, needs local:" in blocked
    assert "writes stay stopped" in blocked
    assert condition(body, "WritesStopped")["status"] == "True"
    assert {n: p["metadata"]["uid"] for n, p in (await bed.pods("mire")).items()} == before
    assert len(bed.flush_requests) == 1, "Blocked, it does not request again"

    await bed.kube.patch_merge(*UP, bed.namespace, "mire-up", {"spec": {"rollback": True}})
    body = await drive(bed, "mire", "mire-up", ("RolledBack",), seen={})
    assert (await write_stop(bed, "mire")).stop is None, "rolling back resumes writes"
    step = flush_step(body)
    assert (step["state"], step["message"]) == ("Skipped", ROLLED_BACK_UNFLUSHED)
    assert {n: p["metadata"]["uid"] for n, p in (await bed.pods("mire")).items()} == before


async def test_a_cluster_without_collections_flushes_nothing_and_goes_on(bed: Bed) -> None:
    if bed.real:
        pytest.skip("the real bed's flush path is shown with collections above")
    await flushing_cluster(bed, "dry", 2)
    await create_plan(bed, "dry-up", "dry", mode="Offline")
    body = await drive(bed, "dry", "dry-up", ("Succeeded", "Blocked"), seen={})
    assert body["status"]["phase"] == "Succeeded", body["status"]
    step = flush_step(body)
    assert (step["state"], step["message"]) == ("Done", "0 collection(s), nothing to flush")
    assert len(bed.flush_requests) == 1


async def test_a_flush_request_that_keeps_failing_is_retried_then_blocked(bed: Bed) -> None:
    if bed.real:
        pytest.skip("the fake bed's nodes can refuse on demand")
    await flushing_cluster(bed, "deaf", 2)
    await add_collections(bed, "deaf")
    bed.flush_refusal = "no node answered (connection refused)"
    await create_plan(bed, "deaf-up", "deaf", mode="Offline", flushTimeoutSeconds=10)

    async def retrying() -> bool:
        await upgrade_pass(bed, "deaf-up")
        body = await plan_body(bed, "deaf-up")
        return bool(body["status"].get("plan")) and flush_step(body)["state"] == "Running"

    await bed.until("deaf", retrying, what="the flush step running", timeout=60)
    body = await plan_body(bed, "deaf-up")
    assert body["status"]["phase"] == "Running"
    assert flush_step(body)["message"] == (
        "cannot request a flush of every collection: no node answered (connection refused)"
    )
    assert "flush" not in body["status"], "nothing recorded: the next pass asks again"
    body = await drive(bed, "deaf", "deaf-up", ("Blocked", "Succeeded"), seen={}, timeout=60)
    assert body["status"]["phase"] == "Blocked"
    assert condition(body, "Blocked")["message"].startswith(
        "flush has not finished within 10s: cannot request a flush of every collection: "
        "no node answered (connection refused); writes stay stopped"
    )
    bed.flush_refusal = ""  # the nodes answer again: the next pass's request goes through
    body = await drive(bed, "deaf", "deaf-up", ("Running",), seen={}, timeout=60)
    assert len(bed.flush_requests) == 1, "once the nodes answer, the request goes through"
    assert body["status"]["flush"]["collections"] == len(COLLECTIONS)

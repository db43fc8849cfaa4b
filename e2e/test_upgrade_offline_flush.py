"""Scenario 11b: an Offline UpgradePlan of a cluster with a flush section.

Its own StreamingCluster ``offf`` (2 nodes, 2 pchannels) with a flush section
(Kubeflow's SparkApplication API, the stand-in Spark operator of
``e2e/spark_standin.py`` running ``spark_apps/flush.py`` in local mode against
the session's SeaweedFS S3 store) and no seal policy: the nodes seal only when
asked. A producer inserts rows into the collection ``items`` (2 shards)
without pause, each insert retried for up to 10 minutes. The plan stops
writes, waits for in-flight appends, freezes the nodes, and requests a flush
of every collection. The stand-in Spark operator is held back until the
operator process has been restarted mid-wait: the new one waits on the same
targets (one ``UpgradeFlushRequested``). Then the runs go, and only once every
pchannel's checkpoint reached the plan's request do the nodes stop and start
on the target; writes resume.

It must end Succeeded with: no insert failing; no node pod replaced before
the flush step was Done; the committed Iceberg table, read with pyiceberg,
holding exactly the rows acknowledged before the stop (once each), and the
collection read through Headrace (table plus WAL tail) holding every row
acknowledged, before and after the upgrade, once each.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator
from typing import Any

import pyarrow as pa
import pytest
import pytest_asyncio

from e2e.conftest import E2E
from e2e.harness import API_VERSION, condition, until
from e2e.spark_standin import KUBEFLOW_API, SparkStandIn, kubeflow_crd
from e2e.test_flush import committed, s3_secret, spark_served
from e2e.upgrades import Shape, UpgradeBed, cluster_for
from e2e.upgrades import plan_manifest as upgrade_plan
from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions, ReadOptions
from headrace.table import ObjectStoreOptions
from tests.fixtures_s3 import S3Store

pytestmark = [
    pytest.mark.kube,
    pytest.mark.slow,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(1500),
]

NAME = "offf"
NODES = 2
PCHANNELS = 2
TARGET = "headrace-node:e2e-offline-flush"
PLAN = "offf-next"
SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
SHAPE = Shape(NAME, PLAN, NODES, PCHANNELS)
BATCH = 20


def flush_section(s3_store: S3Store) -> dict[str, Any]:
    return {
        "objectStore": {
            "endpoint": s3_store.endpoint,
            "bucket": s3_store.bucket,
            "prefix": f"e2e-{NAME}",
            "credentials": {"secretName": "lake-keys"},
        },
        "image": "headrace-spark:e2e",
        "sparkOperator": "kubeflow",
        "deadlineSeconds": 600,
        "backoffSeconds": 2,
        "maxBackoffSeconds": 4,
        "ttlSeconds": 600,
    }


@dataclasses.dataclass
class OfflineFlush(UpgradeBed):
    s3: S3Store

    async def step(self, action: str) -> dict[str, Any]:
        body = await self.kube.get(API_VERSION, "UpgradePlan", self.ns, PLAN)
        steps = ((body or {}).get("status") or {}).get("plan") or []
        return dict(next((s for s in steps if s["action"] == action), {}))

    def read_options(self) -> ReadOptions:
        store = ObjectStoreOptions(
            endpoint=self.s3.endpoint, access_key=self.s3.access_key, secret_key=self.s3.secret_key
        )
        return ReadOptions(object_store=store)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def bed(e2e: E2E, s3_store: S3Store) -> AsyncIterator[OfflineFlush]:
    admin = e2e.admin()
    try:
        await admin.apply(kubeflow_crd())
        await until(lambda: spark_served(admin, KUBEFLOW_API), "SparkApplication served")
        await s3_secret(admin, e2e.namespace, s3_store)
    finally:
        admin.close()
    async with cluster_for(e2e, SHAPE, flush=flush_section(s3_store)) as kube:
        yield OfflineFlush(e2e, kube, SHAPE, s3_store)


@dataclasses.dataclass
class Inserts:
    acked: list[tuple[float, list[int]]] = dataclasses.field(default_factory=list)
    """(when acknowledged, the keys) per insert."""
    failed: list[str] = dataclasses.field(default_factory=list)

    def keys(self, before: float = float("inf")) -> list[int]:
        return sorted(k for at, keys in self.acked if at < before for k in keys)

    def first_after(self, when: float) -> list[int]:
        """The keys of the first insert acknowledged at or after ``when`` (none: [])."""
        return next((keys for at, keys in self.acked if at >= when), [])


async def insert(client: HeadraceClient, inserts: Inserts, stop: asyncio.Event) -> None:
    producer = client.producer(ProducerOptions(deadline=600.0))
    first = 0
    try:
        while not stop.is_set():
            keys = list(range(first, first + BATCH))
            rows = pa.table(
                {"pk": pa.array(keys, pa.int64()), "name": [f"n{k}" for k in keys]},
                schema=SCHEMA,
            )
            try:
                await producer.insert("items", rows)
                inserts.acked.append((time.monotonic(), keys))
            except errors.HeadraceError as exc:
                inserts.failed.append(str(exc))
            first += BATCH
            await asyncio.sleep(0.05)
    finally:
        await producer.close()


@dataclasses.dataclass
class Watched:
    flush_seen: float = float("inf")
    """When the flush step was first seen Running (writes stopped, drained)."""
    early: list[str] = dataclasses.field(default_factory=list)
    """Pod replacements seen before the flush step was Done."""


async def watch(
    bed: OfflineFlush, before: dict[str, str], seen: Watched, stop: asyncio.Event
) -> None:
    """Record when the flush step is first seen running, and any node pod
    replaced before it is Done, until ``stop``."""
    while not stop.is_set():
        step = await bed.step("flush")
        if step.get("state") == "Running":
            seen.flush_seen = min(seen.flush_seen, time.monotonic())
        uids = await bed.uids()
        if uids != before and step.get("state") != "Done":
            seen.early.append(f"{uids} while the flush step was {step.get('state')}")
        await asyncio.sleep(0.3)


async def test_offline_upgrade_flushes_every_collection_before_the_nodes_stop(
    bed: OfflineFlush,
) -> None:
    e2e = bed.e2e
    await until(bed.settled, f"{NAME} Ready", limit=180)
    before = await bed.uids()
    spark = SparkStandIn(bed.kube, KUBEFLOW_API, bed.ns, e2e.work / "spark-offline")
    inserts, seen, stop = Inserts(), Watched(), asyncio.Event()
    started = time.monotonic()
    async with HeadraceClient(e2e.etcd_url, f"{bed.ns}.{NAME}") as client:
        await client.create_collection("items", SCHEMA, primary_key="pk", shards=2)
        inserting = asyncio.create_task(insert(client, inserts, stop))
        watching = asyncio.create_task(watch(bed, before, seen, stop))
        try:
            await until(lambda: _true(len(inserts.acked) >= 20), "20 inserts acknowledged")
            await bed.kube.apply(upgrade_plan(bed, TARGET, mode="Offline", drainTimeoutSeconds=240))

            async def flush_requested() -> bool:
                plan = await bed.plan()
                return bool((plan.get("status") or {}).get("flush"))

            await until(flush_requested, "the flush requested", limit=240)
            # The runs wait for the Spark operator; the operator process goes
            # away mid-wait, and its successor waits on the same targets.
            assert (await bed.step("flush"))["state"] == "Running"
            code = await asyncio.to_thread(e2e.restart_operator)
            assert code == 0, "the operator stopped cleanly mid-plan"
            spark.start()
            await until(lambda: bed.phase("Succeeded"), "the UpgradePlan Succeeded", limit=900)
            acked_then = len(inserts.acked)
            await until(lambda: _true(len(inserts.acked) >= acked_then + 20), "inserts after it")
        finally:
            stop.set()
            await asyncio.wait_for(inserting, 120)
            await asyncio.wait_for(watching, 30)
            await spark.stop()
        read = await client.read("items", options=bed.read_options())
    print(  # how long the scenario's upgrade took, for docs/upgrade.md
        f"offline upgrade with flush: {len(inserts.acked)} inserts acknowledged, "
        f"{time.monotonic() - started:.0f}s from the first insert to the end"
    )
    assert inserts.failed == [], inserts.failed[:5]
    assert not seen.early, seen.early[:3]
    assert seen.flush_seen < float("inf"), "the watch saw the flush step running"

    done = await bed.plan()
    status = done["status"]
    assert [(s["action"], s["state"]) for s in status["plan"]] == [
        (action, "Done")
        for action in (
            "stop-writes",
            "drain-and-fence",
            "flush",
            "stop-nodes",
            "start-nodes",
            "resume-writes",
        )
    ]
    assert status["flush"]["collections"] == 1 and status["flush"]["done"]
    assert all(t["reached"] for t in status["flush"]["pchannels"]), status["flush"]
    assert condition(done, "WritesStopped")["status"] == "False"
    reasons = await bed.plan_events()
    assert reasons.count("UpgradeFlushRequested") == 1, "the restarted operator did not ask anew"
    assert reasons.count("UpgradeFlushed") == 1
    assert set((await bed.images()).values()) == {TARGET}
    assert {n: u != before[n] for n, u in (await bed.uids()).items()} == dict.fromkeys(before, True)

    flushed, _ = committed(bed.s3, e2e.etcd_url, bed.ns, NAME)
    check_flushed(flushed, inserts, seen.flush_seen)
    keys = sorted(int(k) for k in read.column("pk").to_pylist())
    assert keys == inserts.keys(), "every acknowledged row is read back once, after the upgrade"


def check_flushed(flushed: list[int], inserts: Inserts, stop_seen: float) -> None:
    """The table holds each row once: every row acknowledged before the stop
    was seen, and no other row but those of the one insert in flight then. That
    insert spans both shards: the rows of the shard still taking writes are
    stored (and flushed) before the stop, the others only after the resume, and
    the insert is acknowledged then."""
    assert len(flushed) == len(set(flushed)), "the table holds each row once"
    before_stop = inserts.keys(before=stop_seen)
    assert set(before_stop) <= set(flushed), "a row acknowledged before the stop is missing"
    assert set(flushed) - set(before_stop) <= set(inserts.first_after(stop_seen)), (
        "the table holds rows neither acknowledged before the stop nor of the insert in flight"
    )


async def _true(value: bool) -> bool:
    return value

"""Flush runs as SparkApplications on the real API server (scenario 10).

The Kubeflow SparkApplication CRD is installed and the test bed's stand-in
Spark operator (``e2e/spark_standin.py``) plays its controller, running each
run's main file (``spark_apps/flush.py``) with spark-submit in local mode
against the session's SeaweedFS S3 store. A StreamingCluster with a flush
section gets rows inserted into a collection; the nodes seal them (seal
lifetime 2 s); the operator launches flush runs. The first run is made to
hang in SUBMITTED and the second to fail: both are reported (Events,
``FlushHealthy`` False, ``runsFailed``) and retried, and a later run
completes, moves the checkpoint past the seal and shows in the status.
A second scenario runs the same flush on Apache's ``spark.apache.org/v1`` API.
The Apache scenario also enables compaction: after a second flush, a
compaction run (``spark_apps/compact_pchannel.py``) merges the two flushed
files into one, every row still there.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

import pyarrow as pa
import pytest
from pyiceberg.table import StaticTable

from e2e.conftest import E2E
from e2e.harness import API_VERSION, Kube, cluster_manifest, condition, until
from e2e.spark_standin import APACHE_API, KUBEFLOW_API, SparkStandIn, apache_crd, kubeflow_crd
from headrace.client import HeadraceClient
from headrace.table import CatalogConfig, ObjectStoreOptions, TableCatalog
from headrace.table.storage import Warehouse
from tests.fixtures_s3 import S3Store

pytestmark = [pytest.mark.kube, pytest.mark.slow, pytest.mark.timeout(1200)]

SCHEMA = pa.schema([pa.field("pk", pa.int64(), nullable=False), pa.field("name", pa.string())])
DEADLINE_S = 150


async def _events(kube: Kube, namespace: str, name: str) -> list[str]:
    events = await kube.list("v1", "Event", namespace)
    return [e["reason"] for e in events if e["involvedObject"].get("name") == name]


async def s3_secret(kube: Kube, ns: str, s3_store: S3Store) -> None:
    keys = {"AWS_ACCESS_KEY_ID": s3_store.access_key, "AWS_SECRET_ACCESS_KEY": s3_store.secret_key}
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "lake-keys", "namespace": ns},
        "data": {k: base64.b64encode(v.encode()).decode() for k, v in keys.items()},
    }
    await kube.apply(secret)


async def _flushing_cluster(
    e2e: E2E, kube: Kube, s3_store: S3Store, name: str, **flush: Any
) -> None:
    """A 1-node, 1-pchannel cluster with a flush section, Ready, and 100 rows
    inserted into its collection ``items``."""
    ns = e2e.namespace
    body = cluster_manifest(name, ns, e2e.etcd_endpoint, nodes=1, pchannels=1)
    body["spec"]["flush"] = {
        "objectStore": {
            "endpoint": s3_store.endpoint,
            "bucket": s3_store.bucket,
            "prefix": f"e2e-{name}",
            "credentials": {"secretName": "lake-keys"},
        },
        "image": "headrace-spark:e2e",
        "seal": {"lifetimeSeconds": 2},
        "deadlineSeconds": DEADLINE_S,
        "backoffSeconds": 2,
        "maxBackoffSeconds": 4,
        "ttlSeconds": 600,
        **flush,
    }
    await kube.apply(body)
    await until(lambda: _ready(kube, ns, name), f"{name} Ready", limit=180)
    async with HeadraceClient(e2e.etcd_url, f"{ns}.{name}") as client:
        await client.create_collection("items", SCHEMA, primary_key="pk", shards=1)
    await _insert(e2e, ns, name, range(100))


async def _insert(e2e: E2E, ns: str, name: str, keys: range) -> None:
    async with HeadraceClient(e2e.etcd_url, f"{ns}.{name}") as client:
        producer = client.producer()
        rows = pa.table(
            {"pk": pa.array(keys, pa.int64()), "name": [f"n{i}" for i in keys]},
            schema=SCHEMA,
        )
        await producer.insert("items", rows)
        await producer.close()


async def _true(value: bool) -> bool:
    return value


async def _flushed(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """The cluster's flush status once a run completed."""

    async def completed() -> bool:
        flush = ((await _body(kube, ns, name)).get("status") or {}).get("flush") or {}
        return int(flush.get("runsCompleted", 0)) >= 1

    await until(completed, "a flush run completed", limit=900, every=1.0)
    return dict((await _body(kube, ns, name))["status"]["flush"])


async def test_flush_runs_complete_and_failed_or_hung_runs_are_retried(
    e2e: E2E, s3_store: S3Store
) -> None:
    kube = e2e.admin()
    ns, name = e2e.namespace, f"flow-{uuid.uuid4().hex[:4]}"
    stand_in = SparkStandIn(kube, KUBEFLOW_API, ns, e2e.work / "spark")
    try:
        await kube.apply(kubeflow_crd())
        await until(lambda: spark_served(kube, KUBEFLOW_API), "SparkApplication served", limit=60)
        await s3_secret(kube, ns, s3_store)
        stand_in.inject("hang", "fail")
        stand_in.start()
        await _flushing_cluster(e2e, kube, s3_store, name)
        flush = await _flushed(kube, ns, name)
        assert flush["sparkApi"] == KUBEFLOW_API
        assert flush["runsFailed"] >= 2, flush
        reasons = await _events(kube, ns, name)
        for reason in (
            "SparkRunCreated",
            "SparkRunTimedOut",
            "SparkRunFailed",
            "SparkRunCompleted",
        ):
            assert reason in reasons, reasons
        (run,) = [r for r in flush["runs"] if r["job"] == "flush"]
        assert run["phase"] == "Completed" and run["failures"] == 0
        assert run["run"].startswith(f"{name}-flush-pchannel-000-") and len(run["run"]) <= 63
        assert condition(await _body(kube, ns, name), "FlushHealthy")["status"] == "True"
        # The rows are in the Iceberg table on S3, read back independently.
        assert sorted(_flushed_pks(s3_store, e2e.etcd_url, ns, name)) == list(range(100))
        apps = await kube.list(KUBEFLOW_API, "SparkApplication", ns)
        assert {a["metadata"]["ownerReferences"][0]["name"] for a in apps} == {name}
        states = {a["status"]["applicationState"]["state"] for a in apps}
        assert states <= {"COMPLETED", "FAILED"}, "the hung run was deleted"
    finally:
        await stand_in.stop()
        await kube.delete(API_VERSION, "StreamingCluster", ns, name)
        kube.close()


async def test_flush_runs_on_the_apache_api_when_asked(e2e: E2E, s3_store: S3Store) -> None:
    """``sparkOperator: apache``: the runs are ``spark.apache.org/v1``
    applications (main file in ``pyFiles``, the Secret's keys through
    ``sparkConf``), read through their ``stateTransitionHistory``."""
    kube = e2e.admin()
    ns, name = e2e.namespace, f"apa-{uuid.uuid4().hex[:4]}"
    stand_in = SparkStandIn(kube, APACHE_API, ns, e2e.work / "spark-apache")
    try:
        await kube.apply(apache_crd())
        await until(lambda: spark_served(kube, APACHE_API), "SparkApplication served", limit=60)
        await s3_secret(kube, ns, s3_store)
        stand_in.start()
        compaction = {"enabled": True, "intervalSeconds": 10, "minSmallFiles": 2}
        await _flushing_cluster(
            e2e, kube, s3_store, name, sparkOperator="apache", compaction=compaction
        )
        flush = await _flushed(kube, ns, name)
        assert flush["sparkApi"] == APACHE_API
        assert flush["runsFailed"] == 0
        assert sorted(_flushed_pks(s3_store, e2e.etcd_url, ns, name)) == list(range(100))
        await _insert(e2e, ns, name, range(100, 200))

        def compacted() -> bool:
            pks, files = committed(s3_store, e2e.etcd_url, ns, name)
            return files == 1 and sorted(pks) == list(range(200))

        # The second flush makes a second small file; a compaction run (main
        # file spark_apps/compact_pchannel.py) merges the two into one.
        await until(
            lambda: _true(compacted()), "the two flushed files compacted", limit=600, every=2.0
        )

        async def compaction_recorded() -> bool:
            runs = ((await _body(kube, ns, name))["status"]["flush"]).get("runs", [])
            return any(r["job"] == "compact" and r["phase"] == "Completed" for r in runs)

        await until(compaction_recorded, "a compaction run Completed in the status", limit=120)
        apps = await kube.list(APACHE_API, "SparkApplication", ns)
        done = [
            a
            for a in apps
            if a["status"]["currentState"]["currentStateSummary"] == "ResourceReleased"
        ]
        assert done, apps
        history = [
            h["currentStateSummary"]
            for _, h in sorted(
                done[0]["status"]["stateTransitionHistory"].items(), key=lambda kv: int(kv[0])
            )
        ]
        assert history[0] == "Submitted" and history[-2:] == ["Succeeded", "ResourceReleased"]
    finally:
        await stand_in.stop()
        await kube.delete(API_VERSION, "StreamingCluster", ns, name)
        kube.close()


async def spark_served(kube: Kube, api: str) -> bool:
    listing = await kube.call("GET", f"/apis/{api}")
    return any(r.get("kind") == "SparkApplication" for r in (listing or {}).get("resources", []))


async def _body(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    body = await kube.get(API_VERSION, "StreamingCluster", ns, name)
    assert body is not None
    return dict(body)


async def _ready(kube: Kube, ns: str, name: str) -> bool:
    return condition(await _body(kube, ns, name), "Ready").get("status") == "True"


def committed(s3_store: S3Store, etcd_url: str, ns: str, name: str) -> tuple[list[int], int]:
    """The primary keys of the committed ``items`` table and its data files
    (pyiceberg, not Spark)."""
    options = ObjectStoreOptions(
        endpoint=s3_store.endpoint, access_key=s3_store.access_key, secret_key=s3_store.secret_key
    )
    warehouse = f"s3://{s3_store.bucket}/e2e-{name}"
    with TableCatalog.open(CatalogConfig(etcd_url, warehouse, f"{ns}.{name}", options)) as catalog:
        location = catalog.table("items").metadata_location
    io = Warehouse.parse(warehouse, options).io_properties()
    scan = StaticTable.from_metadata(location, properties=io).scan()
    files = len(list(scan.plan_files()))
    return [int(pk) for pk in scan.to_arrow().column("pk").to_pylist()], files


def _flushed_pks(s3_store: S3Store, etcd_url: str, ns: str, name: str) -> list[int]:
    return committed(s3_store, etcd_url, ns, name)[0]

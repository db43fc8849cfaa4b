"""Test bed of the reconcile steps: the same tests on a fake and a real API server.

``bed`` is parametrized:

* ``fake``: :class:`fake_kube.FakeKube`, a SQLite metastore, and
  :class:`SimKubelet`, which turns every node pod into a simulated streaming
  node (a session in the metastore that follows the assignment protocol) and
  marks the pod Ready;
* ``real``: kube-apiserver + kube-controller-manager + the process-runner
  kubelet of ``tests/fixtures_kube.py``; node pods run the real
  ``headrace node`` on the control plane's etcd (also the cluster metastore).

The coordinator runs in the test process through
:class:`headrace_operator.coordinator_runner.CoordinatorRunners`, as in the
operator; every pass is :func:`headrace_operator.steps.run_pass`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

import headrace
from e2e.spark_standin import crds as spark_crds
from headrace import errors
from headrace.client.flushing import FlushRequested
from headrace.cluster import Assignment, AssignmentState, ClusterConfig, Keys, NodeInfo
from headrace.coordinator import state, writestop
from headrace.message.formats import LEGACY_FORMATS, RELEASE_FORMATS, FormatSupport
from headrace.message.ids import MessageID
from headrace.metastore.contract import Compare, Metastore, Put
from headrace.metastore.factory import open_metastore
from headrace.metastore.sqlite import SqliteMetastore
from headrace.table.collections import CollectionStore
from headrace.table.records import SealRecord, seal_key
from headrace.wal.local.message_id import LocalMessageID
from headrace.wal.registry import load_id_classes
from headrace_operator import builders, crdgen, models, sparkapps
from headrace_operator.builders import ClusterRef
from headrace_operator.coordinator_runner import (
    CoordinatorRunners,
    MetastoreControl,
    Opener,
    runner_config,
    runner_key,
)
from headrace_operator.events import KubeEventSink
from headrace_operator.interfaces import ClusterControl, KubeApi
from headrace_operator.kube import KubernetesApi
from headrace_operator.models import StreamingClusterSpec
from headrace_operator.probe import TcpProbe
from headrace_operator.results import PassResult
from headrace_operator.steps import Pass, run_pass
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.fake_kube import FakeKube

SC = (models.API_VERSION, "StreamingCluster")
BROKEN_SUFFIX = ":broken"
"""The simulated kubelet never makes a pod of such an image Ready."""
PCA = (models.API_VERSION, "PChannelAssignment")
FORMAT_2_IMAGE = "headrace-node:f2"
"""A simulated release that reads and writes message formats 1 and 2 (as this
one does); every other simulated image reads and writes format 1 only (a
release from before record batches), so that fake clusters upgrade as before."""
IMAGE_VERSIONS = {"headrace-node:v2": "0.2.0", "headrace-node:v3": "0.3.0", FORMAT_2_IMAGE: "0.4.0"}
"""The version a simulated node of these images registers; any other image's
registers this tree's ``headrace.__version__``, as every real node of the
process-runner kubelet does (it runs the working tree whatever the image)."""
IMAGE_FORMATS = {FORMAT_2_IMAGE: FormatSupport.of({1, 2}, {1, 2})}
"""The message formats a simulated node of these images advertises; any other
image's, this release's (as every real node of the test bed)."""


def sim_version(image: str) -> str:
    return IMAGE_VERSIONS.get(image, headrace.__version__)


class SimNode:
    """A streaming node as the metastore sees it: a session key under a lease
    and a loop acknowledging ASSIGNING and UNASSIGNING records of this node."""

    def __init__(
        self,
        store: Metastore,
        keys: Keys,
        node_id: str,
        version: str = headrace.__version__,
        formats: FormatSupport = RELEASE_FORMATS,
    ) -> None:
        self.store, self.keys, self.node_id, self.version = store, keys, node_id, version
        self.formats = formats
        self.lease = 0
        self.task: asyncio.Task[None] | None = None
        self.in_flight = 0
        """Appends this node reports in flight while writes are stopped."""
        self._acked: tuple[int, int] | None = None

    async def start(self) -> None:
        self.lease = await self.store.grant_lease(1.0)
        info = NodeInfo(
            node_id=self.node_id,
            address=f"127.0.0.1:{10000 + len(self.node_id)}",
            version=self.version,
            reads=tuple(sorted(self.formats.reads)),
            writes=tuple(sorted(self.formats.writes)),
        )
        await self.store.put(self.keys.node(self.node_id), info.to_json(), lease=self.lease)
        self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        tick = 0
        while True:
            tick += 1
            if tick % 10 == 0:
                with contextlib.suppress(errors.HeadraceError):
                    await self.store.keep_alive(self.lease)
            for kv in await self.store.get_prefix(self.keys.pchannels):
                record = Assignment.model_validate_json(kv.value)
                moving = (AssignmentState.ASSIGNING, AssignmentState.UNASSIGNING)
                if record.node == self.node_id and record.state in moving:
                    done = state.acknowledge(record, time.time())
                    await self.store.txn(
                        [Compare.mod_revision_is(kv.key, kv.mod_revision)],
                        [Put(kv.key, done.to_json())],
                    )
            await self._ack_write_stop()
            await asyncio.sleep(0.025)

    async def _ack_write_stop(self) -> None:
        """Report the write stop as a node does: its revision and appends in flight."""
        stop = await self.store.get(writestop.stop_key(self.keys))
        if stop is None:
            self._acked = None
            return
        want = (stop.mod_revision, self.in_flight)
        if want != self._acked:
            ack = writestop.WriteStopAck(
                node=self.node_id, stop_revision=stop.mod_revision, in_flight=self.in_flight
            )
            key = writestop.ack_key(self.keys, self.node_id)
            await self.store.put(key, ack.to_json(), lease=self.lease)
            self._acked = want

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.store.revoke_lease(self.lease)


class FlushRecorder(MetastoreControl):
    """The control the bed's steps get: it records every flush request in
    ``requests``. On the real bed the request goes to the real nodes; on the
    fake bed (``simulate``) the simulated nodes, which have no WAL, answer it
    the way a node's WAL does: for every pchannel carrying a shard of a live
    collection, a seal at the next position of that pchannel, written under
    its owner's term as the node's ``SealRecord``, is the request's id."""

    def __init__(
        self, control: MetastoreControl, requests: list[FlushRequested], *, simulate: bool
    ) -> None:
        super().__init__(control.metastore, control.keys.cluster, control.runner)
        self.requests = requests
        self.simulate = simulate
        self.refusal = ""
        """When set, every request fails with it (Unavailable), as when no node answers."""

    async def request_flush(self) -> FlushRequested:
        if self.refusal:
            raise errors.Unavailable(self.refusal)
        requested = await (self._simulated() if self.simulate else super().request_flush())
        self.requests.append(requested)
        return requested

    async def _simulated(self) -> FlushRequested:
        load_id_classes()
        config_kv = await self.metastore.get(self.keys.config)
        assert config_kv is not None, "the coordinator stored no cluster config yet"
        config = ClusterConfig.from_json(config_kv.value)
        collections = [
            c for c in await CollectionStore(self.metastore, self.keys).list() if c.dropped is None
        ]
        pchannels = sorted({config.route(v) for c in collections for v in c.vchannels})
        targets: dict[str, MessageID] = {}
        for pchannel in pchannels:
            seal = await self.metastore.get(seal_key(self.keys, pchannel))
            last = (
                0 if seal is None else SealRecord.from_json(seal.value).position_id().sort_key()[0]
            )
            owner_kv = await self.metastore.get(self.keys.pchannel(pchannel))
            assert owner_kv is not None
            owner = Assignment.from_json(owner_kv.value)
            position = LocalMessageID(last + 10)
            record = SealRecord(
                pchannel=pchannel, position=str(position), node=owner.node, term=owner.term
            )
            await self.metastore.put(seal_key(self.keys, pchannel), record.to_json())
            targets[pchannel] = position
        return FlushRequested(tuple(c.name for c in collections), targets)


class SimKubelet:
    """Runs a :class:`SimNode` per node pod of the fake API server."""

    def __init__(self, kube: FakeKube, store: Metastore, namespace: str) -> None:
        self.kube, self.store, self.namespace = kube, store, namespace
        self.nodes: dict[tuple[str, str], SimNode] = {}
        self.broken: set[tuple[str, str]] = set()
        """Pods of an image ending in :data:`BROKEN_SUFFIX`: never Ready."""

    async def sync(self) -> None:
        pods = await self.kube.list("v1", "Pod", self.namespace, {})
        present = set()
        for pod in pods:
            meta = pod["metadata"]
            cluster = meta["labels"][builders.LABEL_CLUSTER]
            key = (meta["uid"], meta["name"])
            present.add(key)
            if key in self.nodes or key in self.broken:
                continue
            image = pod["spec"]["containers"][0]["image"]
            if image.endswith(BROKEN_SUFFIX):
                self.broken.add(key)
                waiting = {"reason": "ImagePullBackOff", "message": "no such image"}
                status = {
                    "phase": "Pending",
                    "conditions": [{"type": "Ready", "status": "False"}],
                    "containerStatuses": [{"name": "node", "state": {"waiting": waiting}}],
                }
                await self.kube.patch_merge(
                    "v1",
                    "Pod",
                    self.namespace,
                    meta["name"],
                    {"status": status},
                    subresource="status",
                )
                continue
            keys = Keys(f"{self.namespace}.{cluster}")
            formats = IMAGE_FORMATS.get(image, LEGACY_FORMATS)
            node = SimNode(self.store, keys, meta["name"], sim_version(image), formats)
            await node.start()
            self.nodes[key] = node
            status = {
                "phase": "Running",
                "podIP": "127.0.0.1",
                "conditions": [{"type": "Ready", "status": "True"}],
            }
            await self.kube.patch_merge(
                "v1", "Pod", self.namespace, meta["name"], {"status": status}, subresource="status"
            )
        for key in set(self.nodes) - present:
            await self.nodes.pop(key).stop()
        self.broken &= present

    async def stop(self) -> None:
        for node in self.nodes.values():
            await node.stop()
        self.nodes.clear()


@dataclasses.dataclass
class Bed:
    kind: str
    kube: KubeApi
    namespace: str
    etcd_endpoint: str
    runners: CoordinatorRunners
    kubelet: SimKubelet | None
    opener: Opener = open_metastore
    image: str = "headrace-node:test"
    passes: int = 0
    flush_requests: list[FlushRequested] = dataclasses.field(default_factory=list)
    """Every flush request the steps made (:class:`FlushRecorder`)."""
    flush_refusal: str = ""
    """Every flush request fails with this (see :class:`FlushRecorder`)."""

    def replica(self, identity: str) -> Bed:
        """The same bed as seen by another operator replica: its own
        coordinator candidates (stop them with ``runners.stop_all()``)."""
        return dataclasses.replace(self, runners=CoordinatorRunners(identity, self.opener))

    @property
    def real(self) -> bool:
        return self.kind == "real"

    def version_of(self, image: str) -> str:
        """The version a node of ``image`` registers on this bed."""
        return headrace.__version__ if self.real else sim_version(image)

    async def connect(self, ref: ClusterRef, spec: StreamingClusterSpec) -> ClusterControl | None:
        """The cluster's coordinator (started as the handlers start it, with
        shorter intervals), once connected (None after 2 s)."""
        config = dataclasses.replace(
            runner_config(ref, spec), retry_s=0.2, relist_interval_s=0.3, balance_interval_s=0.5
        )
        runner = await self.runners.ensure(runner_key(ref), config)
        for _ in range(100):
            if runner.control() is not None:
                break
            await asyncio.sleep(0.02)
        control = runner.control()
        if control is None:
            return None
        recorder = FlushRecorder(control, self.flush_requests, simulate=not self.real)
        recorder.refusal = self.flush_refusal
        return recorder

    async def serve_spark(self) -> None:
        """Serve the SparkApplication APIs (the flush runs' kinds)."""
        if isinstance(self.kube, FakeKube):
            self.kube.served_kinds.add((sparkapps.KUBEFLOW_API, sparkapps.KIND))
            self.kube.served_kinds.add((sparkapps.APACHE_API, sparkapps.KIND))
            return
        for crd in spark_crds():
            await self.kube.apply(crd)
        for _ in range(300):
            if await self.kube.served(sparkapps.KUBEFLOW_API, sparkapps.KIND):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the SparkApplication API is not served")

    def spec(self, **overrides: Any) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodes": 2,
            "pchannels": 4,
            "image": self.image,
            "version": "0.1.0",
            "metastore": {"etcdEndpoints": [self.etcd_endpoint]},
            "wal": {"backend": "local", "local": {"size": "1Gi"}},
            "leaseTTLSeconds": 1,
        }
        spec.update(overrides)
        return spec

    async def create_cluster(self, name: str, **overrides: Any) -> dict[str, Any]:
        body = {
            "apiVersion": models.API_VERSION,
            "kind": "StreamingCluster",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": self.spec(**overrides),
        }
        return await self.kube.apply(body)

    async def cluster(self, name: str) -> dict[str, Any]:
        body = await self.kube.get(*SC, self.namespace, name)
        assert body is not None, f"StreamingCluster {name} is gone"
        return body

    async def patch_cluster(self, name: str, patch: Mapping[str, Any]) -> None:
        await self.kube.patch_merge(*SC, self.namespace, name, patch)

    async def reconcile(self, name: str) -> PassResult:
        kube = self.kube
        p = Pass(
            body=await self.cluster(name),
            kube=kube,
            events=KubeEventSink(kube, "test"),
            probe=TcpProbe(timeout=1.0),
            connect=self.connect,
            now=datetime.datetime.now(datetime.UTC),
        )
        result = await run_pass(p)
        self.passes += 1
        if self.kubelet is not None:
            await self.kubelet.sync()
        return result

    async def converge(
        self,
        name: str,
        done: Callable[[dict[str, Any]], bool],
        timeout: float = 30.0,
        what: str = "the awaited state",
    ) -> dict[str, Any]:
        """Run passes until ``done(cluster)`` holds (checked after each pass)."""
        deadline = time.monotonic() + (timeout * 4 if self.real else timeout)
        while True:
            await self.reconcile(name)
            body = await self.cluster(name)
            if done(body):
                return body
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not reach {what}; status={body.get('status')}")
            await asyncio.sleep(0.3 if self.real else 0.05)

    async def until(
        self,
        name: str,
        check: Callable[[], Awaitable[bool]],
        timeout: float = 30.0,
        what: str = "the awaited state",
    ) -> None:
        """Run passes until ``await check()`` holds (checked after each pass)."""
        deadline = time.monotonic() + (timeout * 4 if self.real else timeout)
        while True:
            await self.reconcile(name)
            if await check():
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"{name} did not reach {what}")
            await asyncio.sleep(0.3 if self.real else 0.05)

    async def pods(self, cluster: str) -> dict[str, dict[str, Any]]:
        labels = builders.selector_labels(cluster)
        return {
            p["metadata"]["name"]: p
            for p in await self.kube.list("v1", "Pod", self.namespace, labels)
            if not p["metadata"].get("deletionTimestamp")
        }

    async def event_reasons(self) -> list[str]:
        events = await self.kube.list("v1", "Event", self.namespace, {})
        ordered = sorted(events, key=lambda e: (e.get("eventTime") or "", e["metadata"]["name"]))
        return [
            e["reason"]
            for e in ordered
            if e.get("source", {}).get("component") == "headrace-operator"
        ]

    async def control(self, cluster: str) -> ClusterControl:
        runner = self.runners.get(f"{self.namespace}/{cluster}")
        assert runner is not None and runner.control() is not None
        control = runner.control()
        assert control is not None
        return control


def condition(body: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    for item in (body.get("status") or {}).get("conditions") or []:
        if item["type"] == kind:
            return dict(item)
    return {}


def is_ready(body: Mapping[str, Any]) -> bool:
    return condition(body, "Ready").get("status") == "True"


@contextlib.asynccontextmanager
async def tcp_listener() -> AsyncIterator[str]:
    """A loopback port that accepts connections (stands for etcd in the fake bed)."""

    async def handle(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.close()
        await server.wait_closed()


async def install_crds(kube: KubernetesApi) -> None:
    for kind in models.KINDS:
        await kube.apply(crdgen.crd(kind))
    for kind in models.KINDS:
        for _ in range(200):
            crd = await kube.get(
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                "",
                f"{crdgen.plural(kind)}.{models.GROUP}",
            )
            established = [
                c
                for c in ((crd or {}).get("status") or {}).get("conditions") or []
                if c["type"] == "Established" and c["status"] == "True"
            ]
            if established:
                break
            await asyncio.sleep(0.05)


async def _fake_bed(tmp_path: Path) -> AsyncIterator[Bed]:
    path = tmp_path / "meta.db"
    store = await SqliteMetastore.open(str(path), reap_interval=0.05, busy_timeout=30.0)

    async def opener(_url: str) -> Metastore:
        return await SqliteMetastore.open(str(path), reap_interval=0.05, busy_timeout=30.0)

    kube = FakeKube()
    runners = CoordinatorRunners("test-operator", opener=opener)
    kubelet = SimKubelet(kube, store, "ns")
    try:
        async with tcp_listener() as endpoint:
            yield Bed("fake", kube, "ns", endpoint, runners, kubelet, opener)
    finally:
        await runners.stop_all()
        await kubelet.stop()
        await store.close()


async def _real_bed(testbed: KubeTestbed) -> AsyncIterator[Bed]:
    kube = KubernetesApi(testbed.api_client())
    await install_crds(kube)
    namespace = f"op-{uuid.uuid4().hex[:8]}"
    await kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for _ in range(200):
        if await kube.get("v1", "ServiceAccount", namespace, "default") is not None:
            break
        await asyncio.sleep(0.05)
    runners = CoordinatorRunners("test-operator")
    try:
        yield Bed("real", kube, namespace, testbed.cluster.etcd.endpoint, runners, None)
    finally:
        await runners.stop_all()
        await kube.delete("v1", "Namespace", "", namespace)
        kube.close()


@pytest.fixture(params=["fake", pytest.param("real", marks=pytest.mark.kube)])
async def bed(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Bed]:
    if request.param == "fake":
        async for item in _fake_bed(tmp_path):
            yield item
    else:
        testbed: KubeTestbed = request.getfixturevalue("kube_cluster")
        async for item in _real_bed(testbed):
            yield item

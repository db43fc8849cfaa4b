"""Thin kopf handlers: each one runs a reconcile pass of a StreamingCluster.

Level-based: every handler (create, update, resume, the per-cluster timer, and
changes of a PChannelAssignment's ``spec.pinnedNode``) re-reads the cluster
and runs the same ordered steps (:func:`.steps.run_pass`); nothing depends on
which event fired. Passes of one cluster are serialised by a lock (kopf runs
timers and change handlers concurrently).

The coordinator of each cluster runs in this process
(:mod:`.coordinator_runner`), independently of the passes: the handlers start
it whenever the operator learns of the cluster (resume after a restart, create,
update, every resync), before the pass and whatever the pass decides, so a
paused cluster keeps its assignment and failover. Deleting the cluster stops
it. Every operator replica runs a candidate; the metastore elects one, and the
replica whose coordinator leads is the one whose passes change the cluster's
objects (the others stand by, see :func:`.steps.standby_reason`).

The resync interval is read from ``HEADRACE_RESYNC_SECONDS`` when this module is
imported (kopf fixes timer intervals at registration); :mod:`.main` sets it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import os
import socket
import time
from collections.abc import Coroutine, Mapping
from typing import Any

import kopf

from headrace import errors
from headrace.metrics import MetricsServer
from headrace.metrics import serve as serve_metrics
from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef
from headrace_operator.coordinator_runner import (
    CoordinatorRunners,
    cluster_key,
    runner_config,
    runner_key,
)
from headrace_operator.errors import InvalidSpec
from headrace_operator.events import KubeEventSink
from headrace_operator.interfaces import ClusterControl, KubeApi
from headrace_operator.kube import KubernetesApi, load_configuration
from headrace_operator.metrics import OperatorMetrics
from headrace_operator.models import StreamingClusterSpec
from headrace_operator.probe import TcpProbe
from headrace_operator.results import PassResult
from headrace_operator.steps import Pass, cluster_ref, run_pass
from headrace_operator.upgrade_steps import UpgradePass, run_upgrade_pass

log = logging.getLogger(__name__)

RESYNC_S = float(os.environ.get("HEADRACE_RESYNC_SECONDS", "10"))
RETRY_S = min(RESYNC_S, 5.0)
"""Delay of the next pass after a retryable failure."""
ANNOTATION_PREFIX = f"operator.{models.GROUP}"
CLUSTERS = (models.GROUP, models.VERSION, "streamingclusters")
ASSIGNMENTS = (models.GROUP, models.VERSION, "pchannelassignments")
PLANS = (models.GROUP, models.VERSION, "upgradeplans")


def identity() -> str:
    """This operator replica's name (the pod name in a cluster)."""
    return os.environ.get("POD_NAME") or socket.gethostname()


@dataclasses.dataclass
class Runtime:
    """Process-wide state of the operator, kept in kopf's memo."""

    kube: KubeApi
    runners: CoordinatorRunners
    probe: TcpProbe
    events: KubeEventSink
    locks: dict[str, asyncio.Lock] = dataclasses.field(default_factory=dict)

    def lock(self, key: str) -> asyncio.Lock:
        return self.locks.setdefault(key, asyncio.Lock())

    async def start_coordinator(self, body: Mapping[str, Any]) -> None:
        """Start the cluster's coordinator, or keep it running (restarted
        when the spec changes its settings). Not a reconcile step: the pause
        annotation holds the cluster's Kubernetes objects, not its coordinator."""
        try:
            spec = models.parse_cluster_spec(body.get("spec") or {})
        except InvalidSpec:
            return  # nothing to connect to; the pass reports the spec
        ref = cluster_ref(body)
        await self.runners.ensure(runner_key(ref), runner_config(ref, spec))

    async def connect(self, ref: ClusterRef, _spec: StreamingClusterSpec) -> ClusterControl | None:
        """The running coordinator's metastore connection (None until connected)."""
        runner = self.runners.get(runner_key(ref))
        return None if runner is None else runner.control()


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings: state in our own annotations and finalizer, no event
    posting of handler logs (the operator posts its own Events), standalone:
    no kopf peering, which would freeze every replica but one and with it the
    standby coordinators (each replica runs a coordinator candidate; the
    metastore elects the leader, and only the leading replica's passes write,
    see :func:`.steps.standby_reason`), and no CRD/namespace scanning (the CRDs are
    installed before the operator starts; this keeps the RBAC minimal)."""
    settings.persistence.finalizer = f"{models.GROUP}/operator"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
        prefix=ANNOTATION_PREFIX
    )
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "headrace-operator"
    settings.posting.reporting_instance = identity()
    settings.peering.standalone = True
    settings.scanning.disabled = True
    settings.watching.server_timeout = 300


@kopf.on.login()
def login(*, memo: Any, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """Credentials of an explicit ``--kubeconfig``; otherwise kopf's usual
    in-cluster / ``$KUBECONFIG`` discovery."""
    kubeconfig = memo.get("kubeconfig")
    if not kubeconfig:
        return kopf.login_via_client(**kwargs)
    cfg = load_configuration(kubeconfig)
    token = str((cfg.api_key or {}).get("BearerToken") or "").removeprefix("Bearer ").strip()
    return kopf.ConnectionInfo(
        server=cfg.host,
        ca_path=cfg.ssl_ca_cert,
        insecure=not cfg.verify_ssl,
        certificate_path=cfg.cert_file,
        private_key_path=cfg.key_file,
        token=token or None,
    )


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    configure(settings)
    kube = KubernetesApi.from_kubeconfig(memo.get("kubeconfig"))
    memo["runtime"] = Runtime(
        kube=kube,
        runners=CoordinatorRunners(identity()),
        probe=TcpProbe(),
        events=KubeEventSink(kube, identity()),
    )

    memo["metrics"] = metrics = OperatorMetrics()
    listen = memo.get("metrics_listen")
    if listen:
        memo["metrics_server"] = serve_metrics(metrics.registry, str(listen))
        log.info("operator metrics at http://%s/metrics", memo["metrics_server"].address)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    server: MetricsServer | None = memo.get("metrics_server")
    if server is not None:
        server.close()
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        await runtime.runners.stop_all()
        if isinstance(runtime.kube, KubernetesApi):
            runtime.kube.close()


async def measured(
    memo: kopf.Memo, kind: str, work: Coroutine[Any, Any, PassResult | None]
) -> PassResult | None:
    """``work`` (a pass of ``kind``), counted and timed in the operator's metrics."""
    metrics: OperatorMetrics | None = memo.get("metrics")
    started = time.monotonic()
    try:
        result = await work
    except kopf.TemporaryError:
        if metrics is not None:
            metrics.failed(kind, retryable=True, seconds=time.monotonic() - started)
        raise
    except kopf.PermanentError:
        if metrics is not None:
            metrics.failed(kind, retryable=False, seconds=time.monotonic() - started)
        raise
    if metrics is not None:
        metrics.observed(kind, result, time.monotonic() - started)
    return result


async def reconcile(memo: kopf.Memo, namespace: str, name: str) -> PassResult | None:
    """One pass for the cluster ``namespace/name`` (re-read from the API);
    None when the cluster is gone or going."""
    return await measured(memo, "StreamingCluster", _reconcile(memo, namespace, name))


async def _reconcile(memo: kopf.Memo, namespace: str, name: str) -> PassResult | None:
    runtime: Runtime = memo["runtime"]
    async with runtime.lock(cluster_key(namespace, name)):
        try:
            body = await runtime.kube.get(models.API_VERSION, "StreamingCluster", namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return None
            await runtime.start_coordinator(body)
            p = Pass(
                body=body,
                kube=runtime.kube,
                events=runtime.events,
                probe=runtime.probe,
                connect=runtime.connect,
                now=datetime.datetime.now(datetime.UTC),
            )
            return await run_pass(p)
        except errors.HeadraceError as exc:
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=RETRY_S) from None
            raise kopf.PermanentError(str(exc)) from None


def retry_soon(result: PassResult | None) -> None:
    """Have kopf run the handler again after :data:`RETRY_S` instead of the
    next resync when the pass's deciding result is a retryable failure."""
    if result is not None and result.retry_reason:
        raise kopf.TemporaryError(result.retry_reason, delay=RETRY_S)


@kopf.on.resume(*CLUSTERS)
@kopf.on.create(*CLUSTERS)
@kopf.on.update(*CLUSTERS)
async def cluster_changed(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    retry_soon(await reconcile(memo, namespace or "", name))


@kopf.timer(*CLUSTERS, interval=RESYNC_S, initial_delay=1.0)
async def cluster_resync(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    retry_soon(await reconcile(memo, namespace or "", name))


@kopf.on.event(
    "",
    "v1",
    "pods",
    labels={builders.LABEL_COMPONENT: "streaming-node", builders.LABEL_CLUSTER: kopf.PRESENT},
)
async def node_pod_event(
    *, memo: Any, namespace: str | None, labels: kopf.Labels, **_: Any
) -> None:
    """A node pod changed (started, became Ready, died): reconcile its cluster now
    instead of at the next timer pass, so status and restarts follow at once."""
    await reconcile(memo, namespace or "", str(labels[builders.LABEL_CLUSTER]))


@kopf.on.delete(*CLUSTERS)
async def cluster_deleted(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    """Stop the cluster's coordinator; owned objects go by garbage collection
    (the shared WAL volume only with ``deleteDataOnDelete``, see
    :func:`.builders.pvc`)."""
    runtime: Runtime = memo["runtime"]
    key = cluster_key(namespace or "", name)
    async with runtime.lock(key):
        await runtime.runners.stop(key)


@kopf.on.update(*ASSIGNMENTS, field="spec.pinnedNode")
async def pin_changed(*, memo: Any, namespace: str | None, spec: kopf.Spec, **_: Any) -> None:
    cluster = spec.get("cluster")
    if cluster:
        await reconcile(memo, namespace or "", str(cluster))


async def upgrade(memo: kopf.Memo, namespace: str, name: str) -> PassResult | None:
    """One pass of the UpgradePlan ``namespace/name`` (re-read from the API),
    under its cluster's lock so it never interleaves with the cluster's pass;
    then a pass of the cluster, which carries out what the plan decided.
    None when the plan is gone."""
    runtime: Runtime = memo["runtime"]
    body = await runtime.kube.get(models.API_VERSION, "UpgradePlan", namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    cluster = str(((body.get("spec") or {}).get("clusterRef") or {}).get("name", ""))
    result = await measured(memo, "UpgradePlan", _upgrade_pass(runtime, body, cluster))
    if cluster:
        await reconcile(memo, namespace, cluster)
    return result


async def _upgrade_pass(runtime: Runtime, body: Mapping[str, Any], cluster: str) -> PassResult:
    namespace = str(body["metadata"].get("namespace", ""))
    try:
        async with runtime.lock(cluster_key(namespace, cluster)):
            cluster_body = await runtime.kube.get(
                models.API_VERSION, "StreamingCluster", namespace, cluster
            )
            if cluster_body is not None:
                await runtime.start_coordinator(cluster_body)
            p = UpgradePass(
                body=body,
                kube=runtime.kube,
                events=runtime.events,
                connect=runtime.connect,
                now=datetime.datetime.now(datetime.UTC),
            )
            return await run_upgrade_pass(p)
    except errors.HeadraceError as exc:
        if exc.retryable:
            raise kopf.TemporaryError(str(exc), delay=RETRY_S) from None
        raise kopf.PermanentError(str(exc)) from None


@kopf.on.resume(*PLANS)
@kopf.on.create(*PLANS)
@kopf.on.update(*PLANS, field="spec")
async def plan_changed(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    retry_soon(await upgrade(memo, namespace or "", name))


@kopf.timer(*PLANS, interval=min(RESYNC_S, 5.0), initial_delay=1.0)
async def plan_resync(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    retry_soon(await upgrade(memo, namespace or "", name))

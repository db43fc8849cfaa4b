"""Thin kopf handlers: each one runs a reconcile pass of a StreamingCluster.

Level-based: every handler (create, update, resume, the per-cluster timer, and
changes of a PChannelAssignment's ``spec.pinnedNode``) re-reads the cluster
and runs the same ordered steps (:func:`.steps.run_pass`); nothing depends on
which event fired. Passes of one cluster are serialised by a lock (kopf runs
timers and change handlers concurrently). The coordinator of each cluster runs
in this process (:mod:`.coordinator_runner`); deleting the cluster stops it.

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
from typing import Any

import kopf

from headrace import errors
from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef
from headrace_operator.coordinator_runner import CoordinatorRunners, RunnerConfig
from headrace_operator.events import KubeEventSink
from headrace_operator.interfaces import ClusterControl, KubeApi
from headrace_operator.kube import KubernetesApi, load_configuration
from headrace_operator.models import StreamingClusterSpec
from headrace_operator.probe import TcpProbe
from headrace_operator.steps import Pass, run_pass

log = logging.getLogger(__name__)

RESYNC_S = float(os.environ.get("HEADRACE_RESYNC_SECONDS", "10"))
ANNOTATION_PREFIX = f"operator.{models.GROUP}"
CLUSTERS = (models.GROUP, models.VERSION, "streamingclusters")
ASSIGNMENTS = (models.GROUP, models.VERSION, "pchannelassignments")


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

    async def connect(self, ref: ClusterRef, spec: StreamingClusterSpec) -> ClusterControl | None:
        config = RunnerConfig(
            metastore_url=spec.metastore.url(),
            cluster=ref.metastore_cluster,
            pchannels=tuple(spec.pchannel_names),
            wal_backend=spec.wal.backend,
            lease_ttl_s=float(spec.lease_ttl_seconds),
        )
        runner = await self.runners.ensure(f"{ref.namespace}/{ref.name}", config)
        return runner.control()


def configure(settings: kopf.OperatorSettings) -> None:
    """kopf settings: state in our own annotations and finalizer, no event
    posting of handler logs (the operator posts its own Events), standalone
    (two replicas are safe: steps are idempotent and the coordinators elect a
    leader through the metastore), and no CRD/namespace scanning (the CRDs are
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


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    runtime: Runtime | None = memo.get("runtime")
    if runtime is not None:
        await runtime.runners.stop_all()
        if isinstance(runtime.kube, KubernetesApi):
            runtime.kube.close()


async def reconcile(memo: kopf.Memo, namespace: str, name: str) -> None:
    """One pass for the cluster ``namespace/name`` (re-read from the API)."""
    runtime: Runtime = memo["runtime"]
    async with runtime.lock(f"{namespace}/{name}"):
        try:
            body = await runtime.kube.get(models.API_VERSION, "StreamingCluster", namespace, name)
            if body is None or body["metadata"].get("deletionTimestamp"):
                return
            p = Pass(
                body=body,
                kube=runtime.kube,
                events=runtime.events,
                probe=runtime.probe,
                connect=runtime.connect,
                now=datetime.datetime.now(datetime.UTC),
            )
            await run_pass(p)
        except errors.HeadraceError as exc:
            if exc.retryable:
                raise kopf.TemporaryError(str(exc), delay=min(RESYNC_S, 5.0)) from None
            raise kopf.PermanentError(str(exc)) from None


@kopf.on.resume(*CLUSTERS)
@kopf.on.create(*CLUSTERS)
@kopf.on.update(*CLUSTERS)
async def cluster_changed(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    await reconcile(memo, namespace or "", name)


@kopf.timer(*CLUSTERS, interval=RESYNC_S, initial_delay=1.0)
async def cluster_resync(*, memo: Any, namespace: str | None, name: str, **_: Any) -> None:
    await reconcile(memo, namespace or "", name)


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
    key = f"{namespace or ''}/{name}"
    async with runtime.lock(key):
        await runtime.runners.stop(key)


@kopf.on.update(*ASSIGNMENTS, field="spec.pinnedNode")
async def pin_changed(*, memo: Any, namespace: str | None, spec: kopf.Spec, **_: Any) -> None:
    cluster = spec.get("cluster")
    if cluster:
        await reconcile(memo, namespace or "", str(cluster))

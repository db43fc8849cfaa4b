"""Desired Kubernetes objects of a StreamingCluster, as pure functions.

Every function here takes the cluster's identity and its parsed spec and returns
plain dicts ready for server-side apply; nothing here does I/O or imports kopf
or kubernetes (an import-linter contract keeps it so).

Workload: operator-owned Pods, one per node id (``<cluster>-node-<i>``). A StatefulSet with
``updateStrategy: OnDelete`` would also let the operator pick the moment a pod
goes, but its controller still owns pod creation and scale-down: lowering
``replicas`` deletes the highest pod at once, before its pchannels are drained,
and a pod deleted by anyone comes straight back with the old template. Owning
the pods directly makes the order "drain the node's pchannels through the
coordinator, wait until it holds none, then delete the pod" the only path, for
scale-down and restarts alike, and lets a node that is still draining stay up
while its replacement ordinal is unaffected.

Local WAL storage: ONE PersistentVolumeClaim per cluster (``<cluster>-wal``,
``ReadWriteMany``), mounted by every node pod at :data:`WAL_MOUNT`. The local
backend keeps one directory per pchannel, written by whichever node owns the
pchannel and fenced by its TERM file and segment chain, so it is safe for
several processes to share. Pchannels move between nodes (failover, drain,
rebalance, pin); with a volume per pod the new owner would open an empty WAL
and acknowledged messages would be lost to consumers. The storage class must
therefore support ReadWriteMany (NFS, CephFS, EFS, ...). Scale-down leaves
the shared volume alone; it goes with the cluster only under
``deleteDataOnDelete``. Kafka and Pulsar keep the WAL in the broker and need
no volume.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import Any

from headrace_operator import models
from headrace_operator.errors import InvalidSpec
from headrace_operator.models import StreamingClusterSpec

GRPC_PORT = 19530
METRICS_PORT = 9400
"""Prometheus endpoint of each node pod (``/metrics``), apart from gRPC."""
HEALTH_PORT = 19531
"""Plaintext gRPC health of a node whose main port speaks TLS (kubelet's gRPC
probes cannot do TLS)."""
NODE_TLS_MOUNT = "/etc/headrace/tls"
IDENTITIES_MOUNT = "/etc/headrace/identities"
"""Prometheus endpoint of each node pod (``/metrics``), apart from gRPC."""
WAL_MOUNT = "/var/lib/headrace/wal"
KAFKA_TLS_MOUNT = "/etc/headrace/kafka-tls"
TMP_MOUNT = "/tmp"
"""An emptyDir of the pod's own (the root filesystem is read-only)."""
NODE_UID = 10001
STOP_GRACE_S = 30
"""Seconds a node has to stop after its preStop drain (on top of the drain's timeout)."""
FIELD_MANAGER = "headrace-operator"

LABEL_NAME = "app.kubernetes.io/name"
LABEL_INSTANCE = "app.kubernetes.io/instance"
LABEL_COMPONENT = "app.kubernetes.io/component"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_CLUSTER = f"{models.GROUP}/cluster"
LABEL_ORDINAL = f"{models.GROUP}/node-ordinal"
LABEL_PCHANNEL = f"{models.GROUP}/pchannel"
TEMPLATE_HASH = f"{models.GROUP}/template-hash"
DRAINING = f"{models.GROUP}/draining"
"""Pod annotation: the operator is draining this node (value: why)."""
NODE_IMAGES = f"{models.GROUP}/node-images"
"""Annotation on a StreamingCluster, written by its UpgradePlan: a JSON object
node name -> the image that node runs instead of ``spec.image``."""
MAX_UNAVAILABLE = f"{models.GROUP}/max-unavailable"
"""Annotation on a StreamingCluster, written by its UpgradePlan with
NODE_IMAGES: how many node pods its pass may restart at once (default 1)."""
OFFLINE_UPGRADE = f"{models.GROUP}/offline-upgrade"
"""Annotation on a StreamingCluster, written by an Offline UpgradePlan (its
name) once it stopped writes: the cluster's pass then stops every node whose
template changed at once, without a drain, and unfreezes none (the plan does)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterRef:
    """Identity of a StreamingCluster object."""

    name: str
    namespace: str
    uid: str
    generation: int = 0

    @property
    def metastore_cluster(self) -> str:
        """The cluster name in the metastore (``/headrace/<this>/...``)."""
        return f"{self.namespace}.{self.name}"

    def owner_reference(self) -> dict[str, Any]:
        return {
            "apiVersion": models.API_VERSION,
            "kind": "StreamingCluster",
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def _node_prefix(cluster: str) -> str:
    return f"{cluster}-node-"


def node_name(cluster: str, ordinal: int) -> str:
    """Pod name and node id of ordinal ``ordinal``."""
    return f"{_node_prefix(cluster)}{ordinal}"


def pvc_name(cluster: str) -> str:
    """The cluster's shared local-WAL volume claim."""
    return f"{cluster}-wal"


def config_map_name(cluster: str) -> str:
    return f"{cluster}-config"


def headless_service_name(cluster: str) -> str:
    return f"{cluster}-nodes"


def disruption_budget_name(cluster: str) -> str:
    return f"{cluster}-nodes"


def client_service_name(cluster: str) -> str:
    return cluster


def node_account_name(cluster: str) -> str:
    return f"{cluster}-node"


def assignment_name(cluster: str, pchannel: str) -> str:
    return f"{cluster}-{pchannel}"


def ordinal_of(cluster: str, pod_name: str) -> int | None:
    """The ordinal of a node pod name, None for other names."""
    prefix = _node_prefix(cluster)
    rest = pod_name[len(prefix) :]
    if not pod_name.startswith(prefix) or not rest.isdigit() or str(int(rest)) != rest:
        return None
    return int(rest)


def selector_labels(cluster: str) -> dict[str, str]:
    return {LABEL_CLUSTER: cluster, LABEL_COMPONENT: "streaming-node"}


def selector(cluster: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(cluster).items()))


def _labels(cluster: str, component: str) -> dict[str, str]:
    return {
        LABEL_NAME: "headrace",
        LABEL_INSTANCE: cluster,
        LABEL_COMPONENT: component,
        LABEL_MANAGED_BY: FIELD_MANAGER,
        LABEL_CLUSTER: cluster,
    }


def _meta(
    ref: ClusterRef, name: str, component: str, *, owned: bool = True, **extra: Any
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": ref.namespace,
        "labels": _labels(ref.name, component),
    }
    if owned:
        meta["ownerReferences"] = [ref.owner_reference()]
    meta.update(extra)
    return meta


def config_data(ref: ClusterRef, spec: StreamingClusterSpec) -> dict[str, str]:
    """Settings every node reads from the ConfigMap (as environment)."""
    data = {
        "HEADRACE_METASTORE": spec.metastore.url(),
        "HEADRACE_CLUSTER": ref.metastore_cluster,
        "HEADRACE_WAL": spec.wal.backend,
        "HEADRACE_LEASE_TTL": str(spec.lease_ttl_seconds),
        "HEADRACE_PCHANNELS": ",".join(spec.pchannel_names),
        "HEADRACE_VERSION": spec.version,
    }
    if spec.wal.kafka is not None:
        data["HEADRACE_KAFKA_BOOTSTRAP"] = ",".join(spec.wal.kafka.bootstrap_servers)
        if spec.wal.kafka.sasl is not None:
            data["HEADRACE_KAFKA_SASL_MECHANISM"] = spec.wal.kafka.sasl.mechanism
    if spec.wal.pulsar is not None:
        data["HEADRACE_PULSAR_URL"] = spec.wal.pulsar.service_url
    return data


def config_map(ref: ClusterRef, spec: StreamingClusterSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _meta(ref, config_map_name(ref.name), "config"),
        "data": config_data(ref, spec),
    }


def _service(ref: ClusterRef, name: str, *, headless: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "selector": selector_labels(ref.name),
        "ports": [{"name": "grpc", "port": GRPC_PORT, "targetPort": "grpc", "protocol": "TCP"}],
    }
    if headless:
        spec["clusterIP"] = "None"
        spec["publishNotReadyAddresses"] = True
    else:
        spec["type"] = "ClusterIP"
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _meta(ref, name, "streaming-node"),
        "spec": spec,
    }


def headless_service(ref: ClusterRef) -> dict[str, Any]:
    """Stable DNS per node pod (``<pod>.<cluster>-nodes``)."""
    return _service(ref, headless_service_name(ref.name), headless=True)


def client_service(ref: ClusterRef) -> dict[str, Any]:
    return _service(ref, client_service_name(ref.name), headless=False)


def service_account(ref: ClusterRef) -> dict[str, Any]:
    """The nodes' identity. Nodes do not call the Kubernetes API, so no token
    is mounted into their pods."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _meta(ref, node_account_name(ref.name), "streaming-node"),
        "automountServiceAccountToken": False,
    }


def node_role(ref: ClusterRef) -> dict[str, Any]:
    """Least privilege: read the cluster's own ConfigMap, nothing else."""
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _meta(ref, node_account_name(ref.name), "streaming-node"),
        "rules": [
            {
                "apiGroups": [""],
                "resources": ["configmaps"],
                "resourceNames": [config_map_name(ref.name)],
                "verbs": ["get"],
            }
        ],
    }


def node_role_binding(ref: ClusterRef) -> dict[str, Any]:
    name = node_account_name(ref.name)
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _meta(ref, name, "streaming-node"),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ref.namespace}],
    }


def pvc(ref: ClusterRef, spec: StreamingClusterSpec) -> dict[str, Any]:
    """The local-WAL volume every node pod mounts (``ReadWriteMany``: a
    pchannel's directory follows the pchannel from node to node). Owned by the
    cluster (so deleted with it) only when ``deleteDataOnDelete`` is set;
    otherwise it outlives the cluster."""
    local = spec.wal.local_or_default
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": local.size}},
    }
    if local.storage_class_name:
        claim["storageClassName"] = local.storage_class_name
    meta = _meta(ref, pvc_name(ref.name), "wal", owned=spec.delete_data_on_delete)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta, "spec": claim}


def _env(spec: StreamingClusterSpec) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    kafka = spec.wal.kafka
    if kafka is not None and kafka.sasl is not None:
        for key in ("username", "password"):
            env.append(
                {
                    "name": f"HEADRACE_KAFKA_SASL_{key.upper()}",
                    "valueFrom": {"secretKeyRef": {"name": kafka.sasl.secret_name, "key": key}},
                }
            )
    pulsar = spec.wal.pulsar
    if pulsar is not None and pulsar.auth_secret_ref is not None:
        ref = pulsar.auth_secret_ref
        env.append(
            {
                "name": "HEADRACE_PULSAR_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}},
            }
        )
    return env


def node_args(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> list[str]:
    """The ``headrace node`` command line; ``$(VAR)`` expands from the env."""
    args = [
        "--node-id",
        node_name(ref.name, ordinal),
        "--metastore",
        "$(HEADRACE_METASTORE)",
        "--cluster",
        "$(HEADRACE_CLUSTER)",
        "--listen",
        f"$(POD_IP):{GRPC_PORT}",
        "--metrics-listen",
        f"$(POD_IP):{METRICS_PORT}",
        "--wal",
        spec.wal.backend,
        "--lease-ttl",
        "$(HEADRACE_LEASE_TTL)",
    ]
    if spec.wal.backend == "local":
        args += ["--wal-dir", WAL_MOUNT]
    elif spec.wal.backend == "kafka":
        args += ["--kafka-bootstrap", "$(HEADRACE_KAFKA_BOOTSTRAP)"]
        args += _kafka_tls_args(spec)
    else:
        args += ["--pulsar-url", "$(HEADRACE_PULSAR_URL)"]
    seal = spec.flush.seal if spec.flush is not None else None
    if seal is not None and seal.lifetime_seconds is not None:
        args += ["--segment-lifetime-s", str(seal.lifetime_seconds)]
    return args + _node_tls_args(spec)


def _node_tls_args(spec: StreamingClusterSpec) -> list[str]:
    """Flags of the node's own TLS from its mounted Secrets (none without TLS)."""
    tls = spec.tls
    if tls is None:
        return []
    args = [
        "--tls-cert",
        f"{NODE_TLS_MOUNT}/tls.crt",
        "--tls-key",
        f"{NODE_TLS_MOUNT}/tls.key",
        "--health-listen",
        f"$(POD_IP):{HEALTH_PORT}",
    ]
    if tls.require_client_certificates:
        args += ["--tls-client-ca", f"{NODE_TLS_MOUNT}/ca.crt"]
    if tls.identities_secret_name is not None:
        args += ["--auth-file", f"{IDENTITIES_MOUNT}/identities.json"]
    return args


def _kafka_tls_args(spec: StreamingClusterSpec) -> list[str]:
    """Flags naming the files of the mounted Kafka TLS secret (none without TLS)."""
    tls = spec.wal.kafka.tls if spec.wal.kafka is not None else None
    if tls is None:
        return []
    args = ["--kafka-ssl-ca", f"{KAFKA_TLS_MOUNT}/ca.crt"]
    if tls.client_auth:
        args += [
            "--kafka-ssl-cert",
            f"{KAFKA_TLS_MOUNT}/tls.crt",
            "--kafka-ssl-key",
            f"{KAFKA_TLS_MOUNT}/tls.key",
        ]
    return args


def _volumes(
    ref: ClusterRef, spec: StreamingClusterSpec
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    # The root filesystem is read-only: /tmp (Python's and the broker clients'
    # scratch space) is the one writable place besides the WAL volume.
    volumes: list[dict[str, Any]] = [{"name": "tmp", "emptyDir": {}}]
    mounts: list[dict[str, Any]] = [{"name": "tmp", "mountPath": TMP_MOUNT}]
    if spec.wal.backend == "local":
        claim = {"claimName": pvc_name(ref.name)}
        volumes.append({"name": "wal", "persistentVolumeClaim": claim})
        mounts.append({"name": "wal", "mountPath": WAL_MOUNT})
    kafka = spec.wal.kafka
    if kafka is not None and kafka.tls is not None:
        volumes.append({"name": "kafka-tls", "secret": {"secretName": kafka.tls.secret_name}})
        mounts.append({"name": "kafka-tls", "mountPath": KAFKA_TLS_MOUNT, "readOnly": True})
    if spec.tls is not None:
        # A Secret volume is updated in place when the Secret changes (cert-manager
        # renewals); the node reads the files again at its next handshake.
        volumes.append({"name": "node-tls", "secret": {"secretName": spec.tls.secret_name}})
        mounts.append({"name": "node-tls", "mountPath": NODE_TLS_MOUNT, "readOnly": True})
        if spec.tls.identities_secret_name is not None:
            secret = {"secretName": spec.tls.identities_secret_name}
            volumes.append({"name": "identities", "secret": secret})
            mounts.append({"name": "identities", "mountPath": IDENTITIES_MOUNT, "readOnly": True})
    return volumes, mounts


def pre_stop_drain(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> list[str]:
    """The node container's preStop command: ``headrace drain`` of its own node
    id, so a pod deleted by anyone (kubectl delete, an eviction) hands its
    pchannels off by fenced graceful handoff before the node gets SIGTERM,
    instead of leaving them to lease expiry. A node that holds nothing (the
    operator drained it first) returns at once; one with no peer to take its
    pchannels gives up after ``drainTimeoutSeconds`` and stops as before.
    Exec hooks get no ``$(VAR)`` expansion, so the values are literal."""
    return [
        "headrace",
        "drain",
        "--metastore",
        spec.metastore.url(),
        "--cluster",
        ref.metastore_cluster,
        "--node",
        node_name(ref.name, ordinal),
        "--timeout",
        str(spec.drain_timeout_seconds),
    ]


def _container(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> dict[str, Any]:
    _, mounts = _volumes(ref, spec)
    health_port = GRPC_PORT if spec.tls is None else HEALTH_PORT
    probe = {"grpc": {"port": health_port}, "periodSeconds": 5, "failureThreshold": 3}
    # Readiness is probed every second so a started node counts as Ready (and the
    # cluster goes Ready) within about a second; liveness keeps the slower period.
    readiness = {**probe, "periodSeconds": 1}
    container: dict[str, Any] = {
        "name": "node",
        "image": spec.image,
        "command": ["headrace", "node"],
        "args": node_args(ref, spec, ordinal),
        "envFrom": [{"configMapRef": {"name": config_map_name(ref.name)}}],
        "env": _env(spec),
        "ports": [
            {"name": "grpc", "containerPort": GRPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": METRICS_PORT, "protocol": "TCP"},
            *(
                [{"name": "health", "containerPort": HEALTH_PORT, "protocol": "TCP"}]
                if spec.tls is not None
                else []
            ),
        ],
        "readinessProbe": readiness,
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "failureThreshold": 6},
        "lifecycle": {"preStop": {"exec": {"command": pre_stop_drain(ref, spec, ordinal)}}},
        "volumeMounts": mounts,
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if spec.resources is not None:
        container["resources"] = spec.resources.to_api()
    return container


def template_hash(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> str:
    """Changes whenever a node pod must be replaced: its pod spec or the
    settings it reads from the ConfigMap at start."""
    payload = {"pod": _pod_spec(ref, spec, ordinal), "config": config_data(ref, spec)}
    digest = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
    return digest[:16]


def _pod_spec(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> dict[str, Any]:
    volumes, _ = _volumes(ref, spec)
    return {
        "hostname": node_name(ref.name, ordinal),
        "subdomain": headless_service_name(ref.name),
        "serviceAccountName": node_account_name(ref.name),
        "automountServiceAccountToken": False,
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": spec.drain_timeout_seconds + STOP_GRACE_S,
        "enableServiceLinks": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": NODE_UID,
            "runAsGroup": NODE_UID,
            "fsGroup": NODE_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(ref, spec, ordinal)],
        "volumes": volumes,
    }


@dataclasses.dataclass(frozen=True, slots=True)
class NodeTarget:
    """The image and version one node runs instead of the cluster's."""

    image: str
    version: str

    def to_api(self) -> dict[str, str]:
        return {"image": self.image, "version": self.version}


def node_targets(body: Mapping[str, Any]) -> dict[str, NodeTarget]:
    """The per-node targets of the :data:`NODE_IMAGES` annotation ({} when
    unset); :class:`InvalidSpec` when it is not a JSON object of node name to
    ``{"image": ..., "version": ...}``."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    raw = annotations.get(NODE_IMAGES)
    if not raw:
        return {}
    try:
        decoded = json.loads(raw)
    except ValueError:
        decoded = None
    targets: dict[str, NodeTarget] = {}
    for node, value in (decoded if isinstance(decoded, dict) else {None: None}).items():
        image = value.get("image") if isinstance(value, dict) else None
        version = value.get("version") if isinstance(value, dict) else None
        if not (isinstance(node, str) and isinstance(image, str) and isinstance(version, str)):
            raise InvalidSpec(
                f"annotation {NODE_IMAGES} must be a JSON object of node name to "
                '{"image": ..., "version": ...}',
                field=f"metadata.annotations.{NODE_IMAGES}",
            )
        targets[node] = NodeTarget(image, version)
    return targets


def max_unavailable(body: Mapping[str, Any]) -> int:
    """The :data:`MAX_UNAVAILABLE` annotation (1 when unset);
    :class:`InvalidSpec` when it is not a positive integer."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    raw = str(annotations.get(MAX_UNAVAILABLE) or "1")
    if not raw.isdigit() or int(raw) < 1:
        raise InvalidSpec(
            f"annotation {MAX_UNAVAILABLE} must be a positive integer, not {raw!r}",
            field=f"metadata.annotations.{MAX_UNAVAILABLE}",
        )
    return int(raw)


def offline_upgrade(body: Mapping[str, Any]) -> str:
    """The Offline UpgradePlan that runs on the cluster ("" when none)."""
    annotations = body.get("metadata", {}).get("annotations") or {}
    return str(annotations.get(OFFLINE_UPGRADE) or "")


def encode_node_targets(targets: Mapping[str, NodeTarget]) -> str | None:
    """The annotation value of ``targets`` (None, i.e. removed, when empty)."""
    if not targets:
        return None
    return json.dumps({node: t.to_api() for node, t in sorted(targets.items())}, sort_keys=True)


def node_spec(
    ref: ClusterRef, spec: StreamingClusterSpec, targets: Mapping[str, NodeTarget], ordinal: int
) -> StreamingClusterSpec:
    """The spec node ``ordinal`` is built from: ``spec`` with the image and
    version an UpgradePlan set for it, if any (so the node keeps its template
    hash when the plan finally writes them into the cluster's spec)."""
    target = targets.get(node_name(ref.name, ordinal))
    if target is None or (target.image, target.version) == (spec.image, spec.version):
        return spec
    return spec.model_copy(update={"image": target.image, "version": target.version})


def node_pod(ref: ClusterRef, spec: StreamingClusterSpec, ordinal: int) -> dict[str, Any]:
    """The pod of node ``ordinal``."""
    meta = _meta(
        ref,
        node_name(ref.name, ordinal),
        "streaming-node",
        annotations={TEMPLATE_HASH: template_hash(ref, spec, ordinal)},
    )
    meta["labels"][LABEL_ORDINAL] = str(ordinal)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": _pod_spec(ref, spec, ordinal),
    }


def pod_disruption_budget(ref: ClusterRef, spec: StreamingClusterSpec) -> dict[str, Any] | None:
    """At most one node pod evicted at a time; None below two nodes (a budget
    of zero would block node maintenance for nothing)."""
    if spec.nodes < 2:
        return None
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": _meta(ref, disruption_budget_name(ref.name), "streaming-node"),
        "spec": {
            "minAvailable": spec.nodes - 1,
            "selector": {"matchLabels": selector_labels(ref.name)},
        },
    }


def pchannel_assignment(ref: ClusterRef, pchannel: str) -> dict[str, Any]:
    """A PChannelAssignment as the operator applies it: only the fields it owns
    (``spec.pinnedNode`` belongs to the user and is never sent)."""
    meta = _meta(ref, assignment_name(ref.name, pchannel), "pchannel")
    meta["labels"][LABEL_PCHANNEL] = pchannel
    return {
        "apiVersion": models.API_VERSION,
        "kind": "PChannelAssignment",
        "metadata": meta,
        "spec": {"cluster": ref.name, "pchannel": pchannel},
    }


def cluster_objects(ref: ClusterRef, spec: StreamingClusterSpec) -> list[dict[str, Any]]:
    """The objects that exist once per cluster, in apply order."""
    return [
        service_account(ref),
        node_role(ref),
        node_role_binding(ref),
        config_map(ref, spec),
        headless_service(ref),
        client_service(ref),
    ]


APPLIED_HASH = f"{models.GROUP}/applied-hash"
"""Annotation: digest of the body the operator last applied."""


def stamped(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` with the digest of its own content as an annotation."""
    digest = hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]
    meta = dict(obj["metadata"])
    meta["annotations"] = {**meta.get("annotations", {}), APPLIED_HASH: digest}
    return {**obj, "metadata": meta}


def contains(actual: Any, desired: Any) -> bool:
    """Whether every field of ``desired`` has the same value in ``actual``
    (fields the server added are ignored; lists are compared item by item)."""
    if isinstance(desired, dict):
        return isinstance(actual, dict) and all(
            key in actual and contains(actual[key], value) for key, value in desired.items()
        )
    if isinstance(desired, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(desired)
            and all(contains(a, d) for a, d in zip(actual, desired, strict=True))
        )
    return bool(actual == desired)


def needs_apply(desired: dict[str, Any], current: dict[str, Any] | None) -> bool:
    """Apply when the object is missing, was applied from other content (a
    field the operator dropped must go), or drifted from ``desired``."""
    if current is None:
        return True
    want = desired["metadata"].get("annotations", {}).get(APPLIED_HASH)
    have = (current.get("metadata", {}).get("annotations") or {}).get(APPLIED_HASH)
    return want != have or not contains(current, desired)

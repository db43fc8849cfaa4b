"""The pure builders of a StreamingCluster's objects."""

from __future__ import annotations

from typing import Any

import pytest

from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef
from headrace_operator.errors import InvalidSpec

REF = ClusterRef(name="demo", namespace="streams", uid="uid-1", generation=3)


def spec(**overrides: Any) -> models.StreamingClusterSpec:
    raw: dict[str, Any] = {
        "nodes": 3,
        "pchannels": 4,
        "image": "registry.local/headrace-node:0.1.0",
        "version": "0.1.0",
        "metastore": {"etcdEndpoints": ["etcd:2379"]},
    }
    raw.update(overrides)
    return models.parse_cluster_spec(raw)


def env_names(pod: dict[str, Any]) -> set[str]:
    return {e["name"] for e in pod["spec"]["containers"][0]["env"]}


def test_node_pod_runs_headrace_node_with_its_identity() -> None:
    pod = builders.node_pod(REF, spec(), 2)
    assert pod["metadata"]["name"] == "demo-node-2"
    assert pod["metadata"]["labels"][builders.LABEL_ORDINAL] == "2"
    assert pod["metadata"]["ownerReferences"][0] == {
        "apiVersion": "streaming.headrace.io/v1alpha1",
        "kind": "StreamingCluster",
        "name": "demo",
        "uid": "uid-1",
        "controller": True,
        "blockOwnerDeletion": True,
    }
    container = pod["spec"]["containers"][0]
    assert container["command"] == ["headrace", "node"]
    args = container["args"]
    assert args[args.index("--node-id") + 1] == "demo-node-2"
    assert args[args.index("--listen") + 1] == "$(POD_IP):19530"
    assert args[args.index("--wal") + 1] == "local"
    assert args[args.index("--wal-dir") + 1] == builders.WAL_MOUNT
    assert {"name": "wal", "persistentVolumeClaim": {"claimName": "demo-wal"}} in pod["spec"][
        "volumes"
    ]
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert pod["spec"]["serviceAccountName"] == "demo-node"
    assert container["readinessProbe"]["grpc"]["port"] == 19530


BACKENDS: dict[str, dict[str, Any]] = {
    "local": {},
    "kafka": {"wal": {"backend": "kafka", "kafka": {"bootstrapServers": ["k:9092"]}}},
    "pulsar": {"wal": {"backend": "pulsar", "pulsar": {"serviceUrl": "pulsar://p:6650"}}},
}


@pytest.mark.parametrize("backend", sorted(BACKENDS))
def test_node_pods_run_with_least_privilege(backend: str) -> None:
    """Non-root, no privilege escalation, no capabilities, RuntimeDefault
    seccomp, a read-only root filesystem, no API token; every path the node
    writes (the WAL directory, /tmp) is a volume of its own."""
    pod = builders.node_pod(REF, spec(**BACKENDS[backend]), 0)["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": builders.NODE_UID,
        "runAsGroup": builders.NODE_UID,
        "fsGroup": builders.NODE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert builders.NODE_UID != 0
    assert pod["automountServiceAccountToken"] is False
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert "privileged" not in container["securityContext"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/tmp"]["name"]] == {"name": "tmp", "emptyDir": {}}
    args = container["args"]
    if backend == "local":
        wal_dir = args[args.index("--wal-dir") + 1]
        assert "persistentVolumeClaim" in volumes[mounts[wal_dir]["name"]]
    else:
        assert "--wal-dir" not in args
    for mount in mounts.values():
        assert mount["name"] in volumes


def test_node_pod_drains_itself_before_it_stops() -> None:
    """preStop: a deleted or evicted node hands its pchannels off first, within
    a grace period that covers the drain's timeout and the stop after it."""
    pod = builders.node_pod(REF, spec(drainTimeoutSeconds=120), 1)
    hook = pod["spec"]["containers"][0]["lifecycle"]["preStop"]["exec"]["command"]
    assert hook == [
        "headrace",
        "drain",
        "--metastore",
        "etcd://etcd:2379",
        "--cluster",
        "streams.demo",
        "--node",
        "demo-node-1",
        "--timeout",
        "120",
    ]
    assert not any("$(" in arg for arg in hook), "exec hooks get no variable expansion"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 150
    default = builders.node_pod(REF, spec(), 0)
    assert default["spec"]["terminationGracePeriodSeconds"] == 60 + builders.STOP_GRACE_S
    base = builders.template_hash(REF, spec(), 0)
    assert builders.template_hash(REF, spec(drainTimeoutSeconds=61), 0) != base


def test_drain_timeout_is_bounded() -> None:
    for bad in (0, 3601):
        try:
            spec(drainTimeoutSeconds=bad)
        except InvalidSpec as exc:
            assert "drainTimeoutSeconds" in str(exc.field) or "drainTimeoutSeconds" in exc.message
        else:
            raise AssertionError(f"drainTimeoutSeconds {bad} accepted")


def test_config_map_carries_what_the_node_reads() -> None:
    data = builders.config_map(REF, spec(leaseTTLSeconds=9))["data"]
    assert data["HEADRACE_METASTORE"] == "etcd://etcd:2379"
    assert data["HEADRACE_CLUSTER"] == "streams.demo"
    assert data["HEADRACE_LEASE_TTL"] == "9"
    assert data["HEADRACE_PCHANNELS"] == "pchannel-000,pchannel-001,pchannel-002,pchannel-003"


def test_kafka_backend_wiring() -> None:
    wal = {
        "backend": "kafka",
        "kafka": {
            "bootstrapServers": ["k-0:9092", "k-1:9092"],
            "sasl": {"secretName": "kafka-user", "mechanism": "PLAIN"},
            "tls": {"secretName": "kafka-ca"},
        },
    }
    s = spec(wal=wal)
    pod = builders.node_pod(REF, s, 0)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--kafka-bootstrap") + 1] == "$(HEADRACE_KAFKA_BOOTSTRAP)"
    assert "--wal-dir" not in args
    assert builders.config_map(REF, s)["data"]["HEADRACE_KAFKA_BOOTSTRAP"] == "k-0:9092,k-1:9092"
    assert {"HEADRACE_KAFKA_SASL_USERNAME", "HEADRACE_KAFKA_SASL_PASSWORD"} <= env_names(pod)
    assert {"name": "kafka-tls", "secret": {"secretName": "kafka-ca"}} in pod["spec"]["volumes"]
    assert all(v["name"] != "wal" for v in pod["spec"]["volumes"])
    # The mounted secret's files are named to the node; the client pair only for mutual TLS.
    assert args[args.index("--kafka-ssl-ca") + 1] == f"{builders.KAFKA_TLS_MOUNT}/ca.crt"
    assert "--kafka-ssl-cert" not in args and "--kafka-ssl-key" not in args
    wal["kafka"]["tls"] = {"secretName": "kafka-ca", "clientAuth": True}
    args = builders.node_pod(REF, spec(wal=wal), 0)["spec"]["containers"][0]["args"]
    assert args[args.index("--kafka-ssl-cert") + 1] == f"{builders.KAFKA_TLS_MOUNT}/tls.crt"
    assert args[args.index("--kafka-ssl-key") + 1] == f"{builders.KAFKA_TLS_MOUNT}/tls.key"
    del wal["kafka"]["tls"]
    args = builders.node_pod(REF, spec(wal=wal), 0)["spec"]["containers"][0]["args"]
    assert "--kafka-ssl-ca" not in args


def test_pulsar_backend_wiring() -> None:
    wal = {
        "backend": "pulsar",
        "pulsar": {
            "serviceUrl": "pulsar://broker:6650",
            "authSecretRef": {"name": "pulsar-jwt", "key": "token"},
        },
    }
    pod = builders.node_pod(REF, spec(wal=wal), 0)
    args = pod["spec"]["containers"][0]["args"]
    assert args[args.index("--pulsar-url") + 1] == "$(HEADRACE_PULSAR_URL)"
    assert "HEADRACE_PULSAR_TOKEN" in env_names(pod)


def test_template_hash_follows_pod_and_config_changes() -> None:
    base = builders.template_hash(REF, spec(), 0)
    assert builders.template_hash(REF, spec(), 0) == base
    assert builders.template_hash(REF, spec(image="other:1"), 0) != base
    assert builders.template_hash(REF, spec(version="0.2.0"), 0) != base
    assert builders.template_hash(REF, spec(leaseTTLSeconds=30), 0) != base
    assert builders.template_hash(REF, spec(nodes=5), 0) == base, "scaling restarts nothing"
    assert builders.template_hash(REF, spec(), 1) != base


def test_volume_is_owned_only_when_data_goes_with_the_cluster() -> None:
    kept = builders.pvc(REF, spec())
    assert "ownerReferences" not in kept["metadata"]
    assert kept["spec"]["resources"]["requests"]["storage"] == "10Gi"
    owned = builders.pvc(
        REF,
        spec(
            deleteDataOnDelete=True,
            wal={"backend": "local", "local": {"size": "5Gi", "storageClassName": "nfs"}},
        ),
    )
    assert owned["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert owned["spec"]["storageClassName"] == "nfs"
    assert owned["spec"]["resources"]["requests"]["storage"] == "5Gi"


def test_every_node_pod_mounts_the_one_shared_wal_volume() -> None:
    """A pchannel's WAL directory must be readable by whichever node owns it
    next, so all pods claim the same ReadWriteMany volume."""
    claim = builders.pvc(REF, spec(nodes=3))
    assert claim["metadata"]["name"] == "demo-wal"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert builders.LABEL_ORDINAL not in claim["metadata"]["labels"]
    mounted = set()
    for ordinal in range(3):
        pod = builders.node_pod(REF, spec(nodes=3), ordinal)
        (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "wal"]
        mounted.add(volume["persistentVolumeClaim"]["claimName"])
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "wal", "mountPath": builders.WAL_MOUNT} in mounts
    assert mounted == {"demo-wal"}


def test_disruption_budget_allows_one_node_down() -> None:
    budget = builders.pod_disruption_budget(REF, spec(nodes=3))
    assert budget is not None
    assert budget["spec"]["minAvailable"] == 2
    assert budget["spec"]["selector"]["matchLabels"] == builders.selector_labels("demo")
    assert builders.pod_disruption_budget(REF, spec(nodes=1)) is None


def test_services_select_the_node_pods() -> None:
    headless = builders.headless_service(REF)
    client = builders.client_service(REF)
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert client["spec"]["type"] == "ClusterIP"
    for service in (headless, client):
        assert service["spec"]["selector"] == builders.selector_labels("demo")
        assert service["spec"]["ports"][0]["port"] == 19530


def test_node_rbac_is_minimal() -> None:
    role = builders.node_role(REF)
    assert role["rules"] == [
        {
            "apiGroups": [""],
            "resources": ["configmaps"],
            "resourceNames": ["demo-config"],
            "verbs": ["get"],
        }
    ]
    binding = builders.node_role_binding(REF)
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "demo-node", "namespace": "streams"}
    ]
    assert builders.service_account(REF)["automountServiceAccountToken"] is False


def test_pchannel_assignment_leaves_the_pin_to_the_user() -> None:
    obj = builders.pchannel_assignment(REF, "pchannel-003")
    assert obj["metadata"]["name"] == "demo-pchannel-003"
    assert obj["spec"] == {"cluster": "demo", "pchannel": "pchannel-003"}


def test_needs_apply_detects_missing_drift_and_dropped_fields() -> None:
    desired = builders.stamped(builders.config_map(REF, spec()))
    assert builders.needs_apply(desired, None)
    live = {**desired, "metadata": {**desired["metadata"], "resourceVersion": "7", "uid": "x"}}
    assert not builders.needs_apply(desired, live), "server-added fields are ignored"
    drifted = {**live, "data": {**live["data"], "HEADRACE_LEASE_TTL": "99"}}
    assert builders.needs_apply(desired, drifted)
    fewer = builders.stamped(builders.pvc(REF, spec()))
    before = builders.stamped(builders.pvc(REF, spec(deleteDataOnDelete=True)))
    assert builders.needs_apply(fewer, before), "dropping ownerReferences must be applied"


def test_ordinal_of_pod_names() -> None:
    assert builders.ordinal_of("demo", "demo-node-12") == 12
    assert builders.ordinal_of("demo", "demo-node-012") is None
    assert builders.ordinal_of("demo", "demo-node-x") is None
    assert builders.ordinal_of("demo", "other-node-1") is None


def test_max_unavailable_annotation() -> None:
    def body(value: str | None) -> dict[str, Any]:
        annotations = {} if value is None else {builders.MAX_UNAVAILABLE: value}
        return {"metadata": {"annotations": annotations}}

    assert builders.max_unavailable(body(None)) == 1
    assert builders.max_unavailable(body("3")) == 3
    for bad in ("0", "-1", "two", "1.5"):
        try:
            builders.max_unavailable(body(bad))
        except InvalidSpec as exc:
            assert builders.MAX_UNAVAILABLE in exc.message and repr(bad) in exc.message
        else:
            raise AssertionError(f"{bad!r} accepted")


def test_node_tls_from_secrets_mounts_them_and_probes_the_plaintext_health_port() -> None:
    tls = {
        "secretName": "demo-node-tls",
        "requireClientCertificates": True,
        "identitiesSecretName": "demo-identities",
    }
    pod = builders.node_pod(REF, spec(tls=tls), 0)
    container = pod["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--tls-cert") + 1] == f"{builders.NODE_TLS_MOUNT}/tls.crt"
    assert args[args.index("--tls-key") + 1] == f"{builders.NODE_TLS_MOUNT}/tls.key"
    assert args[args.index("--tls-client-ca") + 1] == f"{builders.NODE_TLS_MOUNT}/ca.crt"
    assert args[args.index("--auth-file") + 1] == f"{builders.IDENTITIES_MOUNT}/identities.json"
    assert args[args.index("--health-listen") + 1] == "$(POD_IP):19531"
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["node-tls"]["secret"] == {"secretName": "demo-node-tls"}
    assert volumes["identities"]["secret"] == {"secretName": "demo-identities"}
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["node-tls"]["readOnly"] and mounts["identities"]["readOnly"]
    assert container["readinessProbe"]["grpc"]["port"] == builders.HEALTH_PORT
    assert container["livenessProbe"]["grpc"]["port"] == builders.HEALTH_PORT
    plain = builders.node_pod(REF, spec(tls={"secretName": "demo-node-tls"}), 0)
    plain_args = plain["spec"]["containers"][0]["args"]
    assert "--tls-client-ca" not in plain_args and "--auth-file" not in plain_args
    assert "--tls-cert" not in builders.node_pod(REF, spec(), 0)["spec"]["containers"][0]["args"]


def test_an_invalid_tls_secret_name_is_refused_naming_the_field() -> None:
    with pytest.raises(InvalidSpec, match="secretName"):
        spec(tls={"secretName": "Not_A_Name"})

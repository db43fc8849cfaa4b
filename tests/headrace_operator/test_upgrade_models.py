"""The UpgradePlan model and its CRD: the same invalid specs are rejected by the
model and (``kube`` marker) by a real kube-apiserver, naming the same field."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace_operator import builders, crdgen, models
from headrace_operator.errors import InvalidSpec, KubeInvalid
from headrace_operator.kube import KubernetesApi
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.op_harness import install_crds


def plan_spec(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "clusterRef": {"name": "alpha"},
        "version": "0.2.0",
        "image": "headrace-node:0.2.0",
    }
    spec.update(overrides)
    return spec


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("no-cluster", {"version": "1", "image": "i"}, "spec.clusterRef"),
    ("bad-cluster-name", plan_spec(clusterRef={"name": "Alpha!"}), "spec.clusterRef.name"),
    ("empty-image", plan_spec(image=""), "spec.image"),
    ("bad-mode", plan_spec(mode="Sideways"), "spec.mode"),
    ("zero-unavailable", plan_spec(maxUnavailable=0), "spec.maxUnavailable"),
    ("short-drain", plan_spec(drainTimeoutSeconds=1), "spec.drainTimeoutSeconds"),
    ("negative-soak", plan_spec(soakSeconds=-1), "spec.soakSeconds"),
    ("dry-run-rollback", plan_spec(dryRun=True, rollback=True), "spec.rollback"),
    (
        "offline-unavailable",
        plan_spec(mode="Offline", maxUnavailable=2),
        "spec.maxUnavailable",
    ),
]


def test_defaults() -> None:
    spec = models.parse_upgrade_spec(plan_spec())
    assert spec.cluster_ref.name == "alpha"
    assert spec.mode is models.UpgradeMode.ROLLING
    assert (spec.max_unavailable, spec.drain_timeout_seconds, spec.soak_seconds) == (1, 300, 30)
    assert not (spec.paused or spec.rollback or spec.dry_run)


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_model_rejects_naming_the_field(case: str, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        models.parse_upgrade_spec(spec)
    assert raised.value.field.startswith(field), (case, raised.value.field)


def test_every_cel_rule_has_a_model_twin() -> None:
    schema = crdgen.crd("UpgradePlan")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    messages = {rule["message"] for rule in rules}
    for case in ("dry-run-rollback", "offline-unavailable"):
        spec = next(s for c, s, _ in INVALID if c == case)
        with pytest.raises(InvalidSpec) as raised:
            models.parse_upgrade_spec(spec)
        assert raised.value.message in messages, case


def test_status_round_trip_uses_kubernetes_names() -> None:
    status = models.UpgradePlanStatus(
        phase="Running",
        current_node="alpha-node-1",
        nodes=[models.NodeProgress(node="alpha-node-1", from_="a:1", to="a:2", pchannels_moved=3)],
    ).to_api()
    assert status["currentNode"] == "alpha-node-1"
    assert status["nodes"][0] == {
        "node": "alpha-node-1",
        "from": "a:1",
        "to": "a:2",
        "step": "Pending",
        "pchannelsMoved": 3,
        "pchannelsAtStart": 0,
        "started": "",
        "readySince": "",
        "error": "",
    }
    assert models.UpgradePlanStatus.model_validate(status).nodes[0].from_ == "a:1"


def test_printer_columns_show_phase_and_progress() -> None:
    columns = crdgen.crd("UpgradePlan")["spec"]["versions"][0]["additionalPrinterColumns"]
    paths = {c["name"]: c["jsonPath"] for c in columns}
    assert paths["Phase"] == ".status.phase"
    assert paths["Progress"] == ".status.progress"


@pytest.fixture
async def kube(kube_cluster: KubeTestbed) -> AsyncIterator[tuple[KubernetesApi, str]]:
    api = KubernetesApi(kube_cluster.api_client())
    await install_crds(api)
    namespace = f"upc-{uuid.uuid4().hex[:8]}"
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    yield api, namespace
    await api.delete("v1", "Namespace", "", namespace)
    api.close()


def plan(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": "UpgradePlan",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.mark.kube
@pytest.mark.timeout(300)
async def test_api_server_rejects_the_same_specs(kube: tuple[KubernetesApi, str]) -> None:
    api, namespace = kube
    for case, spec, field in INVALID:
        with pytest.raises(KubeInvalid) as raised:
            await api.create(plan(namespace, case, spec))
        assert field in str(raised.value), (case, str(raised.value))
    created = await api.create(plan(namespace, "ok", plan_spec()))
    assert created["spec"]["mode"] == "Rolling"
    assert created["spec"]["soakSeconds"] == 30
    with pytest.raises(KubeInvalid) as raised:
        await api.patch_merge(
            models.API_VERSION, "UpgradePlan", namespace, "ok", {"spec": {"mode": "Offline"}}
        )
    assert "mode is immutable" in str(raised.value)


def _annotated(value: str) -> dict[str, Any]:
    return {"metadata": {"annotations": {builders.NODE_IMAGES: value}}}


@pytest.mark.parametrize(
    "value",
    ["not json", '["a"]', '{"alpha-node-0": "img"}', '{"alpha-node-0": {"image": "img"}}'],
)
def test_a_malformed_node_images_annotation_is_named(value: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        builders.node_targets(_annotated(value))
    assert raised.value.field == f"metadata.annotations.{builders.NODE_IMAGES}"


def test_node_targets_round_trip_and_override_only_their_node() -> None:
    targets = {"alpha-node-1": builders.NodeTarget("img:2", "0.2.0")}
    encoded = builders.encode_node_targets(targets)
    assert encoded is not None
    assert builders.node_targets(_annotated(encoded)) == targets
    assert builders.encode_node_targets({}) is None
    ref = builders.ClusterRef(name="alpha", namespace="ns", uid="u")
    spec = models.parse_cluster_spec(
        {
            "pchannels": 2,
            "image": "img:1",
            "version": "0.1.0",
            "metastore": {"etcdEndpoints": ["etcd:2379"]},
        }
    )
    assert builders.node_spec(ref, spec, targets, 0) is spec
    moved = builders.node_spec(ref, spec, targets, 1)
    assert (moved.image, moved.version) == ("img:2", "0.2.0")
    assert builders.template_hash(ref, moved, 1) != builders.template_hash(ref, spec, 1)
    final = spec.model_copy(update={"image": "img:2", "version": "0.2.0"})
    assert builders.template_hash(ref, builders.node_spec(ref, final, targets, 1), 1) == (
        builders.template_hash(ref, moved, 1)
    ), "writing the target into the spec keeps the upgraded node's template"

"""The Helm chart: lint, render with defaults, dry-run on a real API server,
and a reconcile pass run with exactly the permissions the chart grants."""

from __future__ import annotations

import copy
import datetime
import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from headrace_operator import crdgen, models
from headrace_operator.coordinator_runner import CoordinatorRunners
from headrace_operator.events import KubeEventSink
from headrace_operator.kube import KubernetesApi
from headrace_operator.probe import TcpProbe
from headrace_operator.steps import Pass, run_pass
from headrace_testbed import TestbedError
from headrace_testbed.helm import Helm, ensure_helm
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.op_harness import Bed, install_crds

CHART = Path(__file__).resolve().parents[2] / "charts" / "headrace-operator"
KUBE_VERSION = "1.34.4"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    try:
        binary = ensure_helm()
    except TestbedError as exc:
        pytest.fail(f"cannot build helm: {exc}", pytrace=False)
    home = tmp_path_factory.mktemp("helm-offline")
    return Helm(binary, home / "no-kubeconfig", home)


def render(
    helm: Helm, *args: str, release: str = "rel", namespace: str = "ops"
) -> list[dict[str, Any]]:
    text = helm.run(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--kube-version",
        KUBE_VERSION,
        *args,
    )
    return [doc for doc in yaml.safe_load_all(text) if doc]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for doc in docs:
        out.setdefault(doc["kind"], []).append(doc)
    return out


def test_lint(helm: Helm) -> None:
    output = helm.run("lint", "--strict", str(CHART), "--kube-version", KUBE_VERSION)
    assert "0 chart(s) failed" in output


def test_defaults_render_a_non_root_deployment_and_namespaced_rbac(helm: Helm) -> None:
    kinds = by_kind(render(helm))
    assert sorted(kinds) == ["Deployment", "Role", "RoleBinding", "ServiceAccount"]
    deployment = kinds["Deployment"][0]
    assert deployment["spec"]["replicas"] == 2, "a standby replica for coordinator failover"
    spread = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"] == deployment["spec"]["selector"]["matchLabels"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    container = pod["containers"][0]
    assert container["image"] == "headrace-operator:0.1.0"
    assert container["args"] == [
        "--liveness=http://0.0.0.0:8080/healthz",
        "--resync-seconds=10",
        "--log-format=text",
        "--metrics-listen=0.0.0.0:9401",
        "--namespace=ops",
    ], "by default the operator watches only its own namespace"
    assert pod["serviceAccountName"] == "rel-headrace-operator"
    (role,) = kinds["Role"]
    (binding,) = kinds["RoleBinding"]
    assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == "ops"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-headrace-operator", "namespace": "ops"}
    ]


def test_operator_pod_runs_with_least_privilege(helm: Helm) -> None:
    pod = by_kind(render(helm))["Deployment"][0]["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    (container,) = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    assert {"name": mount["name"], "emptyDir": {}} in pod["volumes"]


def test_cluster_wide_is_an_explicit_choice(helm: Helm) -> None:
    kinds = by_kind(render(helm, "--set", "clusterWide=true"))
    assert sorted(kinds) == ["ClusterRole", "ClusterRoleBinding", "Deployment", "ServiceAccount"]
    args = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--namespace")]
    assert kinds["ClusterRoleBinding"][0]["subjects"] == [
        {"kind": "ServiceAccount", "name": "rel-headrace-operator", "namespace": "ops"}
    ]
    with pytest.raises(TestbedError, match="leave watchNamespaces empty"):
        render(helm, "--set", "clusterWide=true", "--set", "watchNamespaces={a}")


def granted_verbs(rules: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    return {
        (group, resource): set(rule["verbs"])
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }


README_TABLE_ROW = re.compile(r"^\| `([^`]*)` \| `([^`]+)` \| `([a-z]+)` \|", re.MULTILINE)


def readme_verbs() -> dict[tuple[str, str], set[str]]:
    """The chart README's table of verbs: (group, resource) -> verbs."""
    table: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in README_TABLE_ROW.findall((CHART / "README.md").read_text()):
        table.setdefault(("" if group == "core" else group, resource), set()).add(verb)
    return table


def test_rbac_is_least_privilege(helm: Helm) -> None:
    granted = granted_verbs(by_kind(render(helm))["Role"][0]["rules"])
    assert (
        granted_verbs(by_kind(render(helm, "--set", "clusterWide=true"))["ClusterRole"][0]["rules"])
        == granted
    )
    for (group, resource), verbs in granted.items():
        assert "*" not in verbs and group != "*" and resource != "*"
        assert resource not in ("secrets", "nodes", "clusterroles", "customresourcedefinitions")
        assert not {"escalate", "bind", "impersonate", "deletecollection"} & verbs
    assert granted[("", "pods")] == {"list", "watch", "create", "patch", "delete"}, (
        "pods are listed and watched, applied, annotated and deleted; never read one by one"
    )
    assert granted[("", "persistentvolumeclaims")] == {"get", "create", "patch"}, (
        "the shared WAL volume is only ensured, never listed or deleted by the operator"
    )
    assert granted[("streaming.headrace.io", "streamingclusters")] == {
        "get",
        "list",
        "watch",
        "patch",
    }
    assert granted[("streaming.headrace.io", "upgradeplans")] == {
        "get",
        "list",
        "watch",
        "patch",
    }, "the UpgradePlan controller reads plans and patches the cluster's node targets"
    for status in ("streamingclusters", "pchannelassignments", "upgradeplans"):
        assert granted[("streaming.headrace.io", f"{status}/status")] == {"patch"}
    assert granted[("", "events")] == {"create"}, "events are posted, never patched"
    for group in ("sparkoperator.k8s.io", "spark.apache.org"):
        assert granted[(group, "sparkapplications")] == {"list", "create", "delete"}, (
            "runs are listed, created and deleted past their deadline; never edited (an edit "
            "re-runs one) nor read one by one"
        )
    assert ("events.k8s.io", "events") not in granted


def test_the_readme_lists_every_granted_verb(helm: Helm) -> None:
    granted = granted_verbs(by_kind(render(helm))["Role"][0]["rules"])
    assert readme_verbs() == granted


def test_watched_namespaces_get_roles_instead(helm: Helm) -> None:
    kinds = by_kind(
        render(
            helm,
            "--set",
            "watchNamespaces={a,b}",
            "--set",
            "logVerbosity=1",
            "--set",
            "logFormat=json",
        )
    )
    assert "ClusterRole" not in kinds
    assert sorted(r["metadata"]["namespace"] for r in kinds["Role"]) == ["a", "b"]
    assert sorted(r["metadata"]["namespace"] for r in kinds["RoleBinding"]) == ["a", "b"]
    args = kinds["Deployment"][0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--namespace=a" in args and "--namespace=b" in args and "-v" in args
    assert "--log-format=json" in args
    assert "--namespace=ops" not in args


def test_network_policy_is_off_by_default(helm: Helm) -> None:
    assert "NetworkPolicy" not in by_kind(render(helm))


def test_network_policy_admits_only_the_operator_nodes_and_clients(helm: Helm) -> None:
    clients = "networkPolicy.clients[0].namespaceSelector.matchLabels.team=apps"
    docs = render(
        helm,
        "--set",
        "networkPolicy.enabled=true",
        "--set",
        "watchNamespaces={a,b}",
        "--set",
        clients,
    )
    policies = by_kind(docs)["NetworkPolicy"]
    assert sorted(p["metadata"]["namespace"] for p in policies) == ["a", "b"]
    nodes = {"app.kubernetes.io/name": "headrace", "app.kubernetes.io/component": "streaming-node"}
    operator_labels = by_kind(docs)["Deployment"][0]["spec"]["selector"]["matchLabels"]
    for policy in policies:
        spec = policy["spec"]
        assert spec["podSelector"] == {"matchLabels": nodes}
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert rule["ports"] == [{"port": 19530, "protocol": "TCP"}]
        assert rule["from"] == [
            {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
                "podSelector": {"matchLabels": operator_labels},
            },
            {"podSelector": {"matchLabels": nodes}},
            {"namespaceSelector": {"matchLabels": {"team": "apps"}}},
        ]


def test_network_policy_with_cluster_wide_needs_its_namespaces(helm: Helm) -> None:
    on = ("--set", "networkPolicy.enabled=true", "--set", "clusterWide=true")
    with pytest.raises(TestbedError, match=r"networkPolicy\.namespaces"):
        render(helm, *on)
    policies = by_kind(render(helm, *on, "--set", "networkPolicy.namespaces={x}"))["NetworkPolicy"]
    assert [p["metadata"]["namespace"] for p in policies] == ["x"]


def test_chart_installs_the_generated_crds(helm: Helm) -> None:
    """The chart's crds/ is a link to crds/ (test_crd_drift.py): Helm follows it."""
    rendered = by_kind(render(helm, "--include-crds"))["CustomResourceDefinition"]
    assert {c["metadata"]["name"]: c for c in rendered} == {
        f"{crdgen.plural(kind)}.{models.GROUP}": crdgen.crd(kind) for kind in models.KINDS
    }


@pytest.fixture
def namespace(kube_cluster: KubeTestbed) -> Iterator[str]:
    name = f"chart-{uuid.uuid4().hex[:8]}"
    with kube_cluster.api_client() as api:
        core = kubernetes.client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        yield name
        core.delete_namespace(name)


@pytest.mark.kube
async def test_rendered_chart_passes_server_side_dry_run(
    helm: Helm, kube_cluster: KubeTestbed, namespace: str
) -> None:
    docs = render(
        helm, "--include-crds", "--set", "networkPolicy.enabled=true", namespace=namespace
    )
    assert "NetworkPolicy" in by_kind(docs)
    api = KubernetesApi(kube_cluster.api_client())
    try:
        for doc in docs:
            result = await api.dry_run_apply(doc)
            assert result["kind"] == doc["kind"]
            assert (
                await api.get(doc["apiVersion"], doc["kind"], namespace, doc["metadata"]["name"])
                is None
                or doc["kind"] == "CustomResourceDefinition"
            )
    finally:
        api.close()


def service_account_client(admin: Any, namespace: str, account: str) -> Any:
    """An API client that authenticates as ``namespace/account`` (TokenRequest)."""
    core = kubernetes.client.CoreV1Api(admin)
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 900},
    }
    token = core.create_namespaced_service_account_token(account, namespace, request).status.token
    configuration = copy.copy(admin.configuration)
    configuration.cert_file = None
    configuration.key_file = None
    configuration.api_key = {"BearerToken": f"Bearer {token}"}
    return kubernetes.client.ApiClient(configuration)


@pytest.mark.kube
@pytest.mark.timeout(300)
@pytest.mark.parametrize("scope", ["namespaced", "clusterWide"])
async def test_a_pass_needs_no_more_than_the_chart_grants(
    helm: Helm, kube_cluster: KubeTestbed, namespace: str, scope: str
) -> None:
    """A full reconcile (scale to one node and back to none) as the chart's
    ServiceAccount, with the default Role in the release namespace and with
    the ClusterRole of ``clusterWide``."""
    release = f"r{uuid.uuid4().hex[:6]}"
    values = ("--set", "clusterWide=true") if scope == "clusterWide" else ()
    docs = [
        d
        for d in render(helm, *values, release=release, namespace=namespace)
        if d["kind"] != "Deployment"
    ]
    expected = {"ClusterRole"} if scope == "clusterWide" else {"Role"}
    assert {d["kind"] for d in docs} & {"Role", "ClusterRole"} == expected
    admin = KubernetesApi(kube_cluster.api_client())
    await install_crds(admin)
    for doc in docs:
        await admin.apply(doc)
    account = f"{release}-headrace-operator"
    operator = KubernetesApi(service_account_client(admin.api_client, namespace, account))
    runners = CoordinatorRunners("rbac-test")
    user = Bed("real", admin, namespace, kube_cluster.cluster.etcd.endpoint, runners, None)
    try:
        await user.create_cluster("least", nodes=1, pchannels=2, deleteDataOnDelete=True)
        for nodes in (1, 0):
            await user.patch_cluster("least", {"spec": {"nodes": nodes}})
            p = Pass(
                body=await user.cluster("least"),
                kube=operator,
                events=KubeEventSink(operator, "rbac-test"),
                probe=TcpProbe(),
                connect=user.connect,
                now=datetime.datetime.now(datetime.UTC),
            )
            result = await run_pass(p)
            assert result.failures == (), result.failures
        assert await admin.get("v1", "ServiceAccount", namespace, "least-node") is not None
        assert "NodePodCreated" in await user.event_reasons()
        body = await admin.get(models.API_VERSION, "StreamingCluster", namespace, "least")
        assert body is not None and body["status"]["nodesDesired"] == 0
    finally:
        await runners.stop_all()
        for doc in docs:
            if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
                await admin.delete(doc["apiVersion"], doc["kind"], "", doc["metadata"]["name"])
        operator.close()
        admin.close()


def test_monitoring_is_off_by_default_and_scrapes_operator_and_nodes_when_on(
    helm: Helm,
) -> None:
    assert not {"ServiceMonitor", "PodMonitor"} & by_kind(render(helm)).keys()
    kinds = by_kind(
        render(
            helm,
            "--set",
            "metrics.serviceMonitor.enabled=true",
            "--set",
            "metrics.grafanaDashboard.enabled=true",
            "--set",
            "metrics.serviceMonitor.labels.release=prom",
        )
    )
    (monitor,) = kinds["ServiceMonitor"]
    (service,) = [s for s in kinds["Service"] if s["metadata"]["name"].endswith("-metrics")]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["spec"]["selector"].items()
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    (pods,) = kinds["PodMonitor"]
    assert pods["spec"]["namespaceSelector"] == {"matchNames": ["ops"]}
    assert pods["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pods["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == (
        "streaming-node"
    )
    (dashboard,) = [c for c in kinds["ConfigMap"] if c["metadata"]["name"].endswith("dashboard")]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = (CHART / "dashboards" / "headrace.json").read_text()
    assert json.loads(dashboard["data"]["headrace.json"]) == json.loads(shipped)


def test_the_network_policy_admits_metrics_scrapers_only_on_the_metrics_port(helm: Helm) -> None:
    scrapers = "networkPolicy.metricsScrapers[0].namespaceSelector.matchLabels.team=monitoring"
    (policy,) = by_kind(render(helm, "--set", "networkPolicy.enabled=true", "--set", scrapers))[
        "NetworkPolicy"
    ]
    rules = policy["spec"]["ingress"]
    metrics_rules = [r for r in rules if r["ports"] == [{"port": 9400, "protocol": "TCP"}]]
    assert len(metrics_rules) == 1
    assert metrics_rules[0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"team": "monitoring"}}}
    ]
    (policy,) = by_kind(render(helm, "--set", "networkPolicy.enabled=true"))["NetworkPolicy"]
    assert all(r["ports"] != [{"port": 9400, "protocol": "TCP"}] for r in policy["spec"]["ingress"])

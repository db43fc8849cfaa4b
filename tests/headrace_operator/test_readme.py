"""README.md's Kubernetes example, exactly as written there: the StreamingCluster
of its ``kubectl apply -f - <<'YAML'`` snippet is accepted by the models and by
a real API server with the CRDs installed (server-side dry run)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from headrace_operator import models
from headrace_operator.kube import KubernetesApi
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.op_harness import install_crds

README = Path(__file__).resolve().parents[2] / "README.md"
HEREDOC = re.compile(r"<<'YAML'\n(.*?)\n^YAML$", re.DOTALL | re.MULTILINE)


def kubernetes_section(text: str) -> str:
    start = text.index("\n## On Kubernetes\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def readme_manifests() -> list[dict[str, Any]]:
    """Every object of every YAML heredoc in README.md's Kubernetes section."""
    snippets = HEREDOC.findall(kubernetes_section(README.read_text()))
    assert snippets, "README.md's Kubernetes section has no kubectl apply heredoc"
    return [doc for snippet in snippets for doc in yaml.safe_load_all(snippet) if doc]


def test_the_example_is_a_valid_streaming_cluster() -> None:
    docs = readme_manifests()
    clusters = [d for d in docs if d.get("kind") == "StreamingCluster"]
    assert clusters, "the example shows no StreamingCluster"
    for doc in clusters:
        assert doc["apiVersion"] == models.API_VERSION
        models.parse_cluster_spec(doc["spec"])


def test_the_upgrade_example_is_a_valid_plan_for_the_example_cluster() -> None:
    docs = readme_manifests()
    plans = [d for d in docs if d.get("kind") == "UpgradePlan"]
    assert plans, "the Kubernetes section shows no UpgradePlan"
    clusters = {d["metadata"]["name"] for d in docs if d.get("kind") == "StreamingCluster"}
    for doc in plans:
        assert doc["apiVersion"] == models.API_VERSION
        spec = models.parse_upgrade_spec(doc["spec"])
        assert spec.cluster_ref.name in clusters
        assert spec.dry_run, "the example starts as a dry run"


def test_the_heredoc_is_found_only_in_its_section() -> None:
    text = (
        "## On Kubernetes\nkubectl apply -f - <<'YAML'\nkind: A\nYAML\n## Next\n<<'YAML'\nB\nYAML\n"
    )
    section = kubernetes_section("\n" + text)
    assert HEREDOC.findall(section) == ["kind: A"]


@pytest.mark.kube
@pytest.mark.timeout(180)
async def test_the_api_server_accepts_the_example(kube_cluster: KubeTestbed) -> None:
    api = KubernetesApi(kube_cluster.api_client())
    namespace = f"readme-{uuid.uuid4().hex[:8]}"
    try:
        await install_crds(api)
        await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        for doc in readme_manifests():
            obj = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
            result = await api.dry_run_apply(obj)
            assert result["kind"] == doc["kind"]
            assert result["spec"]["version"] == doc["spec"]["version"]
            name = doc["metadata"]["name"]
            assert await api.get(doc["apiVersion"], doc["kind"], namespace, name) is None
    finally:
        await api.delete("v1", "Namespace", "", namespace)
        api.close()

"""Scenario 1: the CRDs and the Helm chart install, and the operator runs
under the chart's ServiceAccount with exactly the chart's permissions.

(The rendered chart's server-side dry run is ``tests/headrace_operator/test_chart.py``;
here the chart is really installed.)
"""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.conftest import E2E
from e2e.harness import CRD_DIR, GROUP, Kube

pytestmark = [pytest.mark.kube, pytest.mark.slow]


async def test_crds_and_chart_install_and_operator_runs_as_its_service_account(e2e: E2E) -> None:
    admin = e2e.admin()
    try:
        plurals = sorted(p.stem.split("_", 1)[1] for p in CRD_DIR.glob("*.yaml"))
        assert sorted(e2e.crds) == [f"{plural}.{GROUP}" for plural in plurals]
        for name in e2e.crds:
            crd = await admin.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", name)
            assert crd["spec"]["group"] == GROUP
            served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
            assert served == ["v1alpha1"], name

        status = json.loads(
            e2e.helm.run("status", e2e.release, "--namespace", e2e.namespace, "-o", "json")
        )
        assert status["info"]["status"] == "deployed"
        manifest = e2e.helm.run("get", "manifest", e2e.release, "--namespace", e2e.namespace)
        installed = sorted(
            (doc["kind"], doc["metadata"]["name"]) for doc in yaml.safe_load_all(manifest) if doc
        )
        account = e2e.operator_account
        assert installed == [
            ("Deployment", account),
            ("Role", account),
            ("RoleBinding", account),
            ("ServiceAccount", account),
        ]
        versions = {
            "Deployment": "apps/v1",
            "ServiceAccount": "v1",
            "Role": "rbac.authorization.k8s.io/v1",
            "RoleBinding": "rbac.authorization.k8s.io/v1",
        }
        for kind, name in installed:
            assert await admin.get(versions[kind], kind, e2e.namespace, name) is not None
        deployment = await admin.get("apps/v1", "Deployment", e2e.namespace, account)
        assert deployment["spec"]["replicas"] == 0

        operator = Kube.from_kubeconfig(e2e.operator_kubeconfig)
        try:
            who = await operator.who_am_i()
            assert who == f"system:serviceaccount:{e2e.namespace}:{account}"
            ns = e2e.namespace
            assert await operator.can_i("patch", "streamingclusters", ns, GROUP)
            assert await operator.can_i("create", "pods", ns)
            assert not await operator.can_i("get", "secrets", ns)
            assert not await operator.can_i("create", "pods", "default")
        finally:
            operator.close()
        assert e2e.operator.healthy(), e2e.operator.log_tail()
    finally:
        admin.close()

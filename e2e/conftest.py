"""The installed operator the scenarios share (one per session).

``e2e`` does what a user does, once: applies ``crds/*.yaml`` (server-side, as
``kubectl apply --server-side``), creates a namespace, ``helm install`` s the
chart there with ``watchNamespaces`` set to it (a Role, RoleBinding and
ServiceAccount; ``replicaCount=0``, see below), and runs the operator process
``python -m headrace_operator`` under that ServiceAccount's token, watching
the namespace.

The chart's Deployment is installed with no replicas: the process runner of
the test bed cannot run the operator image (it maps images to nothing), pods
get no service-account token volume, and the chart's liveness endpoint binds
``0.0.0.0``. The operator therefore runs beside the cluster as the same program
with the same credentials the Deployment's pod would have.

``E2E.restart_operator()`` stops that process and starts a new one with the
same credentials (a scenario's operator restart); the session ends with the
last one.

The Kubernetes control plane and the process runner come from the root plugin
``tests.fixtures_kube`` (``kube_cluster``, ``helm_cli``), the Headrace
metastore from ``tests.fixtures_etcd`` (``etcd_endpoint``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.harness import CHART, Kube, OperatorProcess, apply_crds, service_account_kubeconfig
from headrace_testbed.helm import Helm
from tests.fixtures_kube import KubeTestbed

RESYNC_S = 2.0


@dataclasses.dataclass(frozen=True)
class E2E:
    """The installed operator and how to reach everything."""

    testbed: KubeTestbed
    helm: Helm
    namespace: str
    release: str
    etcd_endpoint: str
    operators: list[OperatorProcess]
    """The operator processes started so far; the last one runs."""
    operator_kubeconfig: Path
    crds: tuple[str, ...]
    work: Path

    @property
    def operator(self) -> OperatorProcess:
        return self.operators[-1]

    def restart_operator(self) -> int:
        """Stop the running operator (SIGTERM) and start a new one with the
        same credentials; its exit code. The new one is serving on return."""
        code = self.operator.stop()
        count = len(self.operators)
        fresh = OperatorProcess(
            self.operator_kubeconfig,
            self.namespace,
            self.work / f"operator-{count}.log",
            RESYNC_S,
        )
        self.operators.append(fresh)
        fresh.wait_healthy()
        return code

    @property
    def etcd_url(self) -> str:
        return f"etcd://{self.etcd_endpoint}"

    @property
    def operator_account(self) -> str:
        return f"{self.release}-headrace-operator"

    def admin(self) -> Kube:
        """A new admin client (the test's ``kubectl``); close it when done."""
        return Kube.from_kubeconfig(self.testbed.kubeconfig)


async def _namespace(kube: Kube, name: str) -> None:
    await kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})


@pytest.fixture(scope="session")
def e2e(
    kube_cluster: KubeTestbed,
    helm_cli: Helm,
    etcd_endpoint: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[E2E]:
    work = tmp_path_factory.mktemp("e2e")
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    release = "hr"
    admin = Kube.from_kubeconfig(kube_cluster.kubeconfig)
    crds = asyncio.run(apply_crds(admin))
    asyncio.run(_namespace(admin, namespace))
    helm_cli.run(
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--skip-crds",
        "--set",
        "replicaCount=0",
        "--set",
        f"watchNamespaces={{{namespace}}}",
    )
    kubeconfig = service_account_kubeconfig(
        admin,
        namespace,
        f"{release}-headrace-operator",
        server=kube_cluster.server,
        ca_file=str(kube_cluster.cluster.pki.ca_cert),
        out=work / "operator.kubeconfig",
    )
    operator = OperatorProcess(kubeconfig, namespace, work / "operator.log", RESYNC_S)
    operator.wait_healthy()
    env = E2E(
        testbed=kube_cluster,
        helm=helm_cli,
        namespace=namespace,
        release=release,
        etcd_endpoint=etcd_endpoint,
        operators=[operator],
        operator_kubeconfig=kubeconfig,
        crds=crds,
        work=work,
    )
    try:
        yield env
    finally:
        code = env.operator.stop()
        helm_cli.run("uninstall", release, "--namespace", namespace)
        admin.request("DELETE", f"/api/v1/namespaces/{namespace}")
        admin.close()
    assert code == 0, f"the operator exited with {code}:\n{env.operator.log_tail()}"

"""pytest plugin: one real Kubernetes control plane and kubelet stand-in per session.

``kube_cluster`` starts etcd, kube-apiserver and kube-controller-manager (built
from the Go module proxy on first use, see ``scripts/headrace_testbed/kube.py``)
on loopback, plus the process runner that registers the node ``headrace-local``
and runs pods as local processes (``e2e/README.md`` says what is simulated).
``helm_cli`` is the Helm CLI bound to that cluster. Load this module once, as
the plugin ``tests.fixtures_kube`` (root ``pytest_plugins``, or
``pluginmanager.import_plugin`` as ``tests/testbed/conftest.py`` does):
importing the fixtures into several conftests starts one cluster per conftest.
Pods get addresses from ``127.0.0.0/24``; set ``HEADRACE_KUBE_POD_NETWORK``
(e.g. ``127.0.9.0/24``) to keep two test sessions on one machine apart.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from headrace_testbed.helm import Helm, ensure_helm
from headrace_testbed.kube import KubeCluster, start_kube
from headrace_testbed.kubelet import ProcessRunner
from headrace_testbed.kubelet_node import KubeletConfig
from tests.testbed_start import start_or_fail


@dataclasses.dataclass(frozen=True)
class KubeTestbed:
    """What ``kube_cluster`` yields."""

    cluster: KubeCluster
    kubelet: ProcessRunner

    @property
    def kubeconfig(self) -> Path:
        return self.cluster.kubeconfig

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>`` of the API server."""
        return self.cluster.server

    def api_client(self) -> Any:
        """A new admin ``kubernetes.client.ApiClient``; close it when done."""
        return self.cluster.api_client()

    @property
    def node_name(self) -> str:
        return self.kubelet.cfg.node_name


@pytest.fixture(scope="session")
def kube_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeTestbed]:
    """The session's control plane and kubelet stand-in (stopped at the end)."""
    root = tmp_path_factory.mktemp("kube")
    cluster = start_or_fail(
        "start the Kubernetes test bed", lambda: start_kube(root / "control-plane")
    )
    with cluster:
        api = cluster.api_client()
        try:
            network = os.environ.get("HEADRACE_KUBE_POD_NETWORK", "127.0.0.0/24")
            runner = ProcessRunner(api, KubeletConfig(root=root / "kubelet", pod_network=network))
            with runner:
                yield KubeTestbed(cluster, runner)
        finally:
            api.close()


@pytest.fixture(scope="session")
def helm_cli(kube_cluster: KubeTestbed, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    """``helm`` (built on first use) talking to ``kube_cluster``."""
    binary = start_or_fail("build helm", ensure_helm)
    return Helm(binary, kube_cluster.kubeconfig, tmp_path_factory.mktemp("helm"))


@pytest.fixture
def kube_namespace(kube_cluster: KubeTestbed) -> Iterator[str]:
    """A fresh namespace for one test, deleted (without waiting) afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    with kube_cluster.api_client() as api:
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        yield name
        core.delete_namespace(name)

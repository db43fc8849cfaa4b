"""The test bed the operator benchmarks start for themselves, on loopback.

:func:`control_plane`: kube-apiserver and kube-controller-manager (the test
bed's builds), an etcd for the Headrace metastore, and the process runner
standing in for the kubelet. :func:`operator_in`: the CRDs applied, a fresh
namespace, and the operator process (``python -m headrace_operator``, admin
kubeconfig) watching it, serving on return.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for entry in (REPO / "operator", REPO / "scripts", REPO):
    if str(entry) not in sys.path:
        sys.path.insert(0, str(entry))

from e2e.harness import Kube, OperatorProcess, apply_crds  # noqa: E402
from headrace_testbed.etcd import start_etcd  # noqa: E402
from headrace_testbed.kube import start_kube  # noqa: E402
from headrace_testbed.kubelet import ProcessRunner  # noqa: E402
from headrace_testbed.kubelet_node import KubeletConfig  # noqa: E402


@dataclasses.dataclass(frozen=True)
class ControlPlane:
    kubeconfig: Path
    etcd: str
    """host:port of the Headrace metastore's etcd."""
    runner: ProcessRunner
    work: Path


@contextlib.contextmanager
def control_plane(work: Path) -> Iterator[ControlPlane]:
    """The control plane, the metastore's etcd and the process runner, under ``work``."""
    network = os.environ.get("HEADRACE_KUBE_POD_NETWORK", "127.0.0.0/24")
    with start_kube(work / "control-plane") as cluster, start_etcd(work / "etcd") as etcd:
        api = cluster.api_client()
        try:
            config = KubeletConfig(root=work / "kubelet", pod_network=network)
            with ProcessRunner(api, config) as runner:
                yield ControlPlane(cluster.kubeconfig, etcd.endpoint, runner, work)
        finally:
            api.close()


@dataclasses.dataclass(frozen=True)
class OperatorBed:
    kube: Kube
    namespace: str
    operator: OperatorProcess


@contextlib.asynccontextmanager
async def operator_in(plane: ControlPlane, resync_s: float) -> AsyncIterator[OperatorBed]:
    """CRDs, a namespace ``bench-<pid>`` and the operator watching it."""
    kube = Kube.from_kubeconfig(plane.kubeconfig)
    namespace = f"bench-{os.getpid()}"
    try:
        await apply_crds(kube)
        await kube.create(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
        log = plane.work / "operator.log"
        operator = OperatorProcess(plane.kubeconfig, namespace, log, resync_s)
        try:
            await asyncio.to_thread(operator.wait_healthy)
            yield OperatorBed(kube, namespace, operator)
        finally:
            operator.stop()
    finally:
        kube.close()

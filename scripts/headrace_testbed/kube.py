"""A real Kubernetes control plane for the end-to-end tests, on loopback.

``start_kube(workdir)`` runs, each with its log file under ``workdir``:

* etcd (``headrace_testbed.etcd``) with its own data directory;
* kube-apiserver on a free ``127.0.0.1`` port, TLS from :mod:`headrace_testbed.pki`,
  RBAC authorization, service accounts signed by a test key;
* kube-controller-manager with every in-tree controller except the cloud ones,
  so garbage collection, namespace deletion, Deployments, StatefulSets, Jobs
  and PodDisruptionBudget status behave as in a real cluster.

Nodes, the kubelet, the container runtime and the scheduler are not part of
it: :mod:`headrace_testbed.kubelet` stands in for them (see ``e2e/README.md``).

Command line::

    PYTHONPATH=scripts python -m headrace_testbed.kube build        # print binary paths
    PYTHONPATH=scripts python -m headrace_testbed.kube run WORKDIR  # cluster + kubelet until ^C
    PYTHONPATH=scripts python -m headrace_testbed.kube regen        # go.mod for KUBE_VERSION
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from headrace_testbed import TestbedError
from headrace_testbed.etcd import EtcdServer, start_etcd
from headrace_testbed.kube_build import KUBE_VERSION, ensure_kube_binaries, regenerate_module
from headrace_testbed.pki import ADMIN_USER, Pki, write_pki
from headrace_testbed.ports import LOOPBACK, free_port
from headrace_testbed.process import StopOnExit, log_tail, stop_process

__all__ = ["KUBE_VERSION", "KubeCluster", "ensure_kube_binaries", "start_kube"]

SERVICE_CIDR = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
_START_ATTEMPTS = 3
# Cloud controllers need a cloud provider; node IPAM needs --allocate-node-cidrs.
DISABLED_CONTROLLERS = (
    "cloud-node-lifecycle-controller",
    "service-lb-controller",
    "node-route-controller",
    "node-ipam-controller",
)


def apiserver_args(pki: Pki, etcd_endpoint: str, port: int) -> list[str]:
    """kube-apiserver flags for a single loopback control plane."""
    return [
        f"--etcd-servers=http://{etcd_endpoint}",
        f"--bind-address={LOOPBACK}",
        f"--advertise-address={LOOPBACK}",
        f"--secure-port={port}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--client-ca-file={pki.ca_cert}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.service_account_pub}",
        f"--service-account-signing-key-file={pki.service_account_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--authorization-mode=RBAC",
        # Pods get no service-account token volume: the kubelet stand-in cannot mount one,
        # and pods in a brand-new namespace need not wait for its "default" account.
        "--disable-admission-plugins=ServiceAccount",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def controller_manager_args(pki: Pki, kubeconfig: Path) -> list[str]:
    """kube-controller-manager flags; it serves no port (``--secure-port=0``)."""
    disabled = ",".join(f"-{name}" for name in DISABLED_CONTROLLERS)
    return [
        f"--kubeconfig={kubeconfig}",
        f"--controllers=*,{disabled}",
        "--leader-elect=false",
        "--use-service-account-credentials=true",
        f"--root-ca-file={pki.ca_cert}",
        f"--service-account-private-key-file={pki.service_account_key}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--bind-address={LOOPBACK}",
        "--secure-port=0",
        "--profiling=false",
        "--v=1",
    ]


def kubeconfig_document(server: str, pki: Pki) -> dict[str, Any]:
    """An admin kubeconfig (JSON is valid YAML, so every client reads it)."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "headrace",
                "cluster": {"server": server, "certificate-authority": str(pki.ca_cert)},
            }
        ],
        "users": [
            {
                "name": ADMIN_USER,
                "user": {
                    "client-certificate": str(pki.admin_cert),
                    "client-key": str(pki.admin_key),
                },
            }
        ],
        "contexts": [{"name": "headrace", "context": {"cluster": "headrace", "user": ADMIN_USER}}],
        "current-context": "headrace",
        "preferences": {},
    }


def _ssl_context(pki: Pki) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca_cert))
    context.load_cert_chain(str(pki.admin_cert), str(pki.admin_key))
    return context


def _get(url: str, context: ssl.SSLContext) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2.0, context=context) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, urllib.error.URLError):
        return 0, b""


def _ready(url: str, context: ssl.SSLContext) -> bool:
    return _get(url, context)[0] == 200


def _wait(
    what: str,
    process: subprocess.Popen[bytes],
    log_path: Path,
    ready: Callable[[], bool],
    timeout: float = START_TIMEOUT_S,
) -> bool:
    """Poll ``ready`` until it holds; False if the process died; raises on timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        if ready():
            return True
        time.sleep(0.2)
    stop_process(process, STOP_TIMEOUT_S)
    raise TestbedError(
        f"{what} was not ready after {timeout:.0f} s; log tail:\n{log_tail(log_path)}"
    )


@dataclasses.dataclass
class KubeCluster(StopOnExit):
    """A running etcd + kube-apiserver + kube-controller-manager; use as a context manager."""

    workdir: Path
    pki: Pki
    etcd: EtcdServer
    port: int
    kubeconfig: Path
    processes: dict[str, subprocess.Popen[bytes]]
    logs: dict[str, Path]

    @property
    def server(self) -> str:
        """``https://127.0.0.1:<port>``."""
        return f"https://{LOOPBACK}:{self.port}"

    def get(self, path: str) -> tuple[int, bytes]:
        """GET ``path`` on the API server as the admin user: ``(status, body)``."""
        return _get(f"{self.server}{path}", _ssl_context(self.pki))

    def version(self) -> dict[str, Any]:
        status, body = self.get("/version")
        if status != 200:
            raise TestbedError(f"GET /version answered {status}: {body[:200]!r}")
        result: dict[str, Any] = json.loads(body)
        return result

    def api_client(self) -> Any:
        """A new ``kubernetes.client.ApiClient`` authenticated as the admin user."""
        from kubernetes import config  # noqa: PLC0415 - only the e2e extras install it

        return config.new_client_from_config(config_file=str(self.kubeconfig))  # type: ignore[no-untyped-call]

    def log_tail(self, component: str, limit: int = 4000) -> str:
        return log_tail(self.logs[component], limit)

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver"):
            process = self.processes.get(name)
            if process is not None:
                stop_process(process, STOP_TIMEOUT_S)
        self.etcd.stop()


def _launch(binary: Path, args: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    with log_path.open("ab") as log:
        return subprocess.Popen(
            [str(binary), *args], stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )


def _start_apiserver(binary: Path, cluster: KubeCluster) -> None:
    log_path = cluster.logs["kube-apiserver"]
    context = _ssl_context(cluster.pki)
    for _ in range(_START_ATTEMPTS):
        cluster.port = free_port()
        args = apiserver_args(cluster.pki, cluster.etcd.endpoint, cluster.port)
        process = _launch(binary, args, log_path)
        cluster.processes["kube-apiserver"] = process
        url = f"https://{LOOPBACK}:{cluster.port}/readyz"
        if _wait("kube-apiserver", process, log_path, functools.partial(_ready, url, context)):
            return
        if "address already in use" not in log_tail(log_path):
            break
    raise TestbedError(f"kube-apiserver exited during start; log tail:\n{log_tail(log_path)}")


def _default_service_account_exists(cluster: KubeCluster) -> bool:
    status, _ = cluster.get("/api/v1/namespaces/default/serviceaccounts/default")
    return status == 200


def _start_controller_manager(binary: Path, cluster: KubeCluster) -> None:
    log_path = cluster.logs["kube-controller-manager"]
    process = _launch(binary, controller_manager_args(cluster.pki, cluster.kubeconfig), log_path)
    cluster.processes["kube-controller-manager"] = process
    # The serviceaccount controller creating "default" shows the controllers are running.
    if not _wait(
        "kube-controller-manager",
        process,
        log_path,
        lambda: _default_service_account_exists(cluster),
    ):
        raise TestbedError(
            f"kube-controller-manager exited during start; log tail:\n{log_tail(log_path)}"
        )


def start_kube(workdir: Path) -> KubeCluster:
    """Start the control plane with everything under ``workdir``; stop it with ``with``."""
    binaries = ensure_kube_binaries()
    workdir.mkdir(parents=True, exist_ok=True)
    pki = write_pki(workdir / "pki")
    etcd = start_etcd(workdir / "etcd")
    cluster = KubeCluster(
        workdir=workdir,
        pki=pki,
        etcd=etcd,
        port=0,
        kubeconfig=workdir / "kubeconfig",
        processes={},
        logs={name: workdir / f"{name}.log" for name in binaries},
    )
    try:
        _start_apiserver(binaries["kube-apiserver"], cluster)
        cluster.kubeconfig.write_text(
            json.dumps(kubeconfig_document(cluster.server, pki), indent=2)
        )
        _start_controller_manager(binaries["kube-controller-manager"], cluster)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("build", help="build (or reuse) the cached binaries; print their paths")
    commands.add_parser("regen", help=f"rewrite scripts/testbed/kube for {KUBE_VERSION}")
    run = commands.add_parser("run", help="run the control plane and the kubelet stand-in")
    run.add_argument("workdir", type=Path)
    args = parser.parse_args(argv)
    if args.command == "build":
        for name, path in ensure_kube_binaries().items():
            print(f"{name}\t{path}")
        return 0
    if args.command == "regen":
        regenerate_module()
        return 0
    from headrace_testbed.kubelet import ProcessRunner  # noqa: PLC0415
    from headrace_testbed.kubelet_node import KubeletConfig  # noqa: PLC0415

    with start_kube(args.workdir.resolve()) as cluster:
        runner = ProcessRunner(
            cluster.api_client(), KubeletConfig(root=cluster.workdir / "kubelet")
        )
        with runner:
            print(f"export KUBECONFIG={cluster.kubeconfig}", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                cluster.processes["kube-apiserver"].wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The Kubernetes test bed itself: real control plane, kubelet stand-in, Helm."""

from __future__ import annotations

import ipaddress
import os
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client

from headrace_testbed import helm, kube_build
from headrace_testbed.helm import Helm, helm_version
from headrace_testbed.kube import KUBE_VERSION
from tests.fixtures_kube import KubeTestbed

pytestmark = pytest.mark.kube

T = TypeVar("T")
WAIT_S = 90.0  # hang guard only
# A TCP server on $POD_IP:8080 that starts listening after a second.
TCP_SERVER = """
import os, socket, time
time.sleep(1)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind((os.environ["POD_IP"], 8080))
server.listen()
env = os.environ
print("serving", env["POD_IP"], env["MY_NAME"], env["MY_NAMESPACE"], flush=True)
while True:
    server.accept()[0].close()
"""


def wait_for(what: str, probe: Callable[[], T | None], timeout: float = WAIT_S) -> T:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def core(kube_cluster: KubeTestbed) -> Iterator[client.CoreV1Api]:
    with kube_cluster.api_client() as api:
        yield client.CoreV1Api(api)


def server_container() -> dict[str, Any]:
    return {
        "name": "server",
        "image": "registry.example/not-pulled:1",
        "command": ["python", "-c", TCP_SERVER],
        "env": [
            {"name": "MY_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {
                "name": "MY_NAMESPACE",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
            },
        ],
        "ports": [{"name": "tcp", "containerPort": 8080}],
        "readinessProbe": {"tcpSocket": {"port": "tcp"}, "periodSeconds": 1},
    }


def condition(pod: client.V1Pod, kind: str) -> str | None:
    for cond in pod.status.conditions or []:
        if cond.type == kind:
            return str(cond.status)
    return None


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> client.V1Pod | None:
    try:
        return core.read_namespaced_pod(name, namespace)
    except client.ApiException as exc:
        if exc.status == 404:
            return None
        raise


def accepts(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=1.0):
            return True
    except OSError:
        return False


def test_api_server_reports_its_version(kube_cluster: KubeTestbed) -> None:
    assert kube_cluster.cluster.version()["gitVersion"] == KUBE_VERSION == "v1.34.4"
    with kube_cluster.api_client() as api:
        info = client.VersionApi(api).get_code()
    assert info.git_version == KUBE_VERSION
    assert kube_cluster.server.startswith("https://127.0.0.1:")


def test_node_is_registered_ready_with_a_fresh_lease(kube_cluster: KubeTestbed) -> None:
    with kube_cluster.api_client() as api:
        node = client.CoreV1Api(api).read_node(kube_cluster.node_name)
        lease = client.CoordinationV1Api(api).read_namespaced_lease(
            kube_cluster.node_name, "kube-node-lease"
        )
    ready = [c.status for c in node.status.conditions if c.type == "Ready"]
    assert ready == ["True"]
    assert node.status.allocatable["pods"] == "110"
    assert lease.spec.holder_identity == kube_cluster.node_name


def test_pod_is_bound_runs_becomes_ready_and_stops_on_delete(
    kube_cluster: KubeTestbed, core: client.CoreV1Api, kube_namespace: str
) -> None:
    pod = {
        "metadata": {"name": "echo"},
        "spec": {"containers": [server_container()], "terminationGracePeriodSeconds": 5},
    }
    core.create_namespaced_pod(kube_namespace, pod)

    def ready() -> client.V1Pod | None:
        current = read_pod(core, kube_namespace, "echo")
        return current if current and condition(current, "Ready") == "True" else None

    running = wait_for("the pod to become Ready", ready)
    ip = running.status.pod_ip
    assert running.spec.node_name == kube_cluster.node_name
    assert running.status.phase == "Running"
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(kube_cluster.kubelet.cfg.pod_network)
    assert ipaddress.ip_address(ip).is_loopback
    assert ip != "127.0.0.1"
    (status,) = running.status.container_statuses
    assert status.ready and status.state.running is not None
    assert accepts(ip, 8080)
    log = kube_cluster.kubelet.pod_log(kube_namespace, "echo", "server")
    assert f"serving {ip} echo {kube_namespace}" in log
    pid = int(status.container_id.removeprefix("headrace://"))

    core.delete_namespaced_pod("echo", kube_namespace)
    wait_for("the pod object to go", lambda: read_pod(core, kube_namespace, "echo") is None)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not accepts(ip, 8080)


def test_restart_policy_always_restarts_an_exited_container(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    crash = {"name": "crash", "image": "none", "command": ["python", "-c", "raise SystemExit(3)"]}
    core.create_namespaced_pod(
        kube_namespace, {"metadata": {"name": "crash"}, "spec": {"containers": [crash]}}
    )

    def restarted() -> client.V1ContainerStatus | None:
        pod = read_pod(core, kube_namespace, "crash")
        statuses = (pod.status.container_statuses or []) if pod else []
        return statuses[0] if statuses and statuses[0].restart_count >= 1 else None

    status = wait_for("a restart", restarted)
    assert status.last_state.terminated.exit_code == 3
    assert read_pod(core, kube_namespace, "crash").status.phase == "Running"


@pytest.mark.parametrize(("code", "phase"), [(0, "Succeeded"), (4, "Failed")])
def test_restart_policy_never_reports_the_final_phase(
    core: client.CoreV1Api, kube_namespace: str, code: int, phase: str
) -> None:
    job = {"name": "job", "image": "none", "command": ["python", "-c", f"raise SystemExit({code})"]}
    spec = {"containers": [job], "restartPolicy": "Never"}
    core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "once"}, "spec": spec})

    def finished() -> client.V1Pod | None:
        pod = read_pod(core, kube_namespace, "once")
        return pod if pod and pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_for("the pod to finish", finished)
    assert pod.status.phase == phase
    assert pod.status.container_statuses[0].state.terminated.exit_code == code


def test_persistent_volume_claim_data_outlives_the_pod(
    kube_cluster: KubeTestbed, core: client.CoreV1Api, kube_namespace: str
) -> None:
    script = (
        "import os; open(os.environ['DATA'] + '/runs', 'a').write(os.environ['POD_IP'] + '\\n')"
    )
    writer = {
        "name": "writer",
        "image": "none",
        "command": ["python", "-c", script],
        "env": [{"name": "DATA", "value": "/var/lib/data"}],
        "volumeMounts": [{"name": "store", "mountPath": "/var/lib/data"}],
    }
    volume = {"name": "store", "persistentVolumeClaim": {"claimName": "store-0"}}
    spec = {"containers": [writer], "volumes": [volume], "restartPolicy": "Never"}
    for _ in range(2):
        core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "writer"}, "spec": spec})
        wait_for(
            "the writer to finish",
            lambda: (
                (pod := read_pod(core, kube_namespace, "writer"))
                and pod.status.phase == "Succeeded"
            ),
        )
        core.delete_namespaced_pod("writer", kube_namespace)
        wait_for("the writer to go", lambda: read_pod(core, kube_namespace, "writer") is None)
    stored = kube_cluster.kubelet.cfg.root / "pvc" / kube_namespace / "store-0" / "runs"
    assert len(stored.read_text().splitlines()) == 2


def test_statefulset_pods_come_from_the_controller_manager(
    kube_cluster: KubeTestbed, kube_namespace: str
) -> None:
    labels = {"app": "web"}
    service = {
        "metadata": {"name": "web"},
        "spec": {"clusterIP": "None", "selector": labels, "ports": [{"port": 8080}]},
    }
    statefulset = {
        "metadata": {"name": "web"},
        "spec": {
            "serviceName": "web",
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [server_container()]},
            },
        },
    }
    budget = {
        "metadata": {"name": "web"},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    with kube_cluster.api_client() as api:
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        policy = client.PolicyV1Api(api)
        core.create_namespaced_service(kube_namespace, service)
        apps.create_namespaced_stateful_set(kube_namespace, statefulset)
        wait_for(
            "two ready replicas",
            lambda: (
                apps.read_namespaced_stateful_set("web", kube_namespace).status.ready_replicas == 2
            ),
        )
        pods = {p.metadata.name: p for p in core.list_namespaced_pod(kube_namespace).items}
        assert sorted(pods) == ["web-0", "web-1"]
        ips = {p.status.pod_ip for p in pods.values()}
        assert len(ips) == 2
        assert all(accepts(ip, 8080) for ip in ips)

        owner = pods["web-0"].metadata.owner_references[0]
        assert (owner.kind, owner.name) == ("StatefulSet", "web")
        policy.create_namespaced_pod_disruption_budget(kube_namespace, budget)

        def disruption_status() -> client.V1PodDisruptionBudgetStatus | None:
            status = policy.read_namespaced_pod_disruption_budget("web", kube_namespace).status
            return status if status and status.current_healthy == 2 else None

        status = wait_for("the disruption controller", disruption_status)
        assert status.disruptions_allowed == 1


def test_namespace_deletion_removes_its_pods(
    kube_cluster: KubeTestbed, core: client.CoreV1Api
) -> None:
    core.create_namespace({"metadata": {"name": "doomed"}})
    core.create_namespaced_pod(
        "doomed",
        {
            "metadata": {"name": "p"},
            "spec": {"containers": [server_container()], "terminationGracePeriodSeconds": 2},
        },
    )
    wait_for(
        "the pod to run",
        lambda: (p := read_pod(core, "doomed", "p")) and p.status.phase == "Running",
    )
    core.delete_namespace("doomed")

    def namespace_gone() -> bool:
        try:
            core.read_namespace("doomed")
        except client.ApiException as exc:
            return exc.status == 404
        return False

    wait_for("the namespace to be deleted", namespace_gone)
    assert kube_cluster.kubelet.worker("doomed", "p") is None


def test_helm_version_and_cluster_access(helm_cli: Helm) -> None:
    assert helm_cli.run("version", "--short").startswith(helm_version())
    assert "NAME" in helm_cli.run("list", "--all-namespaces")


def test_committed_go_modules_match_their_generators() -> None:
    assert kube_build.module_drift() == []
    assert helm.module_drift() == []


def test_init_container_and_config_map_volume_prepare_the_main_container(
    kube_cluster: KubeTestbed, core: client.CoreV1Api, kube_namespace: str
) -> None:
    core.create_namespaced_config_map(
        kube_namespace, {"metadata": {"name": "conf"}, "data": {"greeting": "hello"}}
    )
    init_script = "import sys; open(sys.argv[1] + '/stamp', 'w').write('init ran')"
    main_script = "import sys; a, b = sys.argv[1:]; print(open(a+'/stamp').read(), open(b).read())"
    spec = {
        "restartPolicy": "Never",
        "initContainers": [
            {
                "name": "init",
                "image": "none",
                "command": ["python", "-c", init_script, "/work"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}],
            }
        ],
        "containers": [
            {
                "name": "main",
                "image": "none",
                "command": ["python", "-c", main_script, "/work", "/etc/conf/greeting"],
                "volumeMounts": [
                    {"name": "work", "mountPath": "/work"},
                    {"name": "conf", "mountPath": "/etc/conf"},
                ],
            }
        ],
        "volumes": [
            {"name": "work", "emptyDir": {}},
            {"name": "conf", "configMap": {"name": "conf"}},
        ],
    }
    core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "prep"}, "spec": spec})

    def finished() -> client.V1Pod | None:
        pod = read_pod(core, kube_namespace, "prep")
        return pod if pod and pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_for("the pod to finish", finished)
    assert pod.status.phase == "Succeeded"
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    assert "init ran hello" in kube_cluster.kubelet.pod_log(kube_namespace, "prep", "main")


def test_failing_liveness_probe_restarts_the_container(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    sleeper = {
        "name": "sleeper",
        "image": "none",
        "command": ["python", "-c", "import time; time.sleep(600)"],
        # Nothing listens on this port, so the probe fails.
        "livenessProbe": {"tcpSocket": {"port": 9}, "periodSeconds": 1, "failureThreshold": 1},
    }
    spec = {"containers": [sleeper], "terminationGracePeriodSeconds": 1}
    core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "sleeper"}, "spec": spec})

    def restarted() -> client.V1ContainerStatus | None:
        pod = read_pod(core, kube_namespace, "sleeper")
        statuses = (pod.status.container_statuses or []) if pod else []
        return statuses[0] if statuses and statuses[0].restart_count >= 1 else None

    status = wait_for("a liveness restart", restarted)
    assert status.last_state.terminated.exit_code == 128 + 15  # stopped by SIGTERM


def test_exec_readiness_probe_sees_the_mapped_volume(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    script = (
        "import os, pathlib, time; time.sleep(1); "
        "pathlib.Path(os.environ['WORK'], 'ready').touch(); time.sleep(600)"
    )
    container = {
        "name": "main",
        "image": "none",
        "command": ["python", "-c", script],
        "env": [{"name": "WORK", "value": "/work"}],
        "volumeMounts": [{"name": "work", "mountPath": "/work"}],
        "readinessProbe": {"exec": {"command": ["test", "-f", "/work/ready"]}, "periodSeconds": 1},
    }
    spec = {
        "containers": [container],
        "volumes": [{"name": "work", "emptyDir": {}}],
        "terminationGracePeriodSeconds": 1,
    }
    core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "flag"}, "spec": spec})
    pod = wait_for(
        "readiness through the exec probe",
        lambda: (
            (p := read_pod(core, kube_namespace, "flag")) and condition(p, "Ready") == "True" and p
        ),
    )
    assert pod.status.container_statuses[0].ready


def test_pod_with_an_unmatched_node_selector_stays_pending(
    core: client.CoreV1Api, kube_namespace: str
) -> None:
    spec = {"containers": [server_container()], "nodeSelector": {"disktype": "ssd"}}
    core.create_namespaced_pod(kube_namespace, {"metadata": {"name": "picky"}, "spec": spec})
    pod = wait_for(
        "the Unschedulable condition",
        lambda: (
            (p := read_pod(core, kube_namespace, "picky"))
            and condition(p, "PodScheduled") == "False"
            and p
        ),
    )
    assert pod.spec.node_name is None
    assert pod.status.phase == "Pending"


def test_an_image_from_an_unresolvable_registry_never_starts(
    kube_cluster: KubeTestbed, core: client.CoreV1Api, kube_namespace: str
) -> None:
    """A registry host in ``.invalid`` cannot resolve: the container waits in
    ErrImagePull, then ImagePullBackOff, as a kubelet reports it; the command
    never runs and the pod stays Pending and not Ready."""
    image = "unpullable.invalid/headrace-node:9"
    container = {**server_container(), "image": image}
    core.create_namespaced_pod(
        kube_namespace, {"metadata": {"name": "sour"}, "spec": {"containers": [container]}}
    )
    reasons: list[str] = []

    def backing_off() -> client.V1Pod | None:
        pod = read_pod(core, kube_namespace, "sour")
        statuses = (pod.status.container_statuses or []) if pod else []
        waiting = statuses[0].state.waiting if statuses else None
        if waiting is not None and waiting.reason not in reasons:
            reasons.append(waiting.reason)
        return pod if waiting is not None and waiting.reason == "ImagePullBackOff" else None

    pod = wait_for("ImagePullBackOff", backing_off)
    assert reasons[-2:] == ["ErrImagePull", "ImagePullBackOff"] or reasons == ["ImagePullBackOff"]
    (status,) = pod.status.container_statuses
    assert status.state.waiting.message == f'Back-off pulling image "{image}"'
    assert status.image == image and not status.ready and status.restart_count == 0
    assert status.container_id is None
    assert pod.status.phase == "Pending"
    assert condition(pod, "Ready") == "False"
    worker = kube_cluster.kubelet.worker(kube_namespace, "sour")
    assert worker is not None
    assert [run.started_once for run in worker.main] == [False], "its command never ran"
    assert worker.main[0].pull_attempts >= 2

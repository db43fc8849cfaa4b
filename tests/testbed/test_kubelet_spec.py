"""Pure decisions of the kubelet stand-in and the Kubernetes build module (no cluster)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest

from headrace_testbed.kube_build import (
    parse_replacements,
    render_go_mod,
    render_replacements,
    staging_version,
)
from headrace_testbed.kubelet_node import AddressPool
from headrace_testbed.kubelet_spec import (
    ContainerView,
    EnvContext,
    SpecError,
    container_argv,
    container_env,
    expand_vars,
    mounts,
    pod_phase,
    pull_failure,
    registry_host,
    rewrite_paths,
    schedule_failure,
    volume_dirs,
)

POD = {
    "metadata": {"name": "node-0", "namespace": "prod", "uid": "u-1", "labels": {"app": "wal"}},
    "spec": {
        "nodeName": "headrace-local",
        "volumes": [
            {"name": "data", "persistentVolumeClaim": {"claimName": "data-node-0"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    },
}
CONFIG: dict[tuple[str, str, str], Mapping[str, bytes]] = {
    ("ConfigMap", "prod", "settings"): {"LEVEL": b"debug", "MODE": b"fast"},
    ("Secret", "prod", "creds"): {"token": b"s3cr3t"},
}


def lookup(kind: str, namespace: str, name: str) -> Mapping[str, bytes] | None:
    return CONFIG.get((kind, namespace, name))


CTX = EnvContext(POD, "127.0.0.7", "127.0.0.1", lookup)


def test_expand_vars_replaces_defined_names_and_keeps_the_rest() -> None:
    env = {"A": "1", "B": "two"}
    assert expand_vars("x$(A)-$(B)-$(C)-$$(A)", env) == "x1-two-$(C)-$(A)"


def test_container_env_resolves_every_source_in_order() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
        "env": [
            {"name": "NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
            {"name": "ADDR", "value": "$(IP):19530"},
        ],
    }
    env = container_env(CTX, container, {"PATH": "/bin"})
    assert env == {
        "PATH": "/bin",
        "CFG_LEVEL": "debug",
        "CFG_MODE": "fast",
        "NAME": "node-0",
        "IP": "127.0.0.7",
        "APP": "wal",
        "TOKEN": "s3cr3t",
        "ADDR": "127.0.0.7:19530",
    }


def test_missing_config_key_is_a_config_error_unless_optional() -> None:
    ref = {"name": "settings", "key": "ABSENT"}
    container = {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": ref}}]}
    with pytest.raises(SpecError) as caught:
        container_env(CTX, container, {})
    assert caught.value.reason == "CreateContainerConfigError"
    optional = {"env": [{"name": "X", "valueFrom": {"configMapKeyRef": {**ref, "optional": True}}}]}
    assert "X" not in container_env(CTX, optional, {})


def test_volumes_map_to_pod_and_claim_directories(tmp_path: Path) -> None:
    dirs = volume_dirs(POD, tmp_path / "pod", tmp_path / "pvc")
    assert dirs == {
        "data": tmp_path / "pvc" / "prod" / "data-node-0",
        "scratch": tmp_path / "pod" / "volumes" / "scratch",
    }
    container = {
        "volumeMounts": [
            {"name": "data", "mountPath": "/var/lib/headrace"},
            {"name": "scratch", "mountPath": "/var/lib/headrace/tmp", "subPath": "t"},
        ]
    }
    found = mounts(container, dirs)
    assert found[0] == ("/var/lib/headrace/tmp", dirs["scratch"] / "t")
    assert (
        rewrite_paths("--data-dir=/var/lib/headrace/wal", found) == f"--data-dir={dirs['data']}/wal"
    )
    assert rewrite_paths("/var/lib/headrace/tmp/x", found) == f"{dirs['scratch']}/t/x"
    assert rewrite_paths("/var/lib/headraceX", found) == "/var/lib/headraceX"
    assert rewrite_paths("echo /var/lib/headrace", found) == "echo /var/lib/headrace"


def test_argv_uses_the_image_hook_only_without_a_command() -> None:
    env = {"PORT": "8080"}
    with_command = {"image": "img", "command": ["headrace", "node"], "args": ["--port=$(PORT)"]}
    assert container_argv(with_command, env, None) == ["headrace", "node", "--port=8080"]
    image_only = {"image": "img", "args": ["serve"]}
    assert container_argv(image_only, env, ["python", "-m", "x"]) == ["python", "-m", "x", "serve"]
    with pytest.raises(SpecError) as caught:
        container_argv(image_only, env, None)
    assert caught.value.reason == "NoLocalCommand"


def test_only_a_matching_node_selector_is_schedulable() -> None:
    labels = {"kubernetes.io/os": "linux"}
    assert schedule_failure({"spec": {"nodeSelector": labels}}, labels) is None
    assert schedule_failure({"spec": {}}, labels) is None
    reason = schedule_failure({"spec": {"nodeSelector": {"disk": "ssd"}}}, labels)
    assert reason is not None and "disk" in reason


RUNNING = ContainerView(started_once=True, running=True, exit_code=None)
OK = ContainerView(started_once=True, running=False, exit_code=0)
BAD = ContainerView(started_once=True, running=False, exit_code=2)
NEW = ContainerView(started_once=False, running=False, exit_code=None)


@pytest.mark.parametrize(
    ("policy", "main", "phase"),
    [
        ("Always", [NEW], "Pending"),
        ("Always", [RUNNING, NEW], "Running"),
        ("Always", [BAD], "Running"),
        ("Never", [OK, OK], "Succeeded"),
        ("Never", [OK, BAD], "Failed"),
        ("Never", [OK, RUNNING], "Running"),
        ("OnFailure", [OK], "Succeeded"),
        ("OnFailure", [BAD], "Running"),
    ],
)
def test_pod_phase(policy: str, main: list[ContainerView], phase: str) -> None:
    assert pod_phase(policy, [], main, init_done=True) == phase


def test_failed_init_container_fails_the_pod_only_without_restarts() -> None:
    assert pod_phase("Never", [BAD], [NEW], init_done=False) == "Failed"
    assert pod_phase("Always", [BAD], [NEW], init_done=False) == "Pending"


def test_address_pool_skips_the_node_and_does_not_reuse_at_once() -> None:
    pool = AddressPool("127.0.0.0/29", "127.0.0.1")
    first = [pool.allocate() for _ in range(5)]
    assert first == [f"127.0.0.{i}" for i in range(2, 7)]
    with pytest.raises(RuntimeError):
        pool.allocate()
    pool.release("127.0.0.3")
    assert pool.allocate() == "127.0.0.3"
    pool.release("127.0.0.5")
    assert pool.allocate("127.0.0.5") == "127.0.0.5"


UPSTREAM = """module k8s.io/kubernetes

go 1.24.0

require k8s.io/api v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/other/mod => github.com/other/mod v1.2.3
)
"""


def test_go_mod_replaces_each_staging_module_with_its_release() -> None:
    assert staging_version("v1.34.4") == "v0.34.4"
    rendered = render_go_mod(UPSTREAM, "v1.34.4")
    assert "require k8s.io/kubernetes v1.34.4" in rendered
    assert "go 1.24.0" in rendered
    assert parse_replacements(rendered) == {
        "k8s.io/api": "k8s.io/api v0.34.4",
        "k8s.io/client-go": "k8s.io/client-go v0.34.4",
    }
    assert render_replacements(UPSTREAM, "v1.34.4") == parse_replacements(rendered)


@pytest.mark.parametrize(
    ("image", "host"),
    [
        ("headrace-node:e2e", ""),
        ("library/python:3", ""),
        ("ghcr.io/example/headrace-node:0.2.0", "ghcr.io"),
        ("localhost/node:1", "localhost"),
        ("registry.local:5000/node@sha256:ab", "registry.local"),
        ("unpullable.invalid/headrace-node:9", "unpullable.invalid"),
    ],
)
def test_registry_host_is_the_first_component_only_when_it_names_a_host(
    image: str, host: str
) -> None:
    assert registry_host(image) == host


def test_only_an_unresolvable_registry_fails_to_pull_and_backs_off() -> None:
    for present in ("headrace-node:e2e", "ghcr.io/x/node:1", "invalid-name/node:1", "x.invalidx/a"):
        assert pull_failure(present, 1) is None, present
    image = "unpullable.invalid/headrace-node:9"
    first = pull_failure(image, 1)
    assert first is not None and first[0] == "ErrImagePull"
    assert "lookup unpullable.invalid: no such host" in first[1]
    assert pull_failure(image, 2) == ("ImagePullBackOff", f'Back-off pulling image "{image}"')
    assert pull_failure("invalid:5000/node:1", 1) is not None

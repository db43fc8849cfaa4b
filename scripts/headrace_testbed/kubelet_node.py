"""Configuration, Node object, pod address pool and base environment of the kubelet stand-in."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import platform
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from headrace_testbed.kube_build import KUBE_VERSION
from headrace_testbed.kubelet_pod import now_rfc3339
from headrace_testbed.kubelet_spec import Obj


def no_entrypoint(image: str) -> Sequence[str] | None:
    """Default image hook: images are never run, so a container must give its command."""
    del image
    return None


def default_shims() -> dict[str, list[str]]:
    """Commands put first on the containers' PATH, bound to this interpreter."""
    python = sys.executable
    return {"headrace": [python, "-m", "headrace.cli"], "python": [python], "python3": [python]}


@dataclasses.dataclass
class KubeletConfig:
    root: Path
    node_name: str = "headrace-local"
    namespace: str | None = None  # None: pods of all namespaces
    pod_network: str = "127.0.0.0/24"
    node_ip: str = "127.0.0.1"
    entrypoint: Callable[[str], Sequence[str] | None] = no_entrypoint
    shims: Mapping[str, Sequence[str]] = dataclasses.field(default_factory=default_shims)
    extra_env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    inherit_env: Sequence[str] = ("LANG", "LC_ALL", "TZ", "PYTHONPATH")
    capacity: Mapping[str, str] = dataclasses.field(
        default_factory=lambda: {
            "cpu": "16",
            "memory": "64Gi",
            "pods": "110",
            "ephemeral-storage": "100Gi",
        }
    )
    sync_interval_s: float = 0.2
    heartbeat_interval_s: float = 10.0
    watch_timeout_s: int = 60


class AddressPool:
    """Pod IPs from ``network`` (never the node's), handed out round-robin."""

    def __init__(self, network: str, reserved: str) -> None:
        self._free = [
            str(ip) for ip in ipaddress.ip_network(network).hosts() if str(ip) != reserved
        ]
        self._used: set[str] = set()
        self._next = 0

    def allocate(self, preferred: str | None = None) -> str:
        if preferred in self._free and preferred not in self._used:
            self._used.add(preferred)
            return preferred
        for step in range(len(self._free)):
            candidate = self._free[(self._next + step) % len(self._free)]
            if candidate not in self._used:
                self._next = (self._next + step + 1) % len(self._free)
                self._used.add(candidate)
                return candidate
        raise RuntimeError("the pod network has no free address")

    def release(self, ip: str) -> None:
        self._used.discard(ip)


def arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


def node_status(cfg: KubeletConfig) -> Obj:
    now = now_rfc3339()

    def cond(kind: str, ok: bool, reason: str) -> Obj:
        status = "True" if ok else "False"
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    return {
        "capacity": dict(cfg.capacity),
        "allocatable": dict(cfg.capacity),
        "conditions": [
            cond("MemoryPressure", False, "KubeletHasSufficientMemory"),
            cond("DiskPressure", False, "KubeletHasNoDiskPressure"),
            cond("PIDPressure", False, "KubeletHasSufficientPID"),
            cond("Ready", True, "KubeletReady"),
        ],
        "addresses": [
            {"type": "InternalIP", "address": cfg.node_ip},
            {"type": "Hostname", "address": cfg.node_name},
        ],
        "nodeInfo": {
            "machineID": "", "systemUUID": "", "bootID": "", "kernelVersion": platform.release(),
            "osImage": "headrace process runner", "containerRuntimeVersion": "headrace://local",
            "kubeletVersion": KUBE_VERSION, "kubeProxyVersion": "", "operatingSystem": "linux",
            "architecture": arch(),
        },
    }  # fmt: skip


def container_base_env(cfg: KubeletConfig) -> dict[str, str]:
    """Environment every container starts from; writes the shims into ``<root>/bin``."""
    shim_dir = cfg.root / "bin"
    shim_dir.mkdir(parents=True, exist_ok=True)
    for name, argv in cfg.shims.items():
        path = shim_dir / name
        path.write_text(f'#!/bin/sh\nexec {shlex.join(argv)} "$@"\n')
        path.chmod(0o755)
    search = [
        str(shim_dir),
        str(Path(sys.executable).parent),
        os.environ.get("PATH", "/usr/bin:/bin"),
    ]
    env = {name: os.environ[name] for name in cfg.inherit_env if name in os.environ}
    env.setdefault("LANG", "C.UTF-8")
    env["PATH"] = os.pathsep.join(search)
    env.update(cfg.extra_env)
    return env

"""Pure translation of a Pod spec into a local process: env, argv, directories, status.

Everything here works on the API's JSON form of objects (``dict`` with camelCase
keys, as a watch delivers them) and does no I/O, so the kubelet stand-in's
decisions can be checked without a cluster.
"""

from __future__ import annotations

import base64
import dataclasses
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

Obj = dict[str, Any]
# (kind, namespace, name) -> {key: value} of a ConfigMap or Secret, None if it does not exist.
Lookup = Callable[[str, str, str], Mapping[str, bytes] | None]


class SpecError(Exception):
    """The pod cannot be started as written; the message says why (shown as a waiting reason)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


def expand_vars(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, ``$$`` escapes ``$``."""

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "$"
        return env.get(name, match.group(0))

    return _VAR.sub(replace, text)


def field_ref(pod: Obj, path: str, pod_ip: str, node_ip: str) -> str:
    """Value of a downward-API ``fieldRef`` for a pod that runs with ``pod_ip``."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
        "status.hostIP": node_ip,
        "status.hostIPs": node_ip,
    }
    if path in simple:
        return str(simple[path])
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return str(meta.get(match.group(1), {}).get(match.group(2), ""))
    raise SpecError("CreateContainerConfigError", f"unsupported fieldRef {path!r}")


def _lookup_key(lookup: Lookup, kind: str, namespace: str, ref: Obj) -> str | None:
    data = lookup(kind, namespace, ref.get("name", ""))
    value = None if data is None else data.get(ref.get("key", ""))
    if value is None:
        if ref.get("optional"):
            return None
        raise SpecError(
            "CreateContainerConfigError",
            f"{kind} {namespace}/{ref.get('name')} has no key {ref.get('key')!r}",
        )
    return value.decode(errors="replace")


@dataclasses.dataclass(frozen=True)
class EnvContext:
    pod: Obj
    pod_ip: str
    node_ip: str
    lookup: Lookup


def container_env(ctx: EnvContext, container: Obj, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of one container, in Kubernetes' precedence order."""
    namespace = ctx.pod["metadata"]["namespace"]
    env = dict(base)
    for source in container.get("envFrom", []):
        kind = "ConfigMap" if "configMapRef" in source else "Secret"
        ref = source.get("configMapRef") or source.get("secretRef") or {}
        data = ctx.lookup(kind, namespace, ref.get("name", ""))
        if data is None and not ref.get("optional"):
            raise SpecError("CreateContainerConfigError", f"{kind} {ref.get('name')!r} not found")
        prefix = source.get("prefix", "")
        for key, raw in (data or {}).items():
            env[prefix + key] = raw.decode(errors="replace")
    for item in container.get("env", []):
        name = item["name"]
        source = item.get("valueFrom")
        if source is None:
            env[name] = expand_vars(item.get("value", ""), env)
        elif "fieldRef" in source:
            env[name] = field_ref(ctx.pod, source["fieldRef"]["fieldPath"], ctx.pod_ip, ctx.node_ip)
        elif "configMapKeyRef" in source or "secretKeyRef" in source:
            kind = "ConfigMap" if "configMapKeyRef" in source else "Secret"
            ref = source.get("configMapKeyRef") or source.get("secretKeyRef") or {}
            found = _lookup_key(ctx.lookup, kind, namespace, ref)
            if found is not None:
                env[name] = found
        else:
            raise SpecError("CreateContainerConfigError", f"env {name}: unsupported valueFrom")
    return env


def volume_dirs(pod: Obj, pod_dir: Path, pvc_root: Path) -> dict[str, Path]:
    """Local directory backing each volume; a PVC's outlives the pod (keyed by claim name)."""
    namespace = pod["metadata"]["namespace"]
    dirs: dict[str, Path] = {}
    for volume in pod.get("spec", {}).get("volumes", []):
        name = volume["name"]
        claim = volume.get("persistentVolumeClaim")
        if claim is not None:
            dirs[name] = pvc_root / namespace / claim["claimName"]
        else:
            dirs[name] = pod_dir / "volumes" / name
    return dirs


def volume_files(volume: Obj, namespace: str, lookup: Lookup) -> dict[str, bytes] | None:
    """Files to write into a configMap/secret volume; None for volumes that start empty."""
    source = volume.get("configMap") or volume.get("secret")
    if source is None:
        return None
    kind = "ConfigMap" if "configMap" in volume else "Secret"
    name = source.get("name") or source.get("secretName", "")
    data = lookup(kind, namespace, name)
    if data is None:
        if source.get("optional"):
            return {}
        raise SpecError("ContainerCreating", f"{kind} {namespace}/{name} for volume not found")
    items = source.get("items")
    if not items:
        return dict(data)
    return {item["path"]: data[item["key"]] for item in items if item["key"] in data}


def decode_secret(data: Mapping[str, str] | None) -> dict[str, bytes]:
    return {key: base64.b64decode(value) for key, value in (data or {}).items()}


def mounts(container: Obj, dirs: Mapping[str, Path]) -> list[tuple[str, Path]]:
    """``(mountPath, local directory)`` for a container, longest mount path first."""
    found: list[tuple[str, Path]] = []
    for mount in container.get("volumeMounts", []):
        local = dirs.get(mount["name"])
        if local is None:
            raise SpecError("CreateContainerConfigError", f"no volume named {mount['name']!r}")
        if mount.get("subPath"):
            local = local / mount["subPath"]
        found.append((mount["mountPath"].rstrip("/") or "/", local))
    return sorted(found, key=lambda item: len(item[0]), reverse=True)


def rewrite_paths(value: str, mount_list: Sequence[tuple[str, Path]]) -> str:
    """Map an in-container path (whole value or after ``=``) onto its local directory."""
    for mount_path, local in mount_list:
        match = re.search(rf"(^|=){re.escape(mount_path)}(?=/|$)", value)
        if match is not None:
            return value[: match.end(1)] + str(local) + value[match.end() :]
    return value


def container_argv(
    container: Obj, env: Mapping[str, str], entrypoint: Sequence[str] | None
) -> list[str]:
    """``command + args`` after ``$(VAR)`` expansion; ``entrypoint`` stands in for the image's."""
    command = list(container.get("command") or [])
    if not command:
        if entrypoint is None:
            raise SpecError(
                "NoLocalCommand",
                f"image {container.get('image')!r} is not run: give the container a command",
            )
        command = list(entrypoint)
    argv = [expand_vars(part, env) for part in [*command, *(container.get("args") or [])]]
    if not argv:
        raise SpecError("NoLocalCommand", "empty command")
    return argv


UNRESOLVABLE_TLD = ".invalid"
"""Registry hosts in this top-level domain never resolve (RFC 6761 reserves it)."""


def registry_host(image: str) -> str:
    """The registry host of an image reference ("" for Docker Hub's short names):
    the first path component when it has a ``.`` or ``:`` or is ``localhost``,
    as container runtimes parse references."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first.rsplit(":", 1)[0] if ":" in first else first
    return ""


def pull_failure(image: str, attempts: int) -> tuple[str, str] | None:
    """The waiting ``(reason, message)`` a kubelet reports after ``attempts``
    failed pulls of ``image``, or None when the stand-in takes the image as
    present. A registry host in ``.invalid`` cannot resolve, so every pull
    fails: ``ErrImagePull`` after the first attempt, ``ImagePullBackOff`` while
    backing off before the next ones (as a kubelet alternates them)."""
    host = registry_host(image)
    if not (host == UNRESOLVABLE_TLD[1:] or host.endswith(UNRESOLVABLE_TLD)):
        return None
    if attempts <= 1:
        return (
            "ErrImagePull",
            f'failed to pull and unpack image "{image}": failed to resolve reference '
            f'"{image}": dial tcp: lookup {host}: no such host',
        )
    return "ImagePullBackOff", f'Back-off pulling image "{image}"'


def schedule_failure(pod: Obj, node_labels: Mapping[str, str]) -> str | None:
    """Why the single node cannot take the pod (nodeSelector only), or None."""
    selector: Mapping[str, str] = pod.get("spec", {}).get("nodeSelector") or {}
    wrong = sorted(key for key, value in selector.items() if node_labels.get(key) != value)
    if wrong:
        return f"0/1 nodes are available: node does not match nodeSelector {', '.join(wrong)}"
    return None


@dataclasses.dataclass(frozen=True)
class ContainerView:
    """What the phase computation needs to know about one container."""

    started_once: bool
    running: bool
    exit_code: int | None


def pod_phase(
    restart_policy: str,
    init: Sequence[ContainerView],
    main: Sequence[ContainerView],
    init_done: bool,
) -> str:
    """The pod phase the kubelet would report."""
    if not init_done:
        failed = any(c.exit_code not in (None, 0) and not c.running for c in init)
        return "Failed" if failed and restart_policy == "Never" else "Pending"
    if not main or not all(c.started_once for c in main):
        return "Running" if any(c.running for c in main) else "Pending"
    if any(c.running for c in main) or restart_policy == "Always":
        return "Running"
    codes = [c.exit_code for c in main]
    if all(code == 0 for code in codes):
        return "Succeeded"
    if restart_policy == "OnFailure":
        return "Running"
    return "Failed"


def condition(kind: str, value: bool, since: str, reason: str = "") -> Obj:
    found: Obj = {"type": kind, "status": "True" if value else "False", "lastTransitionTime": since}
    if reason:
        found["reason"] = reason
    return found


def readiness_gates_pass(pod: Obj) -> bool:
    """True when every ``spec.readinessGates`` condition is set True by someone else."""
    gates = [g["conditionType"] for g in pod.get("spec", {}).get("readinessGates") or []]
    present = {c["type"]: c.get("status") for c in pod.get("status", {}).get("conditions") or []}
    return all(present.get(gate) == "True" for gate in gates)

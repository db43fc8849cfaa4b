"""Helpers of the end-to-end scenarios, built on public entry points only.

* :class:`Kube`: kubectl-style requests (server-side apply, get, list, merge
  patch, delete) through the ``kubernetes`` client's REST layer, with API
  discovery as kubectl does it; failures raise :class:`ApiError`.
* :class:`OperatorProcess`: ``python -m headrace_operator`` as shipped.
* :func:`service_account_kubeconfig`: a kubeconfig holding only a
  ServiceAccount token (what the chart's operator pod would run with).

The Headrace side (client traffic, the metastore's assignment history) is in
:mod:`e2e.streams`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import kubernetes
import urllib3
import yaml
from kubernetes.client.exceptions import ApiException

from headrace import errors
from headrace_testbed.ports import LOOPBACK, free_port

REPO = Path(__file__).resolve().parents[1]
CRD_DIR = REPO / "crds"
CHART = REPO / "charts" / "headrace-operator"
GROUP = "streaming.headrace.io"
API_VERSION = f"{GROUP}/v1alpha1"
PAUSED = f"{GROUP}/paused"
CLUSTER_LABEL = f"{GROUP}/cluster"
FIELD_MANAGER = "headrace-e2e"
REQUEST_TIMEOUT_S = 30.0


class ApiError(errors.HeadraceError):
    """An API server answer other than success (``status`` 0: no answer)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, retryable=status in (0, 409, 429) or status >= 500)
        self.status = status


def _answer_message(body: bytes | str | None) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    with contextlib.suppress(ValueError):
        parsed = json.loads(text)
        if isinstance(parsed, dict) and parsed.get("message"):
            return str(parsed["message"])
    return text[:2000]


class Kube:
    """A kubectl-like client on one ``kubernetes.client.ApiClient``."""

    def __init__(self, api_client: Any) -> None:
        self.api = api_client
        self._kinds: dict[tuple[str, str], tuple[str, bool]] = {}

    @classmethod
    def from_kubeconfig(cls, path: Path | str) -> Kube:
        client = kubernetes.config.new_client_from_config(config_file=str(path))  # type: ignore[no-untyped-call]
        return cls(client)

    def close(self) -> None:
        self.api.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Iterable[tuple[str, str]] = (),
        body: Any = None,
        content_type: str = "application/json",
    ) -> Any:
        """One REST call; the decoded JSON answer, None for 404 on GET/DELETE."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        what = f"{method} {path}"
        params = self.api.param_serialize(
            method,
            path,
            query_params=list(query),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api.call_api(*params, _request_timeout=REQUEST_TIMEOUT_S)
            data = response.read()
        except ApiException as exc:
            status, data = exc.status or 0, exc.body
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ApiError(0, f"{what}: {exc}") from None
        else:
            status = int(response.status)
        if status == 404 and method in ("GET", "DELETE"):
            return None
        if not 200 <= status <= 299:
            raise ApiError(status, f"{what}: {_answer_message(data)}")
        return json.loads(data) if data else None

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self.request, method, path, **kwargs)

    def _discover(self, api_version: str) -> None:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        listing = self.request("GET", base) or {}
        for resource in listing.get("resources", []):
            if "/" not in resource["name"]:
                key = (api_version, resource["kind"])
                self._kinds[key] = (resource["name"], bool(resource["namespaced"]))

    def path(
        self, api_version: str, kind: str, namespace: str = "", name: str = "", sub: str = ""
    ) -> str:
        """The REST path of a kind (collection without ``name``), found by discovery."""
        if (api_version, kind) not in self._kinds:
            self._discover(api_version)
        found = self._kinds.get((api_version, kind))
        if found is None:
            raise ApiError(404, f"the API server does not serve {kind} in {api_version}")
        plural, namespaced = found
        path = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        if namespaced:
            path += f"/namespaces/{namespace}"
        path += f"/{plural}"
        return path + (f"/{name}" if name else "") + (f"/{sub}" if sub else "")

    async def apply(self, obj: Mapping[str, Any], *, dry_run: bool = False) -> Any:
        """``kubectl apply --server-side --force-conflicts``."""
        meta = obj["metadata"]
        path = await asyncio.to_thread(
            self.path, obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]
        )
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        if dry_run:
            query.append(("dryRun", "All"))
        return await self.call(
            "PATCH", path, query=query, body=dict(obj), content_type="application/apply-patch+yaml"
        )

    async def create(self, obj: Mapping[str, Any]) -> Any:
        namespace = obj["metadata"].get("namespace", "")
        path = await asyncio.to_thread(self.path, obj["apiVersion"], obj["kind"], namespace)
        return await self.call("POST", path, body=dict(obj))

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Any:
        path = await asyncio.to_thread(self.path, api_version, kind, namespace, name)
        return await self.call("GET", path)

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str] | None = None
    ) -> list[dict[str, Any]]:
        path = await asyncio.to_thread(self.path, api_version, kind, namespace)
        query = [("labelSelector", ",".join(f"{k}={v}" for k, v in (labels or {}).items()))]
        answer = await self.call("GET", path, query=query if labels else [])
        return list((answer or {}).get("items") or [])

    async def patch(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        sub: str = "",
    ) -> Any:
        """``kubectl patch --type merge``."""
        path = await asyncio.to_thread(self.path, api_version, kind, namespace, name, sub)
        return await self.call(
            "PATCH", path, body=dict(patch), content_type="application/merge-patch+json"
        )

    async def delete(
        self, api_version: str, kind: str, namespace: str, name: str, *, grace_s: int | None = None
    ) -> bool:
        """``kubectl delete`` (``--grace-period``); False if it did not exist."""
        path = await asyncio.to_thread(self.path, api_version, kind, namespace, name)
        body: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
        }
        if grace_s is not None:
            body["gracePeriodSeconds"] = grace_s
        return await self.call("DELETE", path, body=body) is not None

    async def who_am_i(self) -> str:
        """The user name the API server authenticates this client as."""
        review = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        answer = await self.call(
            "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body=review
        )
        return str(answer["status"]["userInfo"]["username"])

    async def can_i(self, verb: str, resource: str, namespace: str, group: str = "") -> bool:
        """``kubectl auth can-i`` for this client."""
        attributes = {"verb": verb, "resource": resource, "namespace": namespace, "group": group}
        review = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attributes},
        }
        answer = await self.call(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body=review
        )
        return bool(answer["status"].get("allowed"))


async def apply_crds(kube: Kube) -> tuple[str, ...]:
    """``kubectl apply --server-side -f crds/``, then wait until each is Established."""
    names = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                await kube.apply(doc)
                names.append(doc["metadata"]["name"])

    async def established() -> bool:
        for name in names:
            crd = await kube.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", "", name)
            conditions = ((crd or {}).get("status") or {}).get("conditions") or []
            if not any(c["type"] == "Established" and c["status"] == "True" for c in conditions):
                return False
        return True

    await until(established, "the CRDs Established", limit=60, every=0.1)
    return tuple(names)


def service_account_kubeconfig(
    admin: Kube, namespace: str, account: str, *, server: str, ca_file: str, out: Path
) -> Path:
    """Write a kubeconfig that authenticates as ``namespace/account`` (TokenRequest)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": 3600},
    }
    path = f"/api/v1/namespaces/{namespace}/serviceaccounts/{account}/token"
    token = admin.request("POST", path, body=request)["status"]["token"]
    user = f"system:serviceaccount:{namespace}:{account}"
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "e2e", "cluster": {"server": server, "certificate-authority": ca_file}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}],
        "current-context": "e2e",
    }
    out.write_text(json.dumps(document, indent=2))
    out.chmod(0o600)
    return out


class OperatorProcess:
    """``python -m headrace_operator`` watching one namespace, logging to a file,
    with its liveness endpoint on a loopback port."""

    def __init__(self, kubeconfig: Path, namespace: str, log: Path, resync_s: float) -> None:
        env = dict(os.environ)
        extra = [str(REPO / "operator"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in extra if p)
        self.log_path = log
        self._log = log.open("ab")
        self.liveness = f"http://{LOOPBACK}:{free_port()}/healthz"
        argv = [
            sys.executable,
            "-m",
            "headrace_operator",
            f"--kubeconfig={kubeconfig}",
            f"--namespace={namespace}",
            f"--resync-seconds={resync_s:g}",
            f"--liveness={self.liveness}",
        ]
        self.process = subprocess.Popen(
            argv, env=env, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def healthy(self) -> bool:
        """Whether the liveness endpoint answers 200 (kopf is up and serving)."""
        try:
            with urllib.request.urlopen(self.liveness, timeout=2.0) as answer:
                return int(answer.status) == 200
        except OSError:
            return False

    def wait_healthy(self, limit: float = 60.0) -> None:
        deadline = time.monotonic() + limit
        while not self.healthy():
            if not self.alive() or time.monotonic() > deadline:
                raise AssertionError(f"the operator did not come up:\n{self.log_tail()}")
            time.sleep(0.2)

    def log_tail(self, limit: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-limit:]

    def stop(self, timeout: float = 30.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        self._log.close()
        return int(self.process.returncode)


def cluster_manifest(
    name: str,
    namespace: str,
    etcd_endpoint: str,
    *,
    nodes: int = 3,
    pchannels: int = 16,
    lease_ttl_s: int = 3,
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A StreamingCluster with a local WAL and the given etcd as metastore."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": API_VERSION,
        "kind": "StreamingCluster",
        "metadata": meta,
        "spec": {
            "nodes": nodes,
            "pchannels": pchannels,
            "image": "headrace-node:e2e",
            "version": "0.1.0",
            "leaseTTLSeconds": lease_ttl_s,
            "deleteDataOnDelete": True,
            "metastore": {"etcdEndpoints": [etcd_endpoint]},
            "wal": {"backend": "local", "local": {"size": "1Gi"}},
        },
    }


async def until(
    check: Callable[[], Awaitable[bool]], what: str, limit: float = 90.0, every: float = 0.25
) -> float:
    """Poll ``check`` until it holds; the seconds it took (AssertionError on ``limit``)."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > limit:
            raise AssertionError(f"not reached within {limit:g}s: {what}")
        await asyncio.sleep(every)
    return time.monotonic() - start


def condition(body: Mapping[str, Any] | None, kind: str) -> dict[str, Any]:
    for item in ((body or {}).get("status") or {}).get("conditions") or []:
        if item.get("type") == kind:
            return dict(item)
    return {}


def is_ready(body: Mapping[str, Any] | None) -> bool:
    return condition(body, "Ready").get("status") == "True"


def live_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Pods by name, without the terminating ones."""
    return {
        p["metadata"]["name"]: dict(p) for p in pods if not p["metadata"].get("deletionTimestamp")
    }


def pod_ready(pod: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (pod.get("status") or {}).get("conditions") or []
    )


def placement(assignments: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """pchannel -> status of its PChannelAssignment (node, term, state, ...)."""
    return {a["spec"]["pchannel"]: dict(a.get("status") or {}) for a in assignments}


def load(status_by_pchannel: Mapping[str, Mapping[str, Any]]) -> dict[str, int]:
    """node -> pchannels it serves (ASSIGNED)."""
    counts: dict[str, int] = {}
    for status in status_by_pchannel.values():
        if status.get("state") == "ASSIGNED":
            counts[status["node"]] = counts.get(status["node"], 0) + 1
    return counts

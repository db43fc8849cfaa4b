"""The Kubernetes API edge: get, list, server-side apply, merge patch, delete.

The only module that calls the ``kubernetes`` client. Requests are plain REST
calls on the client's authenticated connection pool (the REST paths come from a
small table of the kinds the operator manages, so no discovery round trip is
needed), run in a worker thread because the client is synchronous. Every
failure is translated into :mod:`headrace_operator.errors`:

=========  ========================  =========
status     error                     retry?
=========  ========================  =========
404        ``None`` / ``False`` for get / delete; KubeNotFound otherwise   no
409        KubeConflict              yes
403        KubeForbidden             no (fix RBAC)
400, 422   KubeInvalid               no
429, 5xx   KubeUnavailable           yes
network    KubeUnavailable           yes
=========  ========================  =========
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from headrace_operator import models, sparkapps
from headrace_operator.builders import FIELD_MANAGER
from headrace_operator.errors import (
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)
from headrace_operator.interfaces import Object

log = logging.getLogger(__name__)

PLURALS: dict[tuple[str, str], str] = {
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "Pod"): "pods",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "ServiceAccount"): "serviceaccounts",
    ("v1", "Event"): "events",
    ("v1", "Secret"): "secrets",
    ("v1", "Namespace"): "namespaces",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("rbac.authorization.k8s.io/v1", "Role"): "roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "rolebindings",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "clusterrolebindings",
    ("apps/v1", "Deployment"): "deployments",
    ("networking.k8s.io/v1", "NetworkPolicy"): "networkpolicies",
    ("apiextensions.k8s.io/v1", "CustomResourceDefinition"): "customresourcedefinitions",
    (models.API_VERSION, "StreamingCluster"): "streamingclusters",
    (models.API_VERSION, "PChannelAssignment"): "pchannelassignments",
    (models.API_VERSION, "UpgradePlan"): "upgradeplans",
    (sparkapps.KUBEFLOW_API, sparkapps.KIND): "sparkapplications",
    (sparkapps.APACHE_API, sparkapps.KIND): "sparkapplications",
}
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
REQUEST_TIMEOUT_S = 30.0


def resource_path(
    api_version: str, kind: str, namespace: str = "", name: str = "", subresource: str = ""
) -> str:
    """The REST path of a kind (collection when ``name`` is empty)."""
    plural = PLURALS.get((api_version, kind))
    if plural is None:
        raise KubeInvalid(f"the operator does not manage {kind} ({api_version})")
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    path = base
    if kind not in CLUSTER_SCOPED:
        if not namespace:
            raise KubeInvalid(f"{kind} {name!r} needs a namespace")
        path += f"/namespaces/{quote(namespace, safe='')}"
    path += f"/{plural}"
    if name:
        path += f"/{quote(name, safe='')}"
    if subresource:
        path += f"/{subresource}"
    return path


def _message(status: int, body: bytes | str | None) -> str:
    text = body.decode(errors="replace") if isinstance(body, bytes) else (body or "")
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:2000] or f"HTTP {status}"
    if isinstance(parsed, dict) and parsed.get("message"):
        return str(parsed["message"])
    return text[:2000]


def translate(status: int, body: bytes | str | None, what: str) -> Exception:
    """The operator error for an API server answer (pure)."""
    message = f"{what}: {_message(status, body)}"
    if status == 404:
        return KubeNotFound(message)
    if status == 409:
        return KubeConflict(message)
    if status in (401, 403):
        return KubeForbidden(message)
    if status in (400, 422):
        return KubeInvalid(message)
    if status == 429 or status >= 500:
        return KubeUnavailable(message)
    return KubeInvalid(message)


def load_api_client(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    """An authenticated client: ``kubeconfig`` if given, else in-cluster
    credentials, else ``$KUBECONFIG`` / ``~/.kube/config``."""
    return kubernetes.client.ApiClient(load_configuration(kubeconfig))


def load_configuration(kubeconfig: str | None = None) -> kubernetes.client.Configuration:
    """The client configuration :func:`load_api_client` uses."""
    configuration = kubernetes.client.Configuration()
    try:
        if kubeconfig:
            kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, client_configuration=configuration
            )
        else:
            try:
                kubernetes.config.load_incluster_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(  # type: ignore[no-untyped-call]
                    client_configuration=configuration
                )
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise KubeUnavailable(f"no usable Kubernetes credentials: {exc}") from None
    return configuration


class KubernetesApi:
    """:class:`~.interfaces.KubeApi` on a real API server."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self.api_client = api_client

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str | None = None) -> KubernetesApi:
        return cls(load_api_client(kubeconfig))

    def close(self) -> None:
        self.api_client.close()  # type: ignore[no-untyped-call]

    def _call(
        self,
        method: str,
        path: str,
        *,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self.api_client.param_serialize(
            method,
            path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            response = self.api_client.call_api(*request, _request_timeout=REQUEST_TIMEOUT_S)
            data = response.read()  # type: ignore[no-untyped-call]
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise KubeUnavailable(f"{method} {path}: {exc}") from None
        except ApiException as exc:
            raise translate(exc.status or 0, exc.body, f"{method} {path}") from None
        status = int(response.status)
        if status == 404:
            return status, None
        if not 200 <= status <= 299:
            raise translate(status, data, f"{method} {path}")
        return status, json.loads(data) if data else None

    async def _run(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        return await asyncio.to_thread(self._call, method, path, **kwargs)

    async def get(self, api_version: str, kind: str, namespace: str, name: str) -> Object | None:
        _status, data = await self._run("GET", resource_path(api_version, kind, namespace, name))
        return data if isinstance(data, dict) else None

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[Object]:
        query = []
        if labels:
            query.append(("labelSelector", ",".join(f"{k}={v}" for k, v in labels.items())))
        path = resource_path(api_version, kind, namespace)
        status, data = await self._run("GET", path, query=query)
        if status == 404 or not isinstance(data, dict):
            raise KubeNotFound(f"cannot list {kind} ({api_version}): the API is not served")
        items: list[Object] = data.get("items") or []
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items

    async def apply(self, obj: Mapping[str, Any]) -> Object:
        meta = obj["metadata"]
        path = resource_path(
            obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]
        )
        query = [("fieldManager", FIELD_MANAGER), ("force", "true")]
        status, data = await self._run(
            "PATCH", path, query=query, body=dict(obj), content_type="application/apply-patch+yaml"
        )
        if status == 404 or not isinstance(data, dict):
            raise KubeNotFound(f"cannot apply {obj['kind']} {meta['name']}: the API is not served")
        return data

    async def patch_merge(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str = "",
    ) -> Object:
        path = resource_path(api_version, kind, namespace, name, subresource)
        status, data = await self._run(
            "PATCH", path, body=dict(patch), content_type="application/merge-patch+json"
        )
        if status == 404 or not isinstance(data, dict):
            raise KubeNotFound(f"{kind} {namespace}/{name} does not exist")
        return data

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        path = resource_path(api_version, kind, namespace, name)
        body = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
        status, _data = await self._run("DELETE", path, body=body)
        return status != 404

    async def create(self, obj: Mapping[str, Any]) -> Object:
        namespace = obj.get("metadata", {}).get("namespace", "")
        path = resource_path(obj["apiVersion"], obj["kind"], namespace)
        status, data = await self._run("POST", path, body=dict(obj))
        if status == 404 or not isinstance(data, dict):
            raise KubeNotFound(f"cannot create {obj['kind']}: the API or namespace is missing")
        return data

    async def served(self, api_version: str, kind: str) -> bool:
        """API discovery: whether ``api_version`` lists ``kind`` (a missing
        group or version answers 404, i.e. False)."""
        base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        status, data = await self._run("GET", base)
        if status == 404 or not isinstance(data, dict):
            return False
        return any(
            r.get("kind") == kind and "/" not in str(r.get("name", ""))
            for r in data.get("resources") or []
        )

    async def dry_run_apply(self, obj: Mapping[str, Any]) -> Object:
        """Server-side apply with ``dryRun=All`` (validation only, nothing stored)."""
        meta = obj["metadata"]
        path = resource_path(
            obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]
        )
        query = [("fieldManager", FIELD_MANAGER), ("force", "true"), ("dryRun", "All")]
        status, data = await self._run(
            "PATCH", path, query=query, body=dict(obj), content_type="application/apply-patch+yaml"
        )
        if status == 404 or not isinstance(data, dict):
            raise KubeNotFound(f"cannot apply {obj['kind']} {meta['name']}: the API is not served")
        return data

"""An in-memory stand-in for the API server behind ``KubeApi``.

It behaves like the API server for what the operator uses: server-side apply
creates or updates, removing the fields the same manager applied before and
dropped now; ``metadata.generation`` moves when the spec changes; merge patch
(``None`` deletes a key) on the object or its ``status`` subresource;
``generateName`` (a name taken answers 409); label-selected lists; discovery of
the operator's own kinds and of ``served_kinds``; deletion of a missing object reports
``False``. Pods are deleted at once (there is no kubelet to wait for).
"""

from __future__ import annotations

import copy
import datetime
import itertools
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from headrace_operator import models
from headrace_operator.errors import KubeConflict, KubeNotFound

Key = tuple[str, str, str, str]


def _remove_owned(current: dict[str, Any], applied: Mapping[str, Any]) -> None:
    for key, value in applied.items():
        if key not in current:
            continue
        if isinstance(value, Mapping) and isinstance(current[key], dict):
            _remove_owned(current[key], value)
            if not current[key]:
                del current[key]
        else:
            del current[key]


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


class FakeKube:
    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.applied: dict[Key, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, str]] = []
        """(verb, kind, name) of every write."""
        self._versions = itertools.count(1)
        self.served_kinds: set[tuple[str, str]] = set()
        """(apiVersion, kind) of the custom resources discovery lists beyond the
        operator's own (e.g. a Spark operator's SparkApplication)."""
        self.clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
        """Gives ``metadata.creationTimestamp`` of created objects."""

    @staticmethod
    def _key(api_version: str, kind: str, namespace: str, name: str) -> Key:
        return (api_version, kind, namespace, name)

    def _stamp(self, obj: dict[str, Any]) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    def writes(self, verb: str = "", kind: str = "") -> list[tuple[str, str, str]]:
        return [
            r for r in self.requests if (not verb or r[0] == verb) and (not kind or r[1] == kind)
        ]

    async def get(
        self, api_version: str, kind: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        obj = self.objects.get(self._key(api_version, kind, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    async def list(
        self, api_version: str, kind: str, namespace: str, labels: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        found = []
        for (version, k, ns, _name), obj in sorted(self.objects.items()):
            have = obj["metadata"].get("labels") or {}
            if (version, k, ns) == (api_version, kind, namespace) and all(
                have.get(key) == value for key, value in labels.items()
            ):
                found.append(copy.deepcopy(obj))
        return found

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        key = self._key(obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"])
        self.requests.append(("apply", obj["kind"], meta["name"]))
        current = self.objects.get(key)
        if current is None:
            current = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": {}}
            current["metadata"].update(
                uid=str(uuid.uuid4()),
                generation=1,
                creationTimestamp="2026-01-01T00:00:00Z",
            )
            spec_before = None
        else:
            spec_before = copy.deepcopy(current.get("spec"))
            _remove_owned(current, self.applied.get(key, {}))
            current.setdefault("metadata", {})
        _merge(current, copy.deepcopy(dict(obj)))
        for field in ("uid", "generation", "creationTimestamp"):
            current["metadata"].setdefault(field, 1 if field == "generation" else "x")
        if spec_before is not None and current.get("spec") != spec_before:
            current["metadata"]["generation"] += 1
        self._stamp(current)
        self.objects[key] = current
        self.applied[key] = copy.deepcopy(dict(obj))
        return copy.deepcopy(current)

    async def patch_merge(
        self,
        api_version: str,
        kind: str,
        namespace: str,
        name: str,
        patch: Mapping[str, Any],
        *,
        subresource: str = "",
    ) -> dict[str, Any]:
        key = self._key(api_version, kind, namespace, name)
        current = self.objects.get(key)
        if current is None:
            raise KubeNotFound(f"{kind} {namespace}/{name} does not exist")
        self.requests.append((f"patch{'/' + subresource if subresource else ''}", kind, name))
        if subresource == "status":
            patch = {"status": patch.get("status")}
        else:
            patch = {k: v for k, v in patch.items() if k != "status"}
        spec_before = copy.deepcopy(current.get("spec"))
        _merge(current, patch)
        if current.get("spec") != spec_before:
            current["metadata"]["generation"] += 1
        self._stamp(current)
        return copy.deepcopy(current)

    async def delete(self, api_version: str, kind: str, namespace: str, name: str) -> bool:
        key = self._key(api_version, kind, namespace, name)
        self.requests.append(("delete", kind, name))
        self.applied.pop(key, None)
        return self.objects.pop(key, None) is not None

    async def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        body = copy.deepcopy(dict(obj))
        meta = body["metadata"]
        if not meta.get("name"):
            meta["name"] = f"{meta.get('generateName', 'obj-')}{uuid.uuid4().hex[:8]}"
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", self.clock().strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._stamp(body)
        key = self._key(body["apiVersion"], body["kind"], meta.get("namespace", ""), meta["name"])
        if key in self.objects:
            raise KubeConflict(f"{body['kind']} {meta['name']} already exists")
        self.objects[key] = body
        self.requests.append(("create", body["kind"], meta["name"]))
        return copy.deepcopy(body)

    async def served(self, api_version: str, kind: str) -> bool:
        return api_version == models.API_VERSION or (api_version, kind) in self.served_kinds

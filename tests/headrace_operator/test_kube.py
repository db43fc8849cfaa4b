"""The Kubernetes API edge: paths, error translation, and calls on a real server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from headrace import errors
from headrace_operator import builders, models
from headrace_operator.errors import (
    KubeConflict,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeUnavailable,
)
from headrace_operator.kube import KubernetesApi, resource_path, translate
from tests.fixtures_kube import KubeTestbed


def test_resource_paths() -> None:
    assert resource_path("v1", "Pod", "ns", "p-0") == "/api/v1/namespaces/ns/pods/p-0"
    assert (
        resource_path(models.API_VERSION, "StreamingCluster", "ns", "c", "status")
        == "/apis/streaming.headrace.io/v1alpha1/namespaces/ns/streamingclusters/c/status"
    )
    assert resource_path("v1", "Namespace", "", "ns") == "/api/v1/namespaces/ns"
    with pytest.raises(KubeInvalid):
        resource_path("v1", "Secret", "", "s")
    with pytest.raises(KubeInvalid):
        resource_path("apps/v1", "StatefulSet", "ns", "s")


@pytest.mark.parametrize(
    ("status", "kind", "retryable"),
    [
        (404, KubeNotFound, False),
        (409, KubeConflict, True),
        (403, KubeForbidden, False),
        (422, KubeInvalid, False),
        (400, KubeInvalid, False),
        (429, KubeUnavailable, True),
        (503, KubeUnavailable, True),
    ],
)
def test_translate(status: int, kind: type[Exception], retryable: bool) -> None:
    body = b'{"kind":"Status","message":"pods \\"x\\" is forbidden: nope"}'
    error = translate(status, body, "GET /api/v1/pods")
    assert type(error) is kind
    assert isinstance(error, errors.HeadraceError) and error.retryable is retryable
    assert 'pods "x" is forbidden: nope' in str(error)
    assert "HTTP 500" in str(translate(500, b"", "GET /"))


async def test_unreachable_server_is_retryable(tmp_path: object) -> None:
    import kubernetes  # noqa: PLC0415

    configuration = kubernetes.client.Configuration()
    configuration.host = "https://127.0.0.1:1"
    configuration.retries = 0
    api = KubernetesApi(kubernetes.client.ApiClient(configuration))
    with pytest.raises(KubeUnavailable) as raised:
        await api.get("v1", "Pod", "ns", "p")
    assert raised.value.retryable
    api.close()


@pytest.fixture
async def real(kube_cluster: KubeTestbed) -> AsyncIterator[tuple[KubernetesApi, str]]:
    api = KubernetesApi(kube_cluster.api_client())
    namespace = f"kube-{uuid.uuid4().hex[:8]}"
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    yield api, namespace
    await api.delete("v1", "Namespace", "", namespace)
    api.close()


@pytest.mark.kube
async def test_calls_on_a_real_server(real: tuple[KubernetesApi, str]) -> None:
    api, ns = real
    assert await api.get("v1", "ConfigMap", ns, "missing") is None
    assert await api.delete("v1", "ConfigMap", ns, "missing") is False
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "cm", "namespace": ns, "labels": {"a": "1"}},
        "data": {"k": "v", "gone": "soon"},
    }
    created = await api.apply(body)
    assert created["data"] == {"k": "v", "gone": "soon"}
    reapplied = await api.apply({**body, "data": {"k": "v2"}})
    assert reapplied["data"] == {"k": "v2"}, "server-side apply drops fields the manager dropped"
    managers = {m["manager"] for m in reapplied["metadata"]["managedFields"]}
    assert builders.FIELD_MANAGER in managers
    patched = await api.patch_merge("v1", "ConfigMap", ns, "cm", {"data": {"x": "y"}})
    assert patched["data"] == {"k": "v2", "x": "y"}
    assert [o["metadata"]["name"] for o in await api.list("v1", "ConfigMap", ns, {"a": "1"})] == [
        "cm"
    ]
    assert await api.list("v1", "ConfigMap", ns, {"a": "2"}) == []
    event = await api.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": "cm.", "namespace": ns},
            "involvedObject": {"kind": "ConfigMap", "name": "cm", "namespace": ns},
            "reason": "Tested",
            "message": "m",
        }
    )
    assert event["metadata"]["name"].startswith("cm.")
    with pytest.raises(KubeInvalid):
        await api.apply({**body, "metadata": {**body["metadata"], "name": "Not_Valid"}})
    with pytest.raises(KubeNotFound):
        await api.patch_merge("v1", "ConfigMap", ns, "absent", {"data": {"x": "y"}})
    assert await api.delete("v1", "ConfigMap", ns, "cm") is True
    assert await api.get("v1", "ConfigMap", ns, "cm") is None


@pytest.mark.kube
async def test_discovery_says_what_the_server_serves(real: tuple[KubernetesApi, str]) -> None:
    api, _ns = real
    assert await api.served("v1", "Pod") is True
    assert await api.served("apps/v1", "Deployment") is True
    assert await api.served("apps/v1", "SparkApplication") is False
    assert await api.served("nosuch.example.com/v1", "SparkApplication") is False, (
        "a group the server does not know is not served (404), not an error"
    )

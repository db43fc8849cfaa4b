"""The generated CRDs on a real kube-apiserver: OpenAPI and CEL validation.

Every invalid spec of ``test_models.py`` is sent to the API server, which must
reject it with a message naming the same field the model names.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from headrace_operator import models
from headrace_operator.errors import KubeInvalid
from headrace_operator.kube import KubernetesApi
from tests.fixtures_kube import KubeTestbed
from tests.headrace_operator.op_harness import install_crds
from tests.headrace_operator.test_models import INVALID, valid

pytestmark = [pytest.mark.kube, pytest.mark.timeout(300)]


@pytest.fixture
async def kube(kube_cluster: KubeTestbed) -> AsyncIterator[tuple[KubernetesApi, str]]:
    api = KubernetesApi(kube_cluster.api_client())
    await install_crds(api)
    namespace = f"crd-{uuid.uuid4().hex[:8]}"
    await api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    yield api, namespace
    await api.delete("v1", "Namespace", "", namespace)
    api.close()


def cluster(namespace: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": models.API_VERSION,
        "kind": "StreamingCluster",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
async def test_api_server_rejects_invalid_specs_naming_the_field(
    kube: tuple[KubernetesApi, str], case: str, spec: dict[str, Any], field: str
) -> None:
    api, namespace = kube
    with pytest.raises(KubeInvalid) as raised:
        await api.create(cluster(namespace, case, spec))
    assert field in str(raised.value), str(raised.value)
    assert await api.get(models.API_VERSION, "StreamingCluster", namespace, case) is None


async def test_valid_spec_is_accepted_with_defaults(kube: tuple[KubernetesApi, str]) -> None:
    api, namespace = kube
    created = await api.create(cluster(namespace, "ok", valid()))
    spec = created["spec"]
    assert spec["nodes"] == 1
    assert spec["wal"] == {"backend": "local"}
    assert spec["leaseTTLSeconds"] == 5
    assert spec["deleteDataOnDelete"] is False
    assert models.parse_cluster_spec(spec).pchannels == 4


async def test_immutable_fields(kube: tuple[KubernetesApi, str]) -> None:
    api, namespace = kube
    await api.create(cluster(namespace, "fixed", valid()))
    for patch, field, message in [
        ({"pchannels": 8}, "spec.pchannels", "pchannels is immutable once set"),
        (
            {"wal": {"backend": "kafka", "kafka": {"bootstrapServers": ["k:9092"]}}},
            "spec.wal.backend",
            "wal.backend is immutable",
        ),
    ]:
        with pytest.raises(KubeInvalid) as raised:
            await api.patch_merge(
                models.API_VERSION, "StreamingCluster", namespace, "fixed", {"spec": patch}
            )
        assert field in str(raised.value) and message in str(raised.value)
    scaled = await api.patch_merge(
        models.API_VERSION, "StreamingCluster", namespace, "fixed", {"spec": {"nodes": 3}}
    )
    assert scaled["spec"]["nodes"] == 3


async def test_status_subresource_and_printer_columns(kube: tuple[KubernetesApi, str]) -> None:
    api, namespace = kube
    await api.create(cluster(namespace, "shown", valid()))
    status = {"nodeSummary": "1/1", "pchannelSummary": "4/4", "nodesReady": 1, "selector": "a=b"}
    await api.patch_merge(
        models.API_VERSION,
        "StreamingCluster",
        namespace,
        "shown",
        {"status": status, "spec": {"nodes": 9}},
        subresource="status",
    )
    body = await api.get(models.API_VERSION, "StreamingCluster", namespace, "shown")
    assert body is not None
    assert body["status"]["nodeSummary"] == "1/1"
    assert body["spec"]["nodes"] == 1, "the status subresource ignores spec changes"
    path = f"/apis/{models.API_VERSION}/namespaces/{namespace}/streamingclusters/shown"
    api_client = api.api_client
    request = api_client.param_serialize(
        "GET",
        path,
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    response = api_client.call_api(*request)
    table = json.loads(response.read())
    columns = table["columnDefinitions"]
    standard = [c["name"] for c in columns if c.get("priority", 0) == 0]
    assert standard == ["Name", "Nodes", "PChannels", "WAL", "Version", "Ready", "Flush-Lag", "Age"]
    # -o wide adds the image and the version asked for.
    assert [c["name"] for c in columns if c.get("priority", 0) > 0] == ["Image", "Spec-Version"]
    assert table["rows"][0]["cells"][1:4] == ["1/1", "4/4", "local"]


async def test_pchannel_assignment_cluster_is_immutable(kube: tuple[KubernetesApi, str]) -> None:
    api, namespace = kube
    body = {
        "apiVersion": models.API_VERSION,
        "kind": "PChannelAssignment",
        "metadata": {"name": "a-p0", "namespace": namespace},
        "spec": {"cluster": "a", "pchannel": "pchannel-000"},
    }
    await api.create(body)
    pinned = await api.patch_merge(
        models.API_VERSION, "PChannelAssignment", namespace, "a-p0", {"spec": {"pinnedNode": "n"}}
    )
    assert pinned["spec"]["pinnedNode"] == "n"
    with pytest.raises(KubeInvalid) as raised:
        await api.patch_merge(
            models.API_VERSION, "PChannelAssignment", namespace, "a-p0", {"spec": {"cluster": "b"}}
        )
    assert "spec.cluster" in str(raised.value) and "cluster is immutable" in str(raised.value)

"""Scenario 7: invalid StreamingClusters are refused by the API server itself
(the CRD's OpenAPI schema and CEL rules), with a message naming the field, and
nothing is stored."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from e2e.conftest import E2E
from e2e.harness import API_VERSION, PAUSED, ApiError, cluster_manifest, until

pytestmark = [pytest.mark.kube, pytest.mark.slow]


def _pchannels_zero(spec: dict[str, Any]) -> None:
    spec["pchannels"] = 0


def _kafka_without_settings(spec: dict[str, Any]) -> None:
    spec["wal"] = {"backend": "kafka"}


def _local_settings_with_pulsar(spec: dict[str, Any]) -> None:
    spec["wal"] = {"backend": "pulsar", "local": {"size": "1Gi"}}


def _too_many_nodes(spec: dict[str, Any]) -> None:
    spec["nodes"] = 65


def _bad_endpoint(spec: dict[str, Any]) -> None:
    spec["metastore"] = {"etcdEndpoints": ["etcd without port"]}


@pytest.mark.parametrize(
    ("edit", "field", "words"),
    [
        (_pchannels_zero, "spec.pchannels", "greater than or equal to 1"),
        (_kafka_without_settings, "spec.wal.kafka", "wal.kafka is required"),
        (_local_settings_with_pulsar, "spec.wal", "wal.pulsar is required"),
        (_too_many_nodes, "spec.nodes", "less than or equal to 64"),
        (_bad_endpoint, "spec.metastore.etcdEndpoints[0]", "should match"),
    ],
    ids=[
        "pchannels-0",
        "kafka-without-settings",
        "pulsar-without-settings",
        "nodes-65",
        "endpoint",
    ],
)
async def test_invalid_cluster_is_rejected_naming_the_field(
    e2e: E2E, edit: Callable[[dict[str, Any]], None], field: str, words: str
) -> None:
    manifest = cluster_manifest("invalid", e2e.namespace, e2e.etcd_endpoint)
    edit(manifest["spec"])
    kube = e2e.admin()
    try:
        for send in (kube.create, kube.apply):
            with pytest.raises(ApiError) as caught:
                await send(manifest)
            assert caught.value.status == 422, caught.value
            message = str(caught.value)
            assert field in message and words in message, message
            assert not caught.value.retryable
        assert await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, "invalid") is None
    finally:
        kube.close()


async def test_pchannels_cannot_change_once_set(e2e: E2E) -> None:
    manifest = cluster_manifest(
        "fixed", e2e.namespace, e2e.etcd_endpoint, nodes=0, annotations={PAUSED: "true"}
    )
    kube = e2e.admin()
    try:
        await kube.apply(manifest)
        with pytest.raises(ApiError) as caught:
            await kube.patch(
                API_VERSION, "StreamingCluster", e2e.namespace, "fixed", {"spec": {"pchannels": 8}}
            )
        assert caught.value.status == 422
        assert "spec.pchannels" in str(caught.value) and "immutable" in str(caught.value)
        body = await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, "fixed")
        assert body["spec"]["pchannels"] == 16
        await kube.delete(API_VERSION, "StreamingCluster", e2e.namespace, "fixed")

        async def gone() -> bool:
            found = await kube.get(API_VERSION, "StreamingCluster", e2e.namespace, "fixed")
            return found is None

        await until(gone, "the paused cluster deleted", limit=60)
    finally:
        kube.close()

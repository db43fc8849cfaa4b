"""The CRD models: defaults, and invalid specs rejected with the field named.

Each cross-field rule exists twice (CEL in the CRD, a validator in the model);
the cases here are the ones ``test_crd_server.py`` sends to the real API
server, so both places reject the same specs.
"""

from __future__ import annotations

from typing import Any

import pytest

from headrace_operator import crdgen, models
from headrace_operator.errors import InvalidSpec


def valid(**overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "pchannels": 4,
        "image": "headrace-node:0.1.0",
        "version": "0.1.0",
        "metastore": {"etcdEndpoints": ["etcd-0.etcd:2379", "10.0.0.3:2379"]},
    }
    spec.update(overrides)
    return spec


OBJECT_STORE: dict[str, Any] = {
    "endpoint": "http://seaweed.storage:8333",
    "bucket": "lake",
    "credentials": {"secretName": "lake-keys"},
}


def flush_section(**overrides: Any) -> dict[str, Any]:
    section: dict[str, Any] = {"objectStore": OBJECT_STORE, "image": "headrace-spark:0.1.0"}
    section.update(overrides)
    return section


INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("kafka-without-settings", valid(wal={"backend": "kafka"}), "spec.wal.kafka"),
    ("pulsar-without-settings", valid(wal={"backend": "pulsar"}), "spec.wal.pulsar"),
    (
        "kafka-settings-on-local",
        valid(wal={"backend": "local", "kafka": {"bootstrapServers": ["k:9092"]}}),
        "spec.wal.kafka",
    ),
    ("zero-pchannels", valid(pchannels=0), "spec.pchannels"),
    ("negative-nodes", valid(nodes=-1), "spec.nodes"),
    ("no-etcd", valid(metastore={"etcdEndpoints": []}), "spec.metastore.etcdEndpoints"),
    ("etcd-not-host-port", valid(metastore={"etcdEndpoints": ["etcd"]}), "spec.metastore"),
    ("unknown-backend", valid(wal={"backend": "s3"}), "spec.wal.backend"),
    (
        "bad-pulsar-url",
        valid(wal={"backend": "pulsar", "pulsar": {"serviceUrl": "http://p:6650"}}),
        "spec.wal.pulsar.serviceUrl",
    ),
    ("bad-volume-size", valid(wal={"backend": "local", "local": {"size": "ten"}}), "spec.wal"),
    ("zero-lease-ttl", valid(leaseTTLSeconds=0), "spec.leaseTTLSeconds"),
    (
        "flush-backoff-above-its-cap",
        valid(flush=flush_section(backoffSeconds=60, maxBackoffSeconds=30)),
        "spec.flush.maxBackoffSeconds",
    ),
    (
        "flush-endpoint-without-scheme",
        valid(flush=flush_section(objectStore={**OBJECT_STORE, "endpoint": "s3:9000"})),
        "spec.flush.objectStore.endpoint",
    ),
    (
        "flush-without-credentials",
        valid(flush=flush_section(objectStore={"endpoint": "http://s3:9000", "bucket": "lake"})),
        "spec.flush.objectStore.credentials",
    ),
    (
        "flush-unknown-spark-operator",
        valid(flush=flush_section(sparkOperator="yarn")),
        "spec.flush.sparkOperator",
    ),
]


def test_defaults_of_a_minimal_spec() -> None:
    spec = models.parse_cluster_spec(valid())
    assert spec.nodes == 1
    assert spec.wal.backend == "local"
    assert spec.wal.local_or_default.size == "10Gi"
    assert spec.lease_ttl_seconds == 5
    assert spec.delete_data_on_delete is False
    assert spec.metastore.url() == "etcd://etcd-0.etcd:2379,10.0.0.3:2379"
    assert spec.pchannel_names == ["pchannel-000", "pchannel-001", "pchannel-002", "pchannel-003"]


def test_round_trip_keeps_kubernetes_names() -> None:
    raw = valid(
        nodes=3,
        leaseTTLSeconds=7,
        deleteDataOnDelete=True,
        wal={
            "backend": "kafka",
            "kafka": {
                "bootstrapServers": ["k-0:9092"],
                "sasl": {"secretName": "kafka-user"},
                "tls": {"secretName": "kafka-ca"},
            },
        },
    )
    api = models.parse_cluster_spec(raw).to_api()
    assert api["leaseTTLSeconds"] == 7
    assert api["deleteDataOnDelete"] is True
    assert api["wal"]["kafka"]["bootstrapServers"] == ["k-0:9092"]
    assert api["wal"]["kafka"]["sasl"] == {"mechanism": "SCRAM-SHA-512", "secretName": "kafka-user"}
    assert models.parse_cluster_spec(api) == models.parse_cluster_spec(raw)


@pytest.mark.parametrize(("case", "spec", "field"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_names_the_field(case: str, spec: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidSpec) as raised:
        models.parse_cluster_spec(spec)
    assert raised.value.field.startswith(field), (case, raised.value.field)
    assert field.rsplit(".", maxsplit=1)[-1] in str(raised.value) or field in str(raised.value)
    assert not raised.value.retryable


def test_unknown_fields_are_rejected() -> None:
    with pytest.raises(InvalidSpec) as raised:
        models.parse_cluster_spec(valid(replicas=3))
    assert raised.value.field == "spec.replicas"


def test_pchannel_assignment_spec() -> None:
    spec = models.parse_assignment_spec({"cluster": "demo", "pchannel": "pchannel-001"})
    assert spec.pinned_node is None
    with pytest.raises(InvalidSpec) as raised:
        models.parse_assignment_spec({"cluster": "Demo!", "pchannel": "pchannel-001"})
    assert raised.value.field == "spec.cluster"


def test_every_cel_rule_of_wal_has_a_model_twin() -> None:
    """The WAL rules in the generated schema are the ones the model enforces."""
    schema = crdgen.crd("StreamingCluster")["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    wal = schema["properties"]["spec"]["properties"]["wal"]
    messages = {rule["message"] for rule in wal["x-kubernetes-validations"]}
    assert messages == {
        "wal.kafka is required when wal.backend is kafka",
        "wal.pulsar is required when wal.backend is pulsar",
        "wal.kafka is only allowed when wal.backend is kafka",
        "wal.pulsar is only allowed when wal.backend is pulsar",
        "wal.local is only allowed when wal.backend is local",
    }
    for case, spec, _field in INVALID[:3]:
        with pytest.raises(InvalidSpec) as raised:
            models.parse_cluster_spec(spec)
        assert raised.value.message in messages, case


def test_flush_section_defaults() -> None:
    spec = models.parse_cluster_spec(valid(flush=flush_section()))
    assert spec.flush is not None
    flush = spec.flush
    assert flush.object_store.warehouse == "s3://lake/warehouse"
    assert flush.object_store.credentials.access_key_id_key == "AWS_ACCESS_KEY_ID"
    assert flush.spark_operator is models.SparkOperatorKind.AUTO
    assert (flush.driver.cores, flush.executor.instances) == (1, 1)
    assert flush.compaction.enabled is False
    assert flush.deadline_seconds < flush.ttl_seconds
    assert models.parse_cluster_spec(valid()).flush is None

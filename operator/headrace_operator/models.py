"""Pydantic models of the custom resources (group ``streaming.headrace.io``).

These models are the single source of the CRD schemas: :mod:`.crdgen` turns
them into OpenAPI v3 (structural) schemas with the CEL rules attached below,
and the operator parses every custom resource it reads through them, so an
object that the API server accepted and an object the operator understands are
the same set. Field names are the Kubernetes (camelCase) names; Python code uses
the snake_case attributes.

Cross-field invariants are written twice on purpose, side by side: as CEL
(``x-kubernetes-validations``, enforced by the API server at admission) and as a
pydantic validator (enforced when the operator parses, and testable without a
server). ``tests/headrace_operator/test_models.py`` checks that each rule rejects the
same specs in both places.
"""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal

import pydantic
from pydantic.alias_generators import to_camel

from headrace_operator.errors import InvalidSpec

GROUP = "streaming.headrace.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PAUSED_ANNOTATION = f"{GROUP}/paused"
"""Set to ``"true"`` on a StreamingCluster to stop reconciling it."""

_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_HOST_PORT = r"^[A-Za-z0-9.\-\[\]:]+:[0-9]{1,5}$"
_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|Pi|M|G|T|P|E|Ei)?$"
HostPort = Annotated[str, pydantic.StringConstraints(pattern=_HOST_PORT, max_length=256)]
MAX_NODES = 64
MAX_PCHANNELS = 256


def cel(rule: str, message: str, field_path: str = "") -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    return entry


def _cel_extra(*rules: dict[str, str]) -> dict[str, Any]:
    return {"x-kubernetes-validations": list(rules)}


class _Model(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_api(self) -> dict[str, Any]:
        """The Kubernetes representation (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class SecretKeyRef(_Model):
    """A key of a Secret in the cluster's namespace."""

    name: str = pydantic.Field(min_length=1, max_length=253, pattern=_NAME)
    key: str = pydantic.Field(min_length=1, max_length=253)


class MetastoreSpec(_Model):
    """The etcd cluster holding the cluster's coordination state.

    Cluster mode needs a shared etcd; the embedded SQLite metastore of
    ``headrace standalone`` is not offered here.
    """

    etcd_endpoints: list[HostPort] = pydantic.Field(
        min_length=1, max_length=16, description="etcd client endpoints as host:port."
    )

    @pydantic.field_validator("etcd_endpoints")
    @classmethod
    def _endpoints(cls, value: list[str]) -> list[str]:
        return _check_host_ports(value, "spec.metastore.etcdEndpoints")

    def url(self) -> str:
        """The metastore URL ``headrace node --metastore`` takes."""
        return "etcd://" + ",".join(self.etcd_endpoints)


class LocalWAL(_Model):
    """Local segmented files on one ReadWriteMany volume that all node pods share."""

    storage_class_name: str | None = pydantic.Field(
        default=None,
        max_length=253,
        description=(
            "StorageClass of the shared WAL volume. It must support ReadWriteMany "
            "(e.g. NFS, CephFS, EFS): pchannels move between nodes, so every node pod "
            "mounts the same volume. Kafka and Pulsar need no shared volume."
        ),
    )
    size: str = pydantic.Field(
        default="10Gi",
        pattern=_QUANTITY,
        description="Size of the shared WAL volume (holds the WALs of all pchannels).",
    )


class KafkaSASL(_Model):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] = "SCRAM-SHA-512"
    secret_name: str = pydantic.Field(
        min_length=1,
        max_length=253,
        pattern=_NAME,
        description="Secret with keys 'username' and 'password'.",
    )


class KafkaTLS(_Model):
    secret_name: str = pydantic.Field(
        min_length=1,
        max_length=253,
        pattern=_NAME,
        description="Secret with 'ca.crt' (and 'tls.crt'/'tls.key' for mutual TLS).",
    )
    client_auth: bool = pydantic.Field(
        default=False,
        description="Present the secret's 'tls.crt'/'tls.key' to the brokers (mutual TLS).",
    )


class KafkaWAL(_Model):
    bootstrap_servers: list[HostPort] = pydantic.Field(
        min_length=1, max_length=16, description="Kafka bootstrap brokers as host:port."
    )
    tls: KafkaTLS | None = None
    sasl: KafkaSASL | None = None

    @pydantic.field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: list[str]) -> list[str]:
        return _check_host_ports(value, "spec.wal.kafka.bootstrapServers")


class PulsarWAL(_Model):
    service_url: str = pydantic.Field(
        max_length=512,
        pattern=r"^pulsar(\+ssl)?://[^/\s]+:[0-9]{1,5}/?$",
        description="Pulsar broker URL, pulsar://host:port or pulsar+ssl://host:port.",
    )
    auth_secret_ref: SecretKeyRef | None = pydantic.Field(
        default=None, description="Secret key holding a JWT for token authentication."
    )


class WALSpec(_Model):
    """Where the write-ahead logs live. The backend is fixed at creation."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "self.backend != 'kafka' || has(self.kafka)",
                "wal.kafka is required when wal.backend is kafka",
                ".kafka",
            ),
            cel(
                "self.backend != 'pulsar' || has(self.pulsar)",
                "wal.pulsar is required when wal.backend is pulsar",
                ".pulsar",
            ),
            cel(
                "self.backend == 'kafka' || !has(self.kafka)",
                "wal.kafka is only allowed when wal.backend is kafka",
                ".kafka",
            ),
            cel(
                "self.backend == 'pulsar' || !has(self.pulsar)",
                "wal.pulsar is only allowed when wal.backend is pulsar",
                ".pulsar",
            ),
            cel(
                "self.backend == 'local' || !has(self.local)",
                "wal.local is only allowed when wal.backend is local",
                ".local",
            ),
        )
    )

    backend: Literal["local", "kafka", "pulsar"] = pydantic.Field(
        default="local",
        description=(
            "local (one ReadWriteMany volume shared by all node pods), kafka or pulsar "
            "(no volume). Immutable."
        ),
        json_schema_extra=_cel_extra(cel("self == oldSelf", "wal.backend is immutable")),
    )
    local: LocalWAL | None = None
    kafka: KafkaWAL | None = None
    pulsar: PulsarWAL | None = None

    @pydantic.model_validator(mode="after")
    def _sections(self) -> WALSpec:
        sections = {"local": self.local, "kafka": self.kafka, "pulsar": self.pulsar}
        if self.backend in ("kafka", "pulsar") and sections[self.backend] is None:
            raise InvalidSpec(
                f"wal.{self.backend} is required when wal.backend is {self.backend}",
                field=f"spec.wal.{self.backend}",
            )
        for name, section in sections.items():
            if section is not None and name != self.backend:
                raise InvalidSpec(
                    f"wal.{name} is only allowed when wal.backend is {name}",
                    field=f"spec.wal.{name}",
                )
        return self

    @property
    def local_or_default(self) -> LocalWAL:
        return self.local or LocalWAL()


class ResourceList(_Model):
    cpu: str | None = pydantic.Field(default=None, pattern=_QUANTITY)
    memory: str | None = pydantic.Field(default=None, pattern=_QUANTITY)


class Resources(_Model):
    """CPU and memory of each node container (as in a Pod's ``resources``)."""

    requests: ResourceList | None = None
    limits: ResourceList | None = None


class NodeTLS(_Model):
    """TLS of the node pods' gRPC server, from a Secret of type kubernetes.io/tls
    (``tls.crt``, ``tls.key``, and ``ca.crt`` for client certificates), such as
    the ones cert-manager issues, used as they are."""

    secret_name: str = pydantic.Field(
        min_length=1,
        max_length=253,
        pattern=_NAME,
        description="Secret with tls.crt and tls.key (and ca.crt with requireClientCertificates).",
    )
    require_client_certificates: bool = pydantic.Field(
        default=False,
        description="Mutual TLS: clients need a certificate signed by the Secret's ca.crt.",
    )
    identities_secret_name: str | None = pydantic.Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=_NAME,
        description="Secret whose identities.json gives callers their roles (producer, "
        "consumer, admin); see docs/security.md. Unset: any caller the TLS admits.",
    )


_SPARK_MEMORY = r"^[0-9]+[kmgtKMGT]?$"
_BUCKET = r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$"
_ENDPOINT = r"^https?://[^/\s]+(:[0-9]{1,5})?/?$"


class ObjectStoreCredentials(_Model):
    """The Secret holding the object store's access key (never read by the
    operator: the Spark driver and executors get it as environment)."""

    secret_name: str = pydantic.Field(min_length=1, max_length=253, pattern=_NAME)
    access_key_id_key: str = pydantic.Field(
        default="AWS_ACCESS_KEY_ID", min_length=1, max_length=253, description="Key of the id."
    )
    secret_access_key_key: str = pydantic.Field(
        default="AWS_SECRET_ACCESS_KEY",
        min_length=1,
        max_length=253,
        description="Key of the secret.",
    )


class ObjectStoreSpec(_Model):
    """The S3-compatible object store the collection tables are written to."""

    endpoint: str = pydantic.Field(
        max_length=512, pattern=_ENDPOINT, description="S3 endpoint, http(s)://host[:port]."
    )
    bucket: str = pydantic.Field(pattern=_BUCKET, description="S3 bucket name.")
    prefix: str = pydantic.Field(
        default="warehouse",
        max_length=512,
        pattern=r"^[A-Za-z0-9._\-]+(/[A-Za-z0-9._\-]+)*$",
        description="Key prefix of the tables inside the bucket.",
    )
    credentials: ObjectStoreCredentials

    @property
    def warehouse(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


class SealPolicy(_Model):
    """When the nodes seal growing segments (a sealed range is what a flush takes)."""

    lifetime_seconds: int | None = pydantic.Field(
        default=None,
        ge=1,
        le=86400,
        description="Seal a segment this long after it opened (the nodes' "
        "--segment-lifetime-s); unset keeps the nodes' default.",
    )


class CompactionPolicy(_Model):
    """When compaction runs are launched and what they aim at."""

    enabled: bool = False
    interval_seconds: int = pydantic.Field(
        default=3600,
        ge=10,
        le=7 * 86400,
        description="Launch a compaction run of a pchannel this long after its last one ended.",
    )
    min_small_files: int = pydantic.Field(
        default=8, ge=2, le=100000, description="Compact a shard once it has this many small files."
    )
    max_delete_ratio: float = pydantic.Field(
        default=0.2,
        ge=0.01,
        le=1.0,
        description="Compact once this share of rows is deleted (at least 0.01).",
    )
    target_file_bytes: int = pydantic.Field(
        default=128 * 1024 * 1024, ge=1024 * 1024, le=16 * 1024**3
    )


class SparkDriverSpec(_Model):
    cores: int = pydantic.Field(default=1, ge=1, le=64)
    memory: str = pydantic.Field(default="1g", pattern=_SPARK_MEMORY, description="e.g. 512m, 2g.")
    service_account: str | None = pydantic.Field(
        default=None, max_length=253, pattern=_NAME, description="The driver pod's ServiceAccount."
    )


class SparkExecutorSpec(_Model):
    instances: int = pydantic.Field(default=1, ge=1, le=1000)
    cores: int = pydantic.Field(default=1, ge=1, le=64)
    memory: str = pydantic.Field(default="1g", pattern=_SPARK_MEMORY, description="e.g. 512m, 2g.")


class SparkOperatorKind(enum.StrEnum):
    AUTO = "auto"
    """Kubeflow's ``sparkoperator.k8s.io/v1beta2`` if the cluster serves it, else
    Apache's ``spark.apache.org/v1``."""
    KUBEFLOW = "kubeflow"
    APACHE = "apache"


class FlushSpec(_Model):
    """Flush and compaction of the cluster's collections, run as SparkApplications."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "self.maxBackoffSeconds >= self.backoffSeconds",
                "flush.maxBackoffSeconds must be at least flush.backoffSeconds",
                ".maxBackoffSeconds",
            ),
        )
    )

    object_store: ObjectStoreSpec
    image: str = pydantic.Field(
        min_length=1, max_length=512, description="Spark image holding Headrace and spark_apps/."
    )
    spark_version: str = pydantic.Field(
        default="4.1.1", min_length=1, max_length=32, pattern=r"^[0-9]+\.[0-9]+(\.[0-9]+)?$"
    )
    apps_dir: str = pydantic.Field(
        default="local:///opt/headrace/spark_apps",
        min_length=1,
        max_length=512,
        pattern=r"^(local|file|s3a?)://\S+$",
        description="Where the image holds spark_apps/ (main files flush.py and "
        "compact_pchannel.py).",
    )
    spark_operator: SparkOperatorKind = pydantic.Field(
        default=SparkOperatorKind.AUTO,
        description="auto (Kubeflow's v1beta2 if served, else Apache's v1), kubeflow or apache.",
    )
    driver: SparkDriverSpec = pydantic.Field(
        default_factory=SparkDriverSpec, json_schema_extra={"default": {}}
    )
    executor: SparkExecutorSpec = pydantic.Field(
        default_factory=SparkExecutorSpec, json_schema_extra={"default": {}}
    )
    seal: SealPolicy | None = None
    compaction: CompactionPolicy = pydantic.Field(
        default_factory=CompactionPolicy, json_schema_extra={"default": {}}
    )
    deadline_seconds: int = pydantic.Field(
        default=1800,
        ge=10,
        le=86400,
        description="A run not finished this long after its creation (hung in SUBMITTED, "
        "stuck) is deleted and retried.",
    )
    ttl_seconds: int = pydantic.Field(
        default=3600,
        ge=60,
        le=30 * 86400,
        description="The Spark operator deletes a finished run this long after it ended.",
    )
    backoff_seconds: int = pydantic.Field(
        default=10, ge=1, le=3600, description="Wait after a failed run; doubled per failure."
    )
    max_backoff_seconds: int = pydantic.Field(default=600, ge=1, le=86400)

    @pydantic.model_validator(mode="after")
    def _backoff(self) -> FlushSpec:
        if self.max_backoff_seconds < self.backoff_seconds:
            raise InvalidSpec(
                "flush.maxBackoffSeconds must be at least flush.backoffSeconds",
                field="spec.flush.maxBackoffSeconds",
            )
        return self


class StreamingClusterSpec(_Model):
    """A Headrace streaming cluster: node pods, their WAL storage, coordination."""

    nodes: int = pydantic.Field(
        default=1, ge=0, le=MAX_NODES, description="Streaming node pods to run."
    )
    pchannels: int = pydantic.Field(
        ge=1,
        le=MAX_PCHANNELS,
        description="Number of pchannels (pchannel-000 ...). Immutable once set.",
        json_schema_extra=_cel_extra(cel("self == oldSelf", "pchannels is immutable once set")),
    )
    image: str = pydantic.Field(
        min_length=1, max_length=512, description="Container image of the streaming nodes."
    )
    version: str = pydantic.Field(
        min_length=1, max_length=64, description="Headrace version the image carries."
    )
    metastore: MetastoreSpec
    wal: WALSpec = pydantic.Field(
        default_factory=WALSpec, json_schema_extra={"default": {"backend": "local"}}
    )
    resources: Resources | None = None
    tls: NodeTLS | None = pydantic.Field(
        default=None, description="Serve the nodes' gRPC over TLS (unset: plaintext)."
    )
    lease_ttl_seconds: int = pydantic.Field(
        default=5,
        ge=1,
        le=300,
        alias="leaseTTLSeconds",
        description="Session and election lease TTL; a crashed node is failed over after it.",
    )
    delete_data_on_delete: bool = pydantic.Field(
        default=False,
        description="Delete the shared local WAL volume with the cluster. Default keeps it.",
    )
    drain_timeout_seconds: int = pydantic.Field(
        default=60,
        ge=1,
        le=3600,
        description="How long a node pod being deleted (kubectl delete, eviction) may take to "
        "hand its pchannels off by graceful handoff before it stops (its preStop hook); "
        "the pod's termination grace period is this plus 30 s. A node with no peer (a "
        "single-node cluster) waits all of it, so keep it short there.",
    )
    flush: FlushSpec | None = pydantic.Field(
        default=None,
        description="Flush (and compaction) of the collections to Iceberg tables in an object "
        "store, launched as SparkApplications; unset: no flush.",
    )

    @property
    def pchannel_names(self) -> list[str]:
        return [f"pchannel-{i:03d}" for i in range(self.pchannels)]


class ConditionType(enum.StrEnum):
    READY = "Ready"
    PROGRESSING = "Progressing"
    DEGRADED = "Degraded"
    PAUSED = "ReconciliationPaused"
    FLUSH_HEALTHY = "FlushHealthy"


class Condition(_Model):
    """A condition as in the Kubernetes API conventions."""

    type: str = pydantic.Field(max_length=316)
    status: Literal["True", "False", "Unknown"]
    reason: str = pydantic.Field(
        max_length=1024, pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
    )
    message: str = pydantic.Field(default="", max_length=32768)
    observed_generation: int = pydantic.Field(default=0, ge=0)
    last_transition_time: str = pydantic.Field(json_schema_extra={"format": "date-time"})


_CONDITIONS_EXTRA: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
    "maxItems": 16,
}


class NodeStatus(_Model):
    node_id: str
    pod: str
    phase: str = ""
    ready: bool = False
    pchannels: int = 0
    draining: bool = False
    image: str = pydantic.Field(default="", description="Image the node pod runs (observed).")
    version: str = pydantic.Field(
        default="",
        description="Headrace version the node registered in the metastore ('' when it has no "
        "session).",
    )


class RunJob(enum.StrEnum):
    FLUSH = "flush"
    COMPACT = "compact"


class RunPhase(enum.StrEnum):
    """A run's state as the operator sees it, from either Spark operator's states."""

    PENDING = "Pending"
    """Created; the Spark operator has not reported on it yet."""
    SUBMITTED = "Submitted"
    RUNNING = "Running"
    COMPLETED = "Completed"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    """Not finished by its deadline: the operator deleted it."""
    VANISHED = "Vanished"
    """Deleted by someone else before it finished."""


TERMINAL_PHASES = frozenset(
    {RunPhase.COMPLETED, RunPhase.FAILED, RunPhase.TIMED_OUT, RunPhase.VANISHED}
)


class FlushRunStatus(_Model):
    """The last run of one job (flush or compaction) of one pchannel, and its
    retry history since its last success."""

    pchannel: str
    job: RunJob
    run: str = pydantic.Field(default="", description="Name of the last SparkApplication.")
    phase: RunPhase | None = None
    app_state: str = pydantic.Field(default="", description="The Spark operator's own state.")
    created: str = pydantic.Field(default="", description="When the run was created (RFC 3339).")
    term: int = 0
    start: str = ""
    end: str = ""
    failures: int = pydantic.Field(default=0, ge=0, description="Failed runs in a row.")
    retry_at: str = pydantic.Field(default="", description="No new run before (RFC 3339).")
    fenced_term: int = 0
    poisoned: bool = False
    last_error: str = pydantic.Field(default="", max_length=4096)
    last_success: str = pydantic.Field(default="", description="When a run last completed.")
    waiting: str = pydantic.Field(default="", max_length=4096, description="Why no run is due.")


class FlushStatus(_Model):
    spark_api: str = pydantic.Field(
        default="", description="The SparkApplication API the runs use ('' when none is served)."
    )
    lag_seconds: int = pydantic.Field(
        default=0, ge=0, description="Age of the oldest sealed data not yet flushed."
    )
    lag: str = pydantic.Field(default="", description="lagSeconds, for kubectl get.")
    runs_completed: int = pydantic.Field(default=0, ge=0)
    runs_failed: int = pydantic.Field(
        default=0, ge=0, description="Runs that failed, timed out or vanished (all time)."
    )
    runs: list[FlushRunStatus] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_PCHANNELS * 2}
    )


class StreamingClusterStatus(_Model):
    observed_generation: int = 0
    nodes_desired: int = 0
    nodes_ready: int = 0
    node_summary: str = pydantic.Field(default="", description="ready/desired, for kubectl get.")
    pchannels_total: int = 0
    pchannels_assigned: int = 0
    pchannel_summary: str = pydantic.Field(
        default="", description="assigned/total, for kubectl get."
    )
    selector: str = pydantic.Field(default="", description="Label selector of the node pods.")
    coordinator: str = pydantic.Field(default="", description="Id of the leading coordinator.")
    running_version: str = pydantic.Field(
        default="",
        description="Versions the registered nodes run, e.g. '0.2.0' or '0.1.0 (2), 0.2.0 (1)'.",
    )
    running_image: str = pydantic.Field(
        default="", description="Images the node pods run, in the same form."
    )
    node_statuses: list[NodeStatus] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_NODES * 2}
    )
    flush: FlushStatus | None = None
    conditions: list[Condition] = pydantic.Field(
        default_factory=list, json_schema_extra=_CONDITIONS_EXTRA
    )


class AssignmentStateName(enum.StrEnum):
    ASSIGNING = "ASSIGNING"
    ASSIGNED = "ASSIGNED"
    UNASSIGNING = "UNASSIGNING"
    UNASSIGNED = "UNASSIGNED"
    UNAVAILABLE = "UNAVAILABLE"
    UNKNOWN = "UNKNOWN"


class PChannelAssignmentSpec(_Model):
    """Where one pchannel of a StreamingCluster is served (mirrors the metastore)."""

    cluster: str = pydantic.Field(
        min_length=1,
        max_length=63,
        pattern=_NAME,
        description="Name of the StreamingCluster (same namespace). Immutable.",
        json_schema_extra=_cel_extra(cel("self == oldSelf", "cluster is immutable")),
    )
    pchannel: str = pydantic.Field(
        min_length=1,
        max_length=128,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="The pchannel this object mirrors. Immutable.",
        json_schema_extra=_cel_extra(cel("self == oldSelf", "pchannel is immutable")),
    )
    pinned_node: str | None = pydantic.Field(
        default=None,
        max_length=253,
        description="Node id to keep this pchannel on; moved there by graceful handoff.",
    )


class PChannelAssignmentStatus(_Model):
    node: str = ""
    term: int = 0
    state: AssignmentStateName = AssignmentStateName.UNKNOWN
    target: str = ""
    previous_node: str = pydantic.Field(
        default="", description="The node that served it before its last move."
    )
    pinned: bool = pydantic.Field(default=False, description="On the pinned node.")
    message: str = ""
    observed_generation: int = 0
    conditions: list[Condition] = pydantic.Field(
        default_factory=list, json_schema_extra=_CONDITIONS_EXTRA
    )


class UpgradeMode(enum.StrEnum):
    ROLLING = "Rolling"
    """No downtime: one node (or ``maxUnavailable``) at a time, drained by
    fenced graceful handoff, the active coordinator's node last."""
    OFFLINE = "Offline"
    """With downtime: writes stopped cluster-wide, every node restarted at once."""


class UpgradePhase(enum.StrEnum):
    PENDING = "Pending"
    PLANNED = "Planned"
    """A dry run: ``status.plan`` holds the steps; nothing is changed."""
    RUNNING = "Running"
    PAUSED = "Paused"
    BLOCKED = "Blocked"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    """``rollback``: every node runs the image it ran before the plan again."""
    FAILED = "Failed"


class UpgradeConditionType(enum.StrEnum):
    PROGRESSING = "Progressing"
    PAUSED = "Paused"
    BLOCKED = "Blocked"
    SUCCEEDED = "Succeeded"
    ROLLED_BACK = "RolledBack"
    FAILED = "Failed"
    WRITES_STOPPED = "WritesStopped"
    """The cluster's writes are stopped (by this plan or another), and why."""


class ClusterRefSpec(_Model):
    """The StreamingCluster to upgrade (same namespace)."""

    name: str = pydantic.Field(
        min_length=1,
        max_length=63,
        pattern=_NAME,
        description="Name of the StreamingCluster in the plan's namespace. Immutable.",
        json_schema_extra=_cel_extra(cel("self == oldSelf", "clusterRef.name is immutable")),
    )


class UpgradePlanSpec(_Model):
    """An upgrade of a StreamingCluster to a new version and image."""

    model_config = pydantic.ConfigDict(
        json_schema_extra=_cel_extra(
            cel(
                "!(self.dryRun && self.rollback)",
                "dryRun and rollback cannot both be true: a dry run changes nothing to roll back",
                ".rollback",
            ),
            cel(
                "self.mode != 'Offline' || self.maxUnavailable == 1",
                "maxUnavailable only applies to mode Rolling (Offline stops every node at once)",
                ".maxUnavailable",
            ),
        )
    )

    cluster_ref: ClusterRefSpec
    version: str = pydantic.Field(
        min_length=1, max_length=64, description="Headrace version the target image carries."
    )
    image: str = pydantic.Field(
        min_length=1, max_length=512, description="Container image to run on every node."
    )
    mode: UpgradeMode = pydantic.Field(
        default=UpgradeMode.ROLLING,
        description="Rolling (no downtime, node by node) or Offline (writes stopped). Immutable.",
        json_schema_extra=_cel_extra(cel("self == oldSelf", "mode is immutable")),
    )
    max_unavailable: int = pydantic.Field(
        default=1, ge=1, le=MAX_NODES, description="Nodes drained and restarted at the same time."
    )
    drain_timeout_seconds: int = pydantic.Field(
        default=300,
        ge=10,
        le=86400,
        description="How long a node's drain may take before the plan is Blocked.",
    )
    flush_timeout_seconds: int = pydantic.Field(
        default=1800,
        ge=10,
        le=86400,
        description="Offline plans of a cluster with a flush section: how long every "
        "pchannel's flush checkpoint may take to reach the plan's flush request before the "
        "plan is Blocked.",
    )
    soak_seconds: int = pydantic.Field(
        default=30,
        ge=0,
        le=86400,
        description="How long a restarted node must stay Ready before the next one starts.",
    )
    paused: bool = pydantic.Field(
        default=False, description="Hold the plan after the node in progress is done."
    )
    rollback: bool = pydantic.Field(
        default=False,
        description="Run the same loop back to the image the nodes ran before the plan.",
    )
    dry_run: bool = pydantic.Field(
        default=False, description="Only fill status.plan with the steps; change nothing."
    )

    @pydantic.model_validator(mode="after")
    def _combinations(self) -> UpgradePlanSpec:
        if self.dry_run and self.rollback:
            raise InvalidSpec(
                "dryRun and rollback cannot both be true: a dry run changes nothing to roll back",
                field="spec.rollback",
            )
        if self.mode is UpgradeMode.OFFLINE and self.max_unavailable != 1:
            raise InvalidSpec(
                "maxUnavailable only applies to mode Rolling (Offline stops every node at once)",
                field="spec.maxUnavailable",
            )
        return self


class PlannedMove(_Model):
    pchannel: str
    to: str = pydantic.Field(description="Node the pchannel moves to.")


class PlannedStep(_Model):
    """One step of the plan: the nodes restarted together and the pchannels
    moved off them first."""

    index: int = pydantic.Field(ge=0)
    action: str = pydantic.Field(
        default="restart",
        description=(
            "restart (Rolling); stop-writes, drain-and-fence, flush, stop-nodes, "
            "start-nodes, resume-writes (Offline)."
        ),
    )
    nodes: list[str] = pydantic.Field(json_schema_extra={"maxItems": MAX_NODES})
    moves: list[PlannedMove] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_PCHANNELS}
    )
    coordinator: bool = pydantic.Field(
        default=False, description="The step restarts the active coordinator's node."
    )
    state: str = pydantic.Field(
        default="",
        description="Offline steps: Pending, Running, Done or Skipped (empty for Rolling).",
    )
    message: str = pydantic.Field(
        default="", description="Offline steps: what the step does or waits for, or why skipped."
    )
    started: str = pydantic.Field(
        default="", description="Offline steps: when it was first seen running (RFC 3339)."
    )


class NodeProgress(_Model):
    node: str
    from_: str = pydantic.Field(default="", alias="from", description="Image before the plan.")
    to: str = pydantic.Field(default="", description="Target image.")
    step: str = pydantic.Field(
        default="Pending", description="Pending, Draining, Restarting, Soaking, Done or Failed."
    )
    pchannels_moved: int = pydantic.Field(default=0, ge=0)
    pchannels_at_start: int = pydantic.Field(
        default=0, ge=0, description="pchannels the node held when its drain started."
    )
    started: str = pydantic.Field(default="", description="When its drain started (RFC 3339).")
    ready_since: str = pydantic.Field(
        default="", description="When it was first seen Ready on the target image (RFC 3339)."
    )
    error: str = ""


class UpgradeFormats(_Model):
    """The message formats around an upgrade (see docs/upgrade.md)."""

    cluster: int = pydantic.Field(
        default=0, ge=0, description="The cluster's message format version, as last observed."
    )
    source_reads: list[int] = pydantic.Field(
        default_factory=list,
        description="Formats the release the plan started from reads (a rollback needs them).",
        json_schema_extra={"maxItems": 64},
    )
    switched_from: int = pydantic.Field(default=0, ge=0)
    switched_to: int = pydantic.Field(
        default=0, ge=0, description="The format the plan's last step switched to (0: none)."
    )
    switched_at: str = pydantic.Field(default="", description="When it switched (RFC 3339).")


class FlushTarget(_Model):
    """One pchannel of an Offline plan's flush: the request it waits for."""

    pchannel: str
    target: str = pydantic.Field(
        description="Message id of the acknowledged flush request the checkpoint must reach."
    )
    checkpoint: str = pydantic.Field(
        default="", description="The pchannel's flush checkpoint as last observed."
    )
    reached: bool = False


class UpgradeFlush(_Model):
    """The flush of every collection an Offline plan requested (kept across
    operator restarts: the plan waits on these targets, never requests anew)."""

    requested: str = pydantic.Field(default="", description="When it was requested (RFC 3339).")
    collections: int = pydantic.Field(default=0, ge=0, description="Collections flushed.")
    pchannels: list[FlushTarget] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_PCHANNELS}
    )
    done: str = pydantic.Field(
        default="", description="When every checkpoint was seen at its target (RFC 3339)."
    )


class UpgradePlanStatus(_Model):
    phase: Literal[
        "",
        "Pending",
        "Planned",
        "Running",
        "Paused",
        "Blocked",
        "Succeeded",
        "RolledBack",
        "Failed",
    ] = pydantic.Field(default="", description="One of UpgradePhase ('' before the first pass).")
    progress: str = pydantic.Field(default="", description="upgraded/total, for kubectl get.")
    plan: list[PlannedStep] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_NODES}
    )
    nodes: list[NodeProgress] = pydantic.Field(
        default_factory=list, json_schema_extra={"maxItems": MAX_NODES * 2}
    )
    current_node: str = ""
    observed_generation: int = 0
    formats: UpgradeFormats | None = None
    flush: UpgradeFlush | None = None
    conditions: list[Condition] = pydantic.Field(
        default_factory=list, json_schema_extra=_CONDITIONS_EXTRA
    )


def _check_host_ports(values: list[str], field: str) -> list[str]:
    for value in values:
        host, sep, port = value.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidSpec(f"{field}: {value!r} is not host:port", field=field)
    return values


def parse_spec(model: type[_Model], spec: object, *, prefix: str = "spec") -> Any:
    """Validate a custom resource's spec; :class:`InvalidSpec` names the field.

    Validators of cross-field rules raise :class:`InvalidSpec` themselves (it is
    not a ``ValueError``, so pydantic passes it through with its field intact).
    """
    try:
        return model.model_validate(spec)
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        location = ".".join(str(part) for part in first["loc"])
        field = f"{prefix}.{location}" if location else prefix
        raise InvalidSpec(f"{field}: {first['msg']}", field=field) from None


def parse_cluster_spec(spec: object) -> StreamingClusterSpec:
    parsed: StreamingClusterSpec = parse_spec(StreamingClusterSpec, spec)
    return parsed


def parse_assignment_spec(spec: object) -> PChannelAssignmentSpec:
    parsed: PChannelAssignmentSpec = parse_spec(PChannelAssignmentSpec, spec)
    return parsed


def parse_upgrade_spec(spec: object) -> UpgradePlanSpec:
    parsed: UpgradePlanSpec = parse_spec(UpgradePlanSpec, spec)
    return parsed


KINDS: dict[str, tuple[type[_Model], type[_Model]]] = {
    "StreamingCluster": (StreamingClusterSpec, StreamingClusterStatus),
    "PChannelAssignment": (PChannelAssignmentSpec, PChannelAssignmentStatus),
    "UpgradePlan": (UpgradePlanSpec, UpgradePlanStatus),
}

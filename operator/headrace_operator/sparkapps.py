"""SparkApplication objects of flush and compaction runs, as pure functions.

Two APIs carry the same run:

* Kubeflow's spark-operator, ``sparkoperator.k8s.io/v1beta2`` (the default):
  ``type: Python``, ``mainApplicationFile``, ``arguments``, ``driver`` and
  ``executor`` (cores, memory, env from the object store's Secret),
  ``restartPolicy: Never``, ``timeToLiveSeconds``; its state is
  ``status.applicationState.state`` (SUBMITTED, RUNNING, COMPLETED, FAILED, ...)
  with ``errorMessage`` naming the driver's exit code.
* Apache's spark-kubernetes-operator, ``spark.apache.org/v1``: ``pyFiles`` (the
  main file), ``driverArgs``, ``sparkConf`` (image, resources, and the
  Secret's keys as ``spark.kubernetes.{driver,executor}.secretKeyRef.*``),
  ``runtimeVersions.sparkVersion``, ``applicationTolerations`` (no restart,
  ``ttlAfterStopMillis``); its state is ``status.currentState.currentStateSummary``
  with the earlier states in ``status.stateTransitionHistory``.

Every run is a new object with a new name of at most 63 characters (names
over 63 break the Spark operators' pods and services), owned by its
StreamingCluster, and never changed after creation: editing a
SparkApplication's spec makes the Spark operator run it again. Retries are new
runs, so the Spark operator's own restarts are off. :func:`app_view` reads
either kind's status into one :class:`AppView`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from headrace_operator import builders, models
from headrace_operator.builders import ClusterRef
from headrace_operator.models import FlushSpec, RunJob, RunPhase, SparkOperatorKind

KIND = "SparkApplication"
KUBEFLOW_API = "sparkoperator.k8s.io/v1beta2"
APACHE_API = "spark.apache.org/v1"
APIS = {SparkOperatorKind.KUBEFLOW: KUBEFLOW_API, SparkOperatorKind.APACHE: APACHE_API}
MAX_NAME = 63
COMPONENT = "spark-run"
LABEL_JOB = f"{models.GROUP}/job"
TERM = f"{models.GROUP}/term"
RANGE_START = f"{models.GROUP}/range-start"
RANGE_END = f"{models.GROUP}/range-end"
MAIN_FILES = {RunJob.FLUSH: "flush.py", RunJob.COMPACT: "compact_pchannel.py"}
"""Main files under ``flush.appsDir``: ``spark_apps/flush.py`` and
``spark_apps/compact_pchannel.py`` (one compaction round of a pchannel)."""
ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
ENDPOINT_ENV = "HEADRACE_S3_ENDPOINT"


def choose_api(wanted: SparkOperatorKind, served: Mapping[str, bool]) -> tuple[str, str]:
    """The SparkApplication API to use and, when there is none, why (pure).

    ``served``: API version -> whether the API server serves SparkApplication
    there (API discovery)."""
    if wanted is SparkOperatorKind.AUTO:
        for api in (KUBEFLOW_API, APACHE_API):
            if served.get(api):
                return api, ""
        return "", (
            f"no Spark operator is installed: neither {KUBEFLOW_API} nor {APACHE_API} "
            "serves SparkApplication"
        )
    api = APIS[wanted]
    if served.get(api):
        return api, ""
    return "", f"flush.sparkOperator is {wanted.value} but the cluster does not serve {api}"


@dataclasses.dataclass(frozen=True, slots=True)
class RunRequest:
    """One run to create: a job over a pchannel's range under a term."""

    job: RunJob
    pchannel: str
    term: int
    start: str
    end: str
    nonce: str
    """Makes the name new (a few random lowercase letters and digits)."""


def run_name(cluster: str, job: RunJob, pchannel: str, nonce: str) -> str:
    """``<cluster>-<job>-<pchannel>-<nonce>``, shortened with a digest of the
    long part when it would pass :data:`MAX_NAME` (still unique per nonce)."""
    base = f"{cluster}-{job.value}-{pchannel}".lower()
    base = re.sub(r"[^a-z0-9-]", "-", base)
    room = MAX_NAME - len(nonce) - 1
    if len(base) > room:
        digest = hashlib.sha256(base.encode()).hexdigest()[:8]
        base = f"{base[: room - 9].rstrip('-')}-{digest}"
    return f"{base}-{nonce}"


def job_arguments(ref: ClusterRef, spec: models.StreamingClusterSpec, run: RunRequest) -> list[str]:
    """The main file's arguments, the flush job's flags (``spark_apps/flush.py``);
    the compaction job takes the same connection flags and its policy's."""
    flush = _flush(spec)
    store = flush.object_store
    args = [
        "--metastore",
        spec.metastore.url(),
        "--cluster",
        ref.metastore_cluster,
        "--pchannel",
        run.pchannel,
        "--warehouse",
        store.warehouse,
        "--s3-endpoint",
        store.endpoint,
        "--master",
        "",
    ]
    if run.job is RunJob.FLUSH:
        args += ["--term", str(run.term), "--start", run.start, "--end", run.end]
    else:
        policy = flush.compaction
        args += [
            "--min-small-files",
            str(policy.min_small_files),
            "--max-delete-ratio",
            f"{policy.max_delete_ratio:g}",
            "--target-file-bytes",
            str(policy.target_file_bytes),
        ]
    return args


def _flush(spec: models.StreamingClusterSpec) -> FlushSpec:
    if spec.flush is None:
        raise ValueError("the cluster has no flush section")
    return spec.flush


def _metadata(ref: ClusterRef, run: RunRequest) -> dict[str, Any]:
    labels = {
        builders.LABEL_NAME: "headrace",
        builders.LABEL_INSTANCE: ref.name,
        builders.LABEL_COMPONENT: COMPONENT,
        builders.LABEL_MANAGED_BY: builders.FIELD_MANAGER,
        builders.LABEL_CLUSTER: ref.name,
        builders.LABEL_PCHANNEL: run.pchannel,
        LABEL_JOB: run.job.value,
    }
    return {
        "name": run_name(ref.name, run.job, run.pchannel, run.nonce),
        "namespace": ref.namespace,
        "labels": labels,
        "annotations": {TERM: str(run.term), RANGE_START: run.start, RANGE_END: run.end},
        "ownerReferences": [ref.owner_reference()],
    }


def _secret_env(flush: FlushSpec) -> list[dict[str, Any]]:
    creds = flush.object_store.credentials
    env: list[dict[str, Any]] = [
        {
            "name": name,
            "valueFrom": {"secretKeyRef": {"name": creds.secret_name, "key": key}},
        }
        for name, key in (
            (ACCESS_KEY_ENV, creds.access_key_id_key),
            (SECRET_KEY_ENV, creds.secret_access_key_key),
        )
    ]
    env.append({"name": ENDPOINT_ENV, "value": flush.object_store.endpoint})
    return env


def kubeflow_app(
    ref: ClusterRef, spec: models.StreamingClusterSpec, run: RunRequest
) -> dict[str, Any]:
    """A ``sparkoperator.k8s.io/v1beta2`` SparkApplication of ``run``."""
    flush = _flush(spec)
    meta = _metadata(ref, run)
    pod_labels = {builders.LABEL_CLUSTER: ref.name, LABEL_JOB: run.job.value}
    driver: dict[str, Any] = {
        "cores": flush.driver.cores,
        "memory": flush.driver.memory,
        "labels": pod_labels,
        "env": _secret_env(flush),
    }
    if flush.driver.service_account:
        driver["serviceAccount"] = flush.driver.service_account
    return {
        "apiVersion": KUBEFLOW_API,
        "kind": KIND,
        "metadata": meta,
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": flush.image,
            "imagePullPolicy": "IfNotPresent",
            "mainApplicationFile": f"{flush.apps_dir.rstrip('/')}/{MAIN_FILES[run.job]}",
            "arguments": job_arguments(ref, spec, run),
            "sparkVersion": flush.spark_version,
            "restartPolicy": {"type": "Never"},
            "timeToLiveSeconds": flush.ttl_seconds,
            "driver": driver,
            "executor": {
                "instances": flush.executor.instances,
                "cores": flush.executor.cores,
                "memory": flush.executor.memory,
                "labels": pod_labels,
                "env": _secret_env(flush),
            },
        },
    }


def apache_app(
    ref: ClusterRef, spec: models.StreamingClusterSpec, run: RunRequest
) -> dict[str, Any]:
    """A ``spark.apache.org/v1`` SparkApplication of ``run``."""
    flush = _flush(spec)
    creds = flush.object_store.credentials
    conf = {
        "spark.kubernetes.container.image": flush.image,
        "spark.driver.cores": str(flush.driver.cores),
        "spark.driver.memory": flush.driver.memory,
        "spark.executor.instances": str(flush.executor.instances),
        "spark.executor.cores": str(flush.executor.cores),
        "spark.executor.memory": flush.executor.memory,
    }
    for role in ("driver", "executor"):
        conf[f"spark.kubernetes.{role}.secretKeyRef.{ACCESS_KEY_ENV}"] = (
            f"{creds.secret_name}:{creds.access_key_id_key}"
        )
        conf[f"spark.kubernetes.{role}.secretKeyRef.{SECRET_KEY_ENV}"] = (
            f"{creds.secret_name}:{creds.secret_access_key_key}"
        )
    conf[f"spark.kubernetes.driverEnv.{ENDPOINT_ENV}"] = flush.object_store.endpoint
    conf[f"spark.executorEnv.{ENDPOINT_ENV}"] = flush.object_store.endpoint
    if flush.driver.service_account:
        conf["spark.kubernetes.authenticate.driver.serviceAccountName"] = (
            flush.driver.service_account
        )
    return {
        "apiVersion": APACHE_API,
        "kind": KIND,
        "metadata": _metadata(ref, run),
        "spec": {
            "pyFiles": f"{flush.apps_dir.rstrip('/')}/{MAIN_FILES[run.job]}",
            "driverArgs": job_arguments(ref, spec, run),
            "sparkConf": conf,
            "runtimeVersions": {"sparkVersion": flush.spark_version},
            "applicationTolerations": {
                "restartConfig": {"restartPolicy": "Never"},
                "resourceRetainPolicy": "Never",
                "ttlAfterStopMillis": flush.ttl_seconds * 1000,
            },
        },
    }


def spark_app(
    api: str, ref: ClusterRef, spec: models.StreamingClusterSpec, run: RunRequest
) -> dict[str, Any]:
    """The SparkApplication of ``run`` in the API ``api``."""
    return kubeflow_app(ref, spec, run) if api == KUBEFLOW_API else apache_app(ref, spec, run)


def run_labels(cluster: str) -> dict[str, str]:
    """The labels every run of ``cluster`` carries (to list them)."""
    return {builders.LABEL_CLUSTER: cluster, builders.LABEL_COMPONENT: COMPONENT}


KUBEFLOW_PHASES = {
    "": RunPhase.PENDING,
    "NEW": RunPhase.PENDING,
    "SUBMITTED": RunPhase.SUBMITTED,
    "PENDING_RERUN": RunPhase.SUBMITTED,
    "RUNNING": RunPhase.RUNNING,
    "SUCCEEDING": RunPhase.RUNNING,
    "FAILING": RunPhase.RUNNING,
    "INVALIDATING": RunPhase.RUNNING,
    "UNKNOWN": RunPhase.RUNNING,
    "SUSPENDING": RunPhase.SUBMITTED,
    "SUSPENDED": RunPhase.SUBMITTED,
    "RESUMING": RunPhase.SUBMITTED,
    "COMPLETED": RunPhase.COMPLETED,
    "FAILED": RunPhase.FAILED,
    "SUBMISSION_FAILED": RunPhase.FAILED,
}
APACHE_PHASES = {
    "": RunPhase.PENDING,
    "Submitted": RunPhase.SUBMITTED,
    "ScheduledToRestart": RunPhase.SUBMITTED,
    "DriverRequested": RunPhase.RUNNING,
    "DriverStarted": RunPhase.RUNNING,
    "DriverReady": RunPhase.RUNNING,
    "RunningHealthy": RunPhase.RUNNING,
    "InitializedBelowThresholdExecutors": RunPhase.RUNNING,
    "RunningWithBelowThresholdExecutors": RunPhase.RUNNING,
    "Succeeded": RunPhase.COMPLETED,
    "Failed": RunPhase.FAILED,
    "SchedulingFailure": RunPhase.FAILED,
    "DriverStartTimedOut": RunPhase.FAILED,
    "ExecutorsStartTimedOut": RunPhase.FAILED,
    "DriverReadyTimedOut": RunPhase.FAILED,
    "DriverEvicted": RunPhase.FAILED,
}
APACHE_RELEASED = frozenset({"ResourceReleased", "TerminatedWithoutReleaseResources"})
"""States after the end of an attempt: the outcome is the state before them."""
_EXIT_CODE = re.compile(r"exit ?code:? *(-?[0-9]+)", re.IGNORECASE)


@dataclasses.dataclass(frozen=True, slots=True)
class AppView:
    """What the operator reads of one SparkApplication, whichever its API."""

    name: str
    pchannel: str
    job: RunJob | None
    phase: RunPhase
    app_state: str
    created: datetime.datetime
    message: str = ""
    exit_code: int | None = None
    term: int = 0
    start: str = ""
    end: str = ""
    deleting: bool = False


def parse_time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time of the API server (None when empty or malformed)."""
    try:
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


def _apache_state(status: Mapping[str, Any]) -> tuple[str, str]:
    """The outcome-bearing state of an Apache app and its message: past the
    end of the attempt (ResourceReleased) the last state before it."""
    current = status.get("currentState") or {}
    state = str(current.get("currentStateSummary", ""))
    message = str(current.get("message", ""))
    if state in APACHE_RELEASED:
        history = status.get("stateTransitionHistory") or {}
        ordered = sorted(history.items(), key=lambda item: int(item[0]) if item[0].isdigit() else 0)
        for _, entry in reversed(ordered):
            summary = str((entry or {}).get("currentStateSummary", ""))
            if summary not in APACHE_RELEASED:
                return summary, message or str((entry or {}).get("message", ""))
    return state, message


def app_view(obj: Mapping[str, Any]) -> AppView:
    """Read a SparkApplication of either API (pure)."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    if obj.get("apiVersion") == APACHE_API:
        state, message = _apache_state(status)
        phase = APACHE_PHASES.get(state, RunPhase.RUNNING)
    else:
        app_state = status.get("applicationState") or {}
        state, message = str(app_state.get("state", "")), str(app_state.get("errorMessage", ""))
        phase = KUBEFLOW_PHASES.get(state, RunPhase.RUNNING)
    match = _EXIT_CODE.search(message)
    job = labels.get(LABEL_JOB, "")
    term = str(annotations.get(TERM, "0"))
    created = parse_time(str(meta.get("creationTimestamp", "")))
    return AppView(
        name=str(meta.get("name", "")),
        pchannel=str(labels.get(builders.LABEL_PCHANNEL, "")),
        job=RunJob(job) if job in {j.value for j in RunJob} else None,
        phase=phase,
        app_state=state,
        created=created or datetime.datetime.fromtimestamp(0, datetime.UTC),
        message=message,
        exit_code=int(match.group(1)) if match else None,
        term=int(term) if term.isdigit() else 0,
        start=str(annotations.get(RANGE_START, "")),
        end=str(annotations.get(RANGE_END, "")),
        deleting=bool(meta.get("deletionTimestamp")),
    )

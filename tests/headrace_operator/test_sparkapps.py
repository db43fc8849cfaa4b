"""SparkApplications of flush and compaction runs (pure builders and readers)."""

from __future__ import annotations

import datetime

import pytest

from headrace_operator import builders, models, sparkapps
from headrace_operator.builders import ClusterRef
from headrace_operator.models import RunJob, RunPhase, SparkOperatorKind
from headrace_operator.sparkapps import RunRequest
from tests.headrace_operator.test_models import flush_section, valid

REF = ClusterRef(name="lake", namespace="data", uid="uid-1")


def spec(**flush: object) -> models.StreamingClusterSpec:
    return models.parse_cluster_spec(valid(flush=flush_section(**flush)))


FLUSH = RunRequest(RunJob.FLUSH, "pchannel-003", 4, "local:1:10", "local:1:20", "a1b2c3")


def test_api_choice_prefers_kubeflow_and_names_what_is_missing() -> None:
    both = {sparkapps.KUBEFLOW_API: True, sparkapps.APACHE_API: True}
    apache = {sparkapps.KUBEFLOW_API: False, sparkapps.APACHE_API: True}
    assert sparkapps.choose_api(SparkOperatorKind.AUTO, both) == (sparkapps.KUBEFLOW_API, "")
    assert sparkapps.choose_api(SparkOperatorKind.AUTO, apache) == (sparkapps.APACHE_API, "")
    assert sparkapps.choose_api(SparkOperatorKind.APACHE, both) == (sparkapps.APACHE_API, "")
    api, why = sparkapps.choose_api(SparkOperatorKind.KUBEFLOW, apache)
    assert api == "" and "sparkoperator.k8s.io/v1beta2" in why
    api, why = sparkapps.choose_api(SparkOperatorKind.AUTO, {})
    assert api == "" and "no Spark operator" in why


@pytest.mark.parametrize("cluster", ["lake", "a" * 63, "x-" * 31 + "y"])
@pytest.mark.parametrize("job", list(RunJob))
def test_names_are_new_short_and_valid(cluster: str, job: RunJob) -> None:
    names = {sparkapps.run_name(cluster, job, "pchannel-255", nonce) for nonce in ("abc123", "zz9")}
    assert len(names) == 2
    for name in names:
        assert len(name) <= sparkapps.MAX_NAME
        assert name[0].isalnum() and name[-1].isalnum() and "--" not in name.strip("-")
        assert all(c.islower() or c.isdigit() or c == "-" for c in name)


def test_kubeflow_flush_app() -> None:
    app = sparkapps.spark_app(sparkapps.KUBEFLOW_API, REF, spec(), FLUSH)
    meta, body = app["metadata"], app["spec"]
    assert (app["apiVersion"], app["kind"]) == ("sparkoperator.k8s.io/v1beta2", "SparkApplication")
    assert meta["name"] == "lake-flush-pchannel-003-a1b2c3"
    assert meta["ownerReferences"] == [REF.owner_reference()]
    assert meta["labels"][builders.LABEL_PCHANNEL] == "pchannel-003"
    assert meta["labels"][sparkapps.LABEL_JOB] == "flush"
    assert body["type"] == "Python" and body["mode"] == "cluster"
    assert body["mainApplicationFile"] == "local:///opt/headrace/spark_apps/flush.py"
    assert body["restartPolicy"] == {"type": "Never"}, "retries are new runs of the operator's"
    assert body["timeToLiveSeconds"] == 3600
    assert body["sparkVersion"] == "4.1.1"
    args = body["arguments"]
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs == {
        "--metastore": "etcd://etcd-0.etcd:2379,10.0.0.3:2379",
        "--cluster": "data.lake",
        "--pchannel": "pchannel-003",
        "--warehouse": "s3://lake/warehouse",
        "--s3-endpoint": "http://seaweed.storage:8333",
        "--master": "",
        "--term": "4",
        "--start": "local:1:10",
        "--end": "local:1:20",
    }
    secret_env = {
        e["name"]: e["valueFrom"]["secretKeyRef"] for e in body["driver"]["env"] if "valueFrom" in e
    }
    assert secret_env == {
        "AWS_ACCESS_KEY_ID": {"name": "lake-keys", "key": "AWS_ACCESS_KEY_ID"},
        "AWS_SECRET_ACCESS_KEY": {"name": "lake-keys", "key": "AWS_SECRET_ACCESS_KEY"},
    }
    assert body["executor"]["env"] == body["driver"]["env"]
    assert (body["executor"]["instances"], body["driver"]["memory"]) == (1, "1g")


def test_apache_compaction_app() -> None:
    request = RunRequest(RunJob.COMPACT, "pchannel-000", 2, "", "local:1:20", "q9")
    cluster = spec(driver={"serviceAccount": "spark", "cores": 2}, ttlSeconds=120)
    app = sparkapps.spark_app(sparkapps.APACHE_API, REF, cluster, request)
    body = app["spec"]
    assert app["apiVersion"] == "spark.apache.org/v1"
    assert body["pyFiles"] == "local:///opt/headrace/spark_apps/compact_pchannel.py"
    assert "--min-small-files" in body["driverArgs"] and "--term" not in body["driverArgs"]
    conf = body["sparkConf"]
    assert conf["spark.kubernetes.container.image"] == "headrace-spark:0.1.0"
    assert conf["spark.driver.cores"] == "2"
    assert conf["spark.kubernetes.authenticate.driver.serviceAccountName"] == "spark"
    assert (
        conf["spark.kubernetes.executor.secretKeyRef.AWS_SECRET_ACCESS_KEY"]
        == "lake-keys:AWS_SECRET_ACCESS_KEY"
    )
    assert body["runtimeVersions"] == {"sparkVersion": "4.1.1"}
    assert body["applicationTolerations"]["ttlAfterStopMillis"] == 120_000
    assert body["applicationTolerations"]["restartConfig"] == {"restartPolicy": "Never"}


def _kubeflow(state: str, message: str = "") -> dict[str, object]:
    app = sparkapps.spark_app(sparkapps.KUBEFLOW_API, REF, spec(), FLUSH)
    app["metadata"]["creationTimestamp"] = "2026-11-24T01:00:00Z"
    app["status"] = {"applicationState": {"state": state, "errorMessage": message}}
    return app


def test_kubeflow_states_and_exit_code() -> None:
    assert sparkapps.app_view(_kubeflow("")).phase is RunPhase.PENDING
    assert sparkapps.app_view(_kubeflow("SUBMITTED")).phase is RunPhase.SUBMITTED
    assert sparkapps.app_view(_kubeflow("RUNNING")).phase is RunPhase.RUNNING
    assert sparkapps.app_view(_kubeflow("COMPLETED")).phase is RunPhase.COMPLETED
    assert sparkapps.app_view(_kubeflow("SUBMISSION_FAILED")).phase is RunPhase.FAILED
    view = sparkapps.app_view(
        _kubeflow("FAILED", "driver container failed with ExitCode: 3, Reason: Error")
    )
    assert (view.phase, view.exit_code, view.term) == (RunPhase.FAILED, 3, 4)
    assert (view.pchannel, view.job, view.end) == ("pchannel-003", RunJob.FLUSH, "local:1:20")
    assert view.created == datetime.datetime(2026, 11, 24, 1, tzinfo=datetime.UTC)


def test_apache_outcome_is_the_state_before_resources_were_released() -> None:
    app = sparkapps.spark_app(sparkapps.APACHE_API, REF, spec(), FLUSH)
    history = {
        "0": {"currentStateSummary": "Submitted"},
        "1": {"currentStateSummary": "DriverRequested"},
        "2": {"currentStateSummary": "Failed", "message": "driver exit code 5"},
        "10": {"currentStateSummary": "ResourceReleased"},
    }
    app["status"] = {
        "currentState": {"currentStateSummary": "ResourceReleased"},
        "stateTransitionHistory": history,
    }
    view = sparkapps.app_view(app)
    assert (view.phase, view.app_state, view.exit_code) == (RunPhase.FAILED, "Failed", 5)
    app["status"] = {"currentState": {"currentStateSummary": "RunningHealthy"}}
    assert sparkapps.app_view(app).phase is RunPhase.RUNNING


def test_seal_policy_reaches_the_node_command_line() -> None:
    plain = builders.node_args(REF, spec(), 0)
    sealed = builders.node_args(REF, spec(seal={"lifetimeSeconds": 20}), 0)
    assert "--segment-lifetime-s" not in plain
    assert sealed[-2:] == ["--segment-lifetime-s", "20"]

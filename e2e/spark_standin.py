"""The test bed's stand-in for a Spark operator (Kubeflow's or Apache's).

Neither controller can be built here (e2e/README.md), so this plays one on
the real kube-apiserver, for the API the test installed:

* :func:`crds` are the SparkApplication CRDs of ``sparkoperator.k8s.io/v1beta2``
  and ``spark.apache.org/v1``, with the documented fields the Headrace operator
  writes (and the status fields this stand-in writes) spelled out;
* :class:`SparkStandIn` polls the namespace's SparkApplications of one API and
  runs each application's main file with ``spark-submit --master local[2]``
  (pyspark of the test venv), the object store's Secret keys and literal env
  resolved as the driver pod would get them, and writes status with that
  API's states and transitions: Kubeflow SUBMITTED -> RUNNING -> SUCCEEDING ->
  COMPLETED, or -> FAILING -> FAILED with ``driver container failed with
  ExitCode: N, Reason: Error``; Apache Submitted -> DriverRequested ->
  DriverStarted -> RunningHealthy -> Succeeded (or Failed) -> ResourceReleased,
  each in ``stateTransitionHistory``. Finished applications are deleted after
  their TTL; a deleted one's driver is killed.

Faults for tests: :meth:`SparkStandIn.inject` queues ``hang`` (the next new
application stays SUBMITTED/Submitted forever, as when its image cannot be
pulled) and ``fail`` (its driver exits with status 5 at once instead of
running the main file). The Headrace operator does not know any of this.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from e2e.harness import ApiError, Kube

REPO = Path(__file__).resolve().parents[1]
KUBEFLOW_API = "sparkoperator.k8s.io/v1beta2"
APACHE_API = "spark.apache.org/v1"
IMAGE_ROOT = "/opt/headrace/"
"""Where the Spark image holds the repository (``local:///opt/headrace/spark_apps/flush.py``);
mapped to this working tree, like the process-runner kubelet maps volumes."""
FAIL_EXIT = 5

_STR = {"type": "string"}
_INT = {"type": "integer"}
_STR_LIST = {"type": "array", "items": _STR}
_STR_MAP = {"type": "object", "additionalProperties": _STR}
_ENV = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["name"],
        "properties": {
            "name": _STR,
            "value": _STR,
            "valueFrom": {
                "type": "object",
                "properties": {
                    "secretKeyRef": {
                        "type": "object",
                        "properties": {"name": _STR, "key": _STR, "optional": {"type": "boolean"}},
                    }
                },
            },
        },
    },
}


def _pod(extra: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "cores": {"type": "integer", "minimum": 1},
            "coreLimit": _STR,
            "memory": _STR,
            "labels": _STR_MAP,
            "annotations": _STR_MAP,
            "env": _ENV,
            "serviceAccount": _STR,
            **extra,
        },
    }


def _crd(group: str, version: str, spec: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"sparkapplications.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": "SparkApplication",
                "listKind": "SparkApplicationList",
                "plural": "sparkapplications",
                "singular": "sparkapplication",
                "shortNames": ["sparkapp"],
            },
            "versions": [
                {
                    "name": version,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "apiVersion": _STR,
                                "kind": _STR,
                                "metadata": {"type": "object"},
                                "spec": spec,
                                "status": status,
                            },
                        }
                    },
                }
            ],
        },
    }


def kubeflow_crd() -> dict[str, Any]:
    spec = {
        "type": "object",
        "required": ["type", "sparkVersion", "mainApplicationFile", "driver", "executor"],
        "properties": {
            "type": {"type": "string", "enum": ["Java", "Python", "Scala", "R"]},
            "pythonVersion": {"type": "string", "enum": ["2", "3"]},
            "mode": {"type": "string", "enum": ["cluster", "client", "in-cluster-client"]},
            "image": _STR,
            "imagePullPolicy": _STR,
            "mainApplicationFile": _STR,
            "mainClass": _STR,
            "arguments": _STR_LIST,
            "sparkVersion": _STR,
            "sparkConf": _STR_MAP,
            "restartPolicy": {
                "type": "object",
                "properties": {
                    "type": {"type": "string", "enum": ["Never", "Always", "OnFailure"]},
                    "onFailureRetries": _INT,
                    "onFailureRetryInterval": _INT,
                    "onSubmissionFailureRetries": _INT,
                    "onSubmissionFailureRetryInterval": _INT,
                },
            },
            "timeToLiveSeconds": _INT,
            "driver": _pod({}),
            "executor": _pod({"instances": {"type": "integer", "minimum": 1}}),
        },
    }
    status = {
        "type": "object",
        "properties": {
            "sparkApplicationId": _STR,
            "submissionID": _STR,
            "lastSubmissionAttemptTime": {"type": "string", "format": "date-time"},
            "terminationTime": {"type": "string", "format": "date-time"},
            "driverInfo": {
                "type": "object",
                "properties": {"podName": _STR, "webUIAddress": _STR, "webUIServiceName": _STR},
            },
            "applicationState": {
                "type": "object",
                "properties": {"state": _STR, "errorMessage": _STR},
            },
            "executorState": _STR_MAP,
            "executionAttempts": _INT,
            "submissionAttempts": _INT,
        },
    }
    crd = _crd("sparkoperator.k8s.io", "v1beta2", spec, status)
    # *.k8s.io groups are protected: the published CRD carries this approval.
    approval = "https://github.com/kubeflow/spark-operator/pull/1298"
    crd["metadata"]["annotations"] = {"api-approved.kubernetes.io": approval}
    return crd


def apache_crd() -> dict[str, Any]:
    state = {
        "type": "object",
        "properties": {
            "currentStateSummary": _STR,
            "lastTransitionTime": _STR,
            "message": _STR,
        },
    }
    spec = {
        "type": "object",
        "properties": {
            "mainClass": _STR,
            "jars": _STR,
            "pyFiles": _STR,
            "driverArgs": _STR_LIST,
            "sparkConf": _STR_MAP,
            "runtimeVersions": {
                "type": "object",
                "required": ["sparkVersion"],
                "properties": {"sparkVersion": _STR, "scalaVersion": _STR, "jdkVersion": _STR},
            },
            "applicationTolerations": {
                "type": "object",
                "properties": {
                    "restartConfig": {
                        "type": "object",
                        "properties": {
                            "restartPolicy": {
                                "type": "string",
                                "enum": ["Always", "Never", "OnFailure", "OnInfrastructureFailure"],
                            },
                            "maxRestartAttempts": _INT,
                            "restartBackoffMillis": _INT,
                        },
                    },
                    "resourceRetainPolicy": {
                        "type": "string",
                        "enum": ["Always", "OnFailure", "Never"],
                    },
                    "ttlAfterStopMillis": _INT,
                },
            },
        },
    }
    status = {
        "type": "object",
        "properties": {
            "currentState": state,
            "stateTransitionHistory": {"type": "object", "additionalProperties": state},
        },
    }
    return _crd("spark.apache.org", "v1", spec, status)


def crds() -> list[dict[str, Any]]:
    return [kubeflow_crd(), apache_crd()]


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Run:
    def __init__(self, fault: str) -> None:
        self.fault = fault
        self.process: subprocess.Popen[bytes] | None = None
        self.step = 0
        self.finished_at: float | None = None


class SparkStandIn:
    """Plays the Spark operator of ``api`` for SparkApplications in ``namespace``."""

    def __init__(self, kube: Kube, api: str, namespace: str, logs: Path) -> None:
        self.kube, self.api, self.namespace, self.logs = kube, api, namespace, logs
        self.faults: list[str] = []
        self.runs: dict[str, _Run] = {}
        self._task: asyncio.Task[None] | None = None
        logs.mkdir(parents=True, exist_ok=True)

    def inject(self, *faults: str) -> None:
        """Queue faults (``hang``, ``fail``) for the next new applications."""
        self.faults.extend(faults)

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for run in self.runs.values():
            if run.process is not None and run.process.poll() is None:
                run.process.kill()
                run.process.wait()

    async def _loop(self) -> None:
        while True:
            apps = await self.kube.list(self.api, "SparkApplication", self.namespace)
            names = {a["metadata"]["uid"]: a for a in apps}
            for uid in set(self.runs) - set(names):
                run = self.runs.pop(uid)
                if run.process is not None and run.process.poll() is None:
                    run.process.kill()  # the application was deleted: its driver goes
            for uid, app in names.items():
                try:
                    await self._advance(uid, app)
                except ApiError as exc:  # deleted meanwhile: the next round sees it gone
                    if exc.status != 404:
                        raise
            await asyncio.sleep(0.5)

    async def _status(self, app: Mapping[str, Any], status: Mapping[str, Any]) -> None:
        name = app["metadata"]["name"]
        await self.kube.patch(
            self.api, "SparkApplication", self.namespace, name, {"status": status}, sub="status"
        )

    def _state(self, app: Mapping[str, Any]) -> str:
        status = app.get("status") or {}
        if self.api == KUBEFLOW_API:
            return str((status.get("applicationState") or {}).get("state", ""))
        return str((status.get("currentState") or {}).get("currentStateSummary", ""))

    async def _transition(self, app: Mapping[str, Any], state: str, message: str = "") -> None:
        now = _now()
        if self.api == KUBEFLOW_API:
            status: dict[str, Any] = {"applicationState": {"state": state, "errorMessage": message}}
            if state == "SUBMITTED":
                status.update(
                    submissionID=str(uuid.uuid4()),
                    lastSubmissionAttemptTime=now,
                    submissionAttempts=1,
                )
            if state == "RUNNING":
                status.update(
                    sparkApplicationId=f"spark-{uuid.uuid4().hex}",
                    executionAttempts=1,
                    driverInfo={"podName": f"{app['metadata']['name']}-driver"},
                )
            if state in ("COMPLETED", "FAILED"):
                status["terminationTime"] = now
        else:
            history = dict((app.get("status") or {}).get("stateTransitionHistory") or {})
            entry = {"currentStateSummary": state, "lastTransitionTime": now, "message": message}
            history[str(len(history))] = entry
            status = {"currentState": entry, "stateTransitionHistory": history}
        await self._status(app, status)

    async def _advance(self, uid: str, app: Mapping[str, Any]) -> None:
        state = self._state(app)
        run = self.runs.get(uid)
        if run is None:
            run = self.runs[uid] = _Run(self.faults.pop(0) if self.faults else "")
        kubeflow = self.api == KUBEFLOW_API
        if state == "":
            await self._transition(app, "SUBMITTED" if kubeflow else "Submitted")
        elif run.fault == "hang":
            return
        elif state in ("SUBMITTED", "Submitted"):
            run.process = self._launch(app, run)
            if run.process is None:
                return  # a Secret it needs is missing: the driver cannot start yet
            if kubeflow:
                await self._transition(app, "RUNNING")
            else:
                for step in ("DriverRequested", "DriverStarted", "RunningHealthy"):
                    await self._transition(app, step)
                    app = (
                        await self.kube.get(
                            self.api, "SparkApplication", self.namespace, app["metadata"]["name"]
                        )
                        or app
                    )
        elif state in ("RUNNING", "RunningHealthy") and run.process is not None:
            code = run.process.poll()
            if code is None:
                return
            await self._finish(app, code)
            run.finished_at = asyncio.get_running_loop().time()
        elif run.finished_at is not None:
            ttl = self._ttl(app)
            if ttl >= 0 and asyncio.get_running_loop().time() > run.finished_at + ttl:
                await self.kube.delete(
                    self.api, "SparkApplication", self.namespace, app["metadata"]["name"]
                )

    async def _finish(self, app: Mapping[str, Any], code: int) -> None:
        name = app["metadata"]["name"]
        if self.api == KUBEFLOW_API:
            if code == 0:
                await self._transition(app, "SUCCEEDING")
                await self._transition(app, "COMPLETED")
            else:
                message = f"driver container failed with ExitCode: {code}, Reason: Error"
                await self._transition(app, "FAILING", message)
                await self._transition(app, "FAILED", message)
            return
        steps = ["Succeeded"] if code == 0 else ["Failed"]
        for step in [*steps, "ResourceReleased"]:
            message = "" if code == 0 else f"driver container failed with exit code {code}"
            await self._transition(app, step, message)
            app = await self.kube.get(self.api, "SparkApplication", self.namespace, name) or app

    def _ttl(self, app: Mapping[str, Any]) -> float:
        spec = app.get("spec") or {}
        if self.api == KUBEFLOW_API:
            return float(spec.get("timeToLiveSeconds", -1))
        millis = (spec.get("applicationTolerations") or {}).get("ttlAfterStopMillis", -1)
        return float(millis) / 1000.0 if millis >= 0 else -1.0

    def _launch(self, app: Mapping[str, Any], run: _Run) -> subprocess.Popen[bytes] | None:
        """The driver process; None while a Secret key it needs is missing (a
        real driver pod stays in CreateContainerConfigError until it exists)."""
        spec = app.get("spec") or {}
        name = app["metadata"]["name"]
        if self.api == KUBEFLOW_API:
            main, args = spec["mainApplicationFile"], list(spec.get("arguments") or [])
            env_list = (spec.get("driver") or {}).get("env") or []
            resolved = {e["name"]: self._value(e) for e in env_list}
        else:
            main, args = spec["pyFiles"], list(spec.get("driverArgs") or [])
            resolved = self._apache_env(spec.get("sparkConf") or {})
        if any(value is None for value in resolved.values()):
            return None
        env = {key: value for key, value in resolved.items() if value is not None}
        path = main.removeprefix("local://")
        if path.startswith(IMAGE_ROOT):
            path = str(REPO / path.removeprefix(IMAGE_ROOT))
        child = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": os.environ.get("HOME", "/tmp"),
            "PYTHONPATH": str(REPO),
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            **{k: v for k, v in os.environ.items() if k in ("JAVA_HOME", "LANG", "TMPDIR")},
            **env,
        }
        if run.fault == "fail":
            argv = [sys.executable, "-c", f"import sys; sys.exit({FAIL_EXIT})"]
        else:
            submit = str(Path(sys.executable).parent / "spark-submit")
            argv = [submit, "--master", "local[2]", "--conf", "spark.ui.enabled=false", path, *args]
        log = (self.logs / f"{name}.log").open("ab")
        return subprocess.Popen(argv, env=child, stdout=log, stderr=subprocess.STDOUT)

    def _secret(self, name: str, key: str) -> str | None:
        """A Secret's key (None when the Secret or the key does not exist)."""
        path = f"/api/v1/namespaces/{self.namespace}/secrets/{name}"
        secret = self.kube.request("GET", path) or {}
        raw = (secret.get("data") or {}).get(key)
        return None if raw is None else base64.b64decode(raw).decode()

    def _value(self, entry: Mapping[str, Any]) -> str | None:
        ref = (entry.get("valueFrom") or {}).get("secretKeyRef")
        if ref:
            return self._secret(ref["name"], ref["key"])
        return str(entry.get("value", ""))

    def _apache_env(self, conf: Mapping[str, str]) -> dict[str, str | None]:
        env: dict[str, str | None] = {}
        for key, value in conf.items():
            if key.startswith("spark.kubernetes.driver.secretKeyRef."):
                secret, _, item = value.partition(":")
                env[key.rsplit(".", 1)[1]] = self._secret(secret, item)
            elif key.startswith("spark.kubernetes.driverEnv."):
                env[key.rsplit(".", 1)[1]] = value
        return env

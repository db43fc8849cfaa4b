"""Process runner: a stand-in for the kubelet, the container runtime and the scheduler.

It registers one Node (``headrace-local``), keeps its Lease and Ready condition
fresh, binds every unscheduled pod to that node, and runs each container of
the pods on it as a local process (see :mod:`headrace_testbed.kubelet_pod`),
with one loopback address per pod as its pod IP. ``e2e/README.md`` lists what
is simulated and what is not.

Three threads, all stopped by :meth:`ProcessRunner.stop`: a pod watch that
feeds a queue, a sync loop that owns every pod worker and talks to the API, and
a heartbeat for the node. Containers see only the environment the pod spec
gives them plus ``PATH`` (with shims such as ``headrace`` -> ``python -m
headrace.cli`` of this interpreter first), ``HOME``, ``HOSTNAME`` and ``POD_IP``.

Command line (against any kubeconfig)::

    PYTHONPATH=scripts python -m headrace_testbed.kubelet KUBECONFIG ROOT_DIR [--namespace NS]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import datetime
import json
import logging
import queue
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from headrace_testbed.kubelet_node import (
    AddressPool,
    KubeletConfig,
    arch,
    container_base_env,
    node_status,
)
from headrace_testbed.kubelet_pod import PodWorker, Runtime
from headrace_testbed.kubelet_spec import Obj, decode_secret, schedule_failure
from headrace_testbed.process import StopOnExit

log = logging.getLogger("headrace_testbed.kubelet")
_API_ERRORS = (ApiException, HTTPError, OSError, ValueError)
_STOP_GRACE_S = 5.0


class ProcessRunner(StopOnExit):
    """The kubelet stand-in; start with :meth:`start` or ``with``, stop with :meth:`stop`."""

    def __init__(self, api_client: Any, cfg: KubeletConfig) -> None:
        self.cfg = cfg
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self.labels = {
            "kubernetes.io/hostname": cfg.node_name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": arch(),
        }
        self._events: queue.Queue[tuple[str, Any]] = queue.Queue()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._workers: dict[str, PodWorker] = {}
        self._orphans: list[PodWorker] = []  # deleted from the API, processes still stopping
        self._pushed: dict[str, Obj] = {}
        self._unschedulable: set[str] = set()
        self._retry: dict[str, Obj] = {}  # by uid: pods whose handling failed on an API error
        self._retry_at = 0.0
        self._pool = AddressPool(cfg.pod_network, cfg.node_ip)
        self._executor = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="probe")
        self._threads: list[threading.Thread] = []
        self._watch_response: Any = None
        self.runtime = Runtime(
            root=cfg.root,
            node_ip=cfg.node_ip,
            base_env=container_base_env(cfg),
            entrypoint=cfg.entrypoint,
            lookup=self._lookup,
            executor=self._executor,
        )

    # -- API helpers --------------------------------------------------------------------------
    def _lookup(self, kind: str, namespace: str, name: str) -> Mapping[str, bytes] | None:
        read: Callable[..., Any] = (
            self.core.read_namespaced_config_map
            if kind == "ConfigMap"
            else self.core.read_namespaced_secret
        )
        try:
            obj = json.loads(read(name, namespace, _preload_content=False).data)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        if kind == "Secret":
            return decode_secret(obj.get("data"))
        data = {key: value.encode() for key, value in (obj.get("data") or {}).items()}
        data.update(decode_secret(obj.get("binaryData")))
        return data

    def _register_node(self) -> None:
        body: Any = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": self.cfg.node_name, "labels": self.labels},
        }
        try:
            self.core.create_node(body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            self.core.patch_node(
                self.cfg.node_name, {"metadata": {"labels": self.labels}}, _preload_content=False
            )
        self._heartbeat()

    def _heartbeat(self) -> None:
        name = self.cfg.node_name
        self.core.patch_node_status(name, {"status": node_status(self.cfg)}, _preload_content=False)
        renew = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": renew}
        try:
            self.coordination.patch_namespaced_lease(
                name, "kube-node-lease", {"spec": spec}, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            lease: Any = {"metadata": {"name": name, "namespace": "kube-node-lease"}, "spec": spec}
            self.coordination.create_namespaced_lease(
                "kube-node-lease", lease, _preload_content=False
            )

    def _list_kwargs(self) -> tuple[Callable[..., Any], tuple[str, ...]]:
        if self.cfg.namespace is None:
            return self.core.list_pod_for_all_namespaces, ()
        return self.core.list_namespaced_pod, (self.cfg.namespace,)

    # -- threads -------------------------------------------------------------------------------
    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.cfg.heartbeat_interval_s):
            try:
                self._heartbeat()
            except _API_ERRORS as exc:
                log.warning("node heartbeat failed: %s", exc)

    def _watch_loop(self) -> None:
        list_pods, args = self._list_kwargs()
        while not self._stop.is_set():
            try:
                listing = json.loads(list_pods(*args, _preload_content=False).data)
                self._events.put(("LIST", listing["items"]))
                version = listing["metadata"]["resourceVersion"]
                while not self._stop.is_set() and version:
                    version = self._watch_once(list_pods, args, version)
            except _API_ERRORS as exc:
                if not self._stop.is_set():
                    log.warning("pod watch failed, listing again: %s", exc)
                    self._stop.wait(1.0)

    def _watch_once(
        self, list_pods: Callable[..., Any], args: tuple[str, ...], version: str
    ) -> str:
        """Stream one watch; the resource version to resume from, or "" to list again."""
        timeout = self.cfg.watch_timeout_s
        response = list_pods(
            *args, watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=timeout, _preload_content=False, _request_timeout=(5, timeout + 10),
        )  # fmt: skip
        self._watch_response = response
        try:
            for line in response:
                if self._stop.is_set():
                    break
                event = json.loads(line)
                obj = event.get("object", {})
                if event.get("type") == "ERROR":
                    return ""  # usually 410 Gone: the version is too old
                version = obj.get("metadata", {}).get("resourceVersion", version)
                if event.get("type") != "BOOKMARK":
                    self._events.put((event["type"], obj))
        finally:
            self._watch_response = None
            response.release_conn()
        return version

    def _sync_loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._events_until(time.monotonic() + self.cfg.sync_interval_s)
                self._sync_workers()
            except _API_ERRORS as exc:
                log.warning("sync failed: %s", exc)
                self._stop.wait(0.5)
        self._shutdown_pods()

    def _events_until(self, deadline: float) -> None:
        while (remaining := deadline - time.monotonic()) > 0:
            try:
                kind, payload = self._events.get(timeout=remaining)
            except queue.Empty:
                break
            self._dispatch(kind, payload)
        if self._retry and time.monotonic() >= self._retry_at:
            retry, self._retry = self._retry, {}
            for pod in retry.values():
                self._on_pod(pod)

    def _dispatch(self, kind: str, payload: Any) -> None:
        if kind == "LIST":
            present = {pod["metadata"]["uid"] for pod in payload}
            for uid, worker in list(self._workers.items()):
                if uid not in present:
                    self._forget(uid, worker)
            for pod in payload:
                self._on_pod(pod)
        elif kind == "DELETED":
            uid = payload["metadata"]["uid"]
            self._retry.pop(uid, None)
            gone = self._workers.get(uid)
            if gone is not None:
                self._forget(uid, gone)
        else:
            self._on_pod(payload)

    # -- pod handling ---------------------------------------------------------------------------
    def _on_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        self._retry.pop(meta["uid"], None)
        try:
            self._handle_pod(pod)
        except _API_ERRORS as exc:
            log.warning("pod %s/%s: %s (will retry)", meta["namespace"], meta["name"], exc)
            self._retry[meta["uid"]] = pod
            self._retry_at = time.monotonic() + 1.0

    def _handle_pod(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        node = spec.get("nodeName")
        if not node:
            self._schedule(pod)
        elif node == self.cfg.node_name:
            worker = self._workers.get(meta["uid"])
            if worker is None:
                self._adopt(pod)
            else:
                worker.pod = pod
                if meta.get("deletionTimestamp"):
                    worker.begin_termination(meta.get("deletionGracePeriodSeconds"))

    def _schedule(self, pod: Obj) -> None:
        meta, spec = pod["metadata"], pod.get("spec", {})
        if (
            meta.get("deletionTimestamp")
            or spec.get("schedulerName", "default-scheduler") != "default-scheduler"
        ):
            return
        reason = schedule_failure(pod, self.labels)
        if reason is not None:
            if meta["uid"] not in self._unschedulable:
                self._unschedulable.add(meta["uid"])
                cond = {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": reason,
                }
                self.core.patch_namespaced_pod_status(
                    meta["name"],
                    meta["namespace"],
                    {"status": {"conditions": [cond]}},
                    _preload_content=False,
                )
            return
        binding: Any = {
            "apiVersion": "v1", "kind": "Binding",
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]},
            "target": {"apiVersion": "v1", "kind": "Node", "name": self.cfg.node_name},
        }  # fmt: skip
        try:
            self.core.create_namespaced_pod_binding(
                meta["name"], meta["namespace"], binding, _preload_content=False
            )
        except ApiException as exc:
            if exc.status not in (404, 409):  # gone, or bound meanwhile
                raise

    def _adopt(self, pod: Obj) -> None:
        meta, status = pod["metadata"], pod.get("status", {})
        if meta.get("deletionTimestamp"):
            self._delete_now(pod)
            return
        if status.get("phase") in ("Succeeded", "Failed"):
            return
        worker = PodWorker(pod, self._pool.allocate(status.get("podIP")), self.runtime)
        with self._lock:
            self._workers[meta["uid"]] = worker

    def _forget(self, uid: str, worker: PodWorker) -> None:
        worker.begin_termination(0)
        with self._lock:
            self._workers.pop(uid, None)
            self._orphans.append(worker)
        self._pushed.pop(uid, None)

    def _delete_now(self, pod: Obj) -> None:
        meta = pod["metadata"]
        options: Any = {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}}
        try:
            self.core.delete_namespaced_pod(
                meta["name"], meta["namespace"], body=options, _preload_content=False
            )
        except ApiException as exc:
            if exc.status not in (404, 409):
                raise

    def _sync_workers(self) -> None:
        now = time.monotonic()
        for worker in list(self._orphans):
            worker.sync(now)
            if worker.stopped():
                self._pool.release(worker.pod_ip)
                with self._lock:
                    self._orphans.remove(worker)
        for uid, worker in list(self._workers.items()):
            try:
                worker.sync(now)
                self._push_status(uid, worker)
                if worker.terminating and worker.stopped():
                    self._delete_now(worker.pod)
                    self._forget(uid, worker)
            except _API_ERRORS as exc:
                meta = worker.pod["metadata"]
                log.warning("pod %s/%s: %s (will retry)", meta["namespace"], meta["name"], exc)

    def _push_status(self, uid: str, worker: PodWorker) -> None:
        status = worker.status(self.cfg.node_ip)
        if self._pushed.get(uid) == status:
            return
        meta = worker.pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(
                meta["name"], meta["namespace"], {"status": status}, _preload_content=False
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
        self._pushed[uid] = status

    def _shutdown_pods(self) -> None:
        workers = [*self._workers.values(), *self._orphans]
        for worker in workers:
            worker.begin_termination(_STOP_GRACE_S)
        deadline = time.monotonic() + _STOP_GRACE_S + 2.0
        while any(not w.stopped() for w in workers) and time.monotonic() < deadline:
            for worker in workers:
                worker.sync(time.monotonic())
            time.sleep(0.05)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> Self:
        self._register_node()
        for target, name in (
            (self._watch_loop, "watch"),
            (self._sync_loop, "sync"),
            (self._heartbeat_loop, "node"),
        ):
            thread = threading.Thread(target=target, name=f"kubelet-{name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        response = self._watch_response
        if response is not None:
            with contextlib.suppress(Exception):
                response.shutdown()
        for thread in self._threads:
            thread.join(_STOP_GRACE_S + 10.0)
        self._executor.shutdown(wait=False, cancel_futures=True)

    def worker(self, namespace: str, name: str) -> PodWorker | None:
        """The running worker of a pod, if this runner runs it."""
        with self._lock:
            for worker in self._workers.values():
                meta = worker.pod["metadata"]
                if meta["namespace"] == namespace and meta["name"] == name:
                    return worker
        return None

    def pod_log(self, namespace: str, name: str, container: str) -> str:
        """Output of a container (all its restarts), as ``kubectl logs`` would show it."""
        worker = self.worker(namespace, name)
        if worker is None:
            return ""
        try:
            return worker.log_path(container).read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> Self:
        return self.start()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("kubeconfig", type=Path)
    parser.add_argument("root", type=Path)
    parser.add_argument("--namespace")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    api = config.new_client_from_config(config_file=str(args.kubeconfig))  # type: ignore[no-untyped-call]
    runner = ProcessRunner(api, KubeletConfig(root=args.root.resolve(), namespace=args.namespace))
    with runner, contextlib.suppress(KeyboardInterrupt):
        threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Container probes (tcpSocket, httpGet, exec, grpc) run against a pod's loopback IP."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class ProbeTarget:
    """Where a container's probes go and how its exec probes run."""

    pod_ip: str
    ports: Mapping[str, int]
    env: Mapping[str, str]
    cwd: Path


def _port(value: Any, target: ProbeTarget) -> int:
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    if value in target.ports:
        return target.ports[value]
    raise ValueError(f"probe names unknown port {value!r}")


def _tcp(spec: Obj, target: ProbeTarget, timeout: float) -> bool:
    host = spec.get("host") or target.pod_ip
    try:
        with socket.create_connection((host, _port(spec["port"], target)), timeout=timeout):
            return True
    except OSError:
        return False


def _http(spec: Obj, target: ProbeTarget, timeout: float) -> bool:
    scheme = str(spec.get("scheme", "HTTP")).lower()
    host = spec.get("host") or target.pod_ip
    path = spec.get("path") or "/"
    url = f"{scheme}://{host}:{_port(spec['port'], target)}{path}"
    request = urllib.request.Request(url)
    for header in spec.get("httpHeaders") or []:
        request.add_header(header["name"], header["value"])
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the kubelet does not verify probe certificates either
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return 200 <= int(response.status) < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400
    except (OSError, urllib.error.URLError):
        return False


def _exec(spec: Obj, target: ProbeTarget, timeout: float) -> bool:
    try:
        result = subprocess.run(
            list(spec["command"]),
            env=dict(target.env),
            cwd=target.cwd,
            capture_output=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0


def _grpc(spec: Obj, target: ProbeTarget, timeout: float) -> bool:
    import grpc  # noqa: PLC0415 - only grpc probes need it
    from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: PLC0415

    address = f"{target.pod_ip}:{_port(spec['port'], target)}"
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=spec.get("service") or ""), timeout=timeout
            )
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def run_probe(probe: Obj, target: ProbeTarget) -> bool:
    """One probe attempt; unsupported or malformed probes fail."""
    timeout = float(probe.get("timeoutSeconds") or 1)
    handlers = {"tcpSocket": _tcp, "httpGet": _http, "exec": _exec, "grpc": _grpc}
    for key, handler in handlers.items():
        if key in probe:
            try:
                return handler(probe[key], target, timeout)
            except (ValueError, KeyError, TypeError):
                return False
    return False


@dataclasses.dataclass
class ProbeState:
    """Thresholds and timing of one probe of one container run."""

    spec: Obj
    result: bool
    started_at: float
    successes: int = 0
    failures: int = 0
    next_at: float = 0.0
    pending: concurrent.futures.Future[bool] | None = None

    def __post_init__(self) -> None:
        self.next_at = self.started_at + float(self.spec.get("initialDelaySeconds") or 0)

    def poll(self, now: float, executor: concurrent.futures.Executor, target: ProbeTarget) -> None:
        """Collect a finished attempt and start one that is due."""
        if self.pending is not None and self.pending.done():
            ok = not self.pending.exception() and self.pending.result()
            self.pending = None
            self._record(ok)
        if self.pending is None and now >= self.next_at:
            self.next_at = now + float(self.spec.get("periodSeconds") or 10)
            self.pending = executor.submit(run_probe, self.spec, target)

    def _record(self, ok: bool) -> None:
        if ok:
            self.successes += 1
            self.failures = 0
            if self.successes >= int(self.spec.get("successThreshold") or 1):
                self.result = True
        else:
            self.failures += 1
            self.successes = 0
            if self.failures >= int(self.spec.get("failureThreshold") or 3):
                self.result = False

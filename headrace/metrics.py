"""Prometheus endpoints: one registry per process part, served on its own port.

Each part that exports metrics (a node, the standalone, the operator) owns a
``CollectorRegistry`` (never the library's global one), so several nodes in
one test process do not mix their series, and serves it with
:func:`serve` on a port of its own, apart from the gRPC port.

Naming follows Prometheus conventions: a ``headrace_`` prefix, base units in
names (``_seconds``, ``_bytes``), ``_total`` on counters (added by
prometheus-client), and bounded label sets: ``pchannel`` (a cluster has a
few), error codes, states and outcomes; never a vchannel or a message id.
"""

from __future__ import annotations

import dataclasses
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from headrace import errors

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Seconds, for appends, scans and handoffs (0.5 ms to 10 s)."""

SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
"""Messages per request (one produce request, one consume response)."""


@dataclasses.dataclass
class MetricsServer:
    """A running metrics endpoint; :meth:`close` stops it."""

    server: WSGIServer
    address: str
    """host:port it listens on (the real port when asked for port 0)."""

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` as (host, port); InvalidArgument naming the value (pure)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise errors.InvalidArgument(f"metrics address {listen!r} is not host:port")
    return host.strip("[]") or "0.0.0.0", int(port)


def serve(registry: CollectorRegistry, listen: str) -> MetricsServer:
    """Serve ``registry`` at ``http://listen/metrics`` from a daemon thread;
    Unavailable if the port cannot be bound."""
    host, port = parse_listen(listen)
    try:
        server, _thread = start_http_server(port, addr=host, registry=registry)
    except OSError as exc:
        raise errors.Unavailable(f"cannot serve metrics on {listen}: {exc}") from None
    bound_port = server.server_address[1]
    return MetricsServer(server, f"{host}:{bound_port}")

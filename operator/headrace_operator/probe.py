"""Does the metastore and the WAL backend of a cluster answer? (TCP probe)

A cheap liveness check the operator runs every pass: open a TCP connection to
the etcd endpoints and to the WAL backend (Kafka bootstrap servers, the Pulsar
broker). A service counts as reachable when at least one of its endpoints
accepts. The local backend has nothing to reach.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from urllib.parse import urlsplit

from headrace_operator.models import StreamingClusterSpec


def split_host_port(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    return host.strip("[]"), int(port)


def pulsar_endpoint(service_url: str) -> str:
    parts = urlsplit(service_url)
    return f"{parts.hostname}:{parts.port}"


def targets(spec: StreamingClusterSpec) -> dict[str, list[str]]:
    """Service name -> endpoints to probe (pure)."""
    found = {"etcd": list(spec.metastore.etcd_endpoints)}
    if spec.wal.kafka is not None:
        found["kafka"] = list(spec.wal.kafka.bootstrap_servers)
    if spec.wal.pulsar is not None:
        found["pulsar"] = [pulsar_endpoint(spec.wal.pulsar.service_url)]
    return found


class TcpProbe:
    def __init__(self, timeout: float = 2.0) -> None:
        self.timeout = timeout

    async def reachable(self, endpoint: str) -> bool:
        host, port = split_host_port(endpoint)
        try:
            _reader, writer = await asyncio.wait_for(
                asyncio.open_connection(host, port), self.timeout
            )
        except (OSError, TimeoutError):
            return False
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return True

    async def check(self, spec: StreamingClusterSpec) -> Sequence[str]:
        problems = []
        for service, endpoints in targets(spec).items():
            answers = await asyncio.gather(*(self.reachable(e) for e in endpoints))
            if not any(answers):
                problems.append(f"{service} unreachable at {', '.join(endpoints)}")
        return problems

"""TCP reachability of the metastore and WAL backends, on loopback."""

from __future__ import annotations

import socket
from typing import Any

from headrace_operator import models, probe
from tests.headrace_operator.op_harness import tcp_listener


def spec(etcd: str, **wal: Any) -> models.StreamingClusterSpec:
    raw: dict[str, Any] = {
        "pchannels": 1,
        "image": "i",
        "version": "v",
        "metastore": {"etcdEndpoints": [etcd]},
    }
    if wal:
        raw["wal"] = wal
    return models.parse_cluster_spec(raw)


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"


def test_targets() -> None:
    s = spec("e:2379", backend="pulsar", pulsar={"serviceUrl": "pulsar+ssl://broker:6651"})
    assert probe.targets(s) == {"etcd": ["e:2379"], "pulsar": ["broker:6651"]}
    assert probe.split_host_port("[::1]:2379") == ("::1", 2379)


async def test_reachable_and_unreachable() -> None:
    dead = closed_port()
    async with tcp_listener() as alive:
        tcp = probe.TcpProbe(timeout=2.0)
        assert await tcp.check(spec(alive)) == []
        assert (
            await tcp.check(
                spec(f"{alive}", backend="kafka", kafka={"bootstrapServers": [dead, alive]})
            )
            == []
        )
        problems = await tcp.check(spec(dead, backend="kafka", kafka={"bootstrapServers": [dead]}))
    assert problems == [f"etcd unreachable at {dead}", f"kafka unreachable at {dead}"]

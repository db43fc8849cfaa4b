"""A node whose Kafka or Pulsar broker is down stays up and reports the WAL unavailable.

The node runs as ``headrace node --wal kafka|pulsar ...`` (a real process) on a
SQLite metastore, pointed at a loopback port nobody listens on; the test plays
the coordinator by writing the assignment record. The open fails with a
retryable UNAVAILABLE naming the broker address, the Manager service lists the
WAL as UNAVAILABLE with that error while the node retries with backoff, and
producers get UNAVAILABLE (retryable). With a real broker (marks ``kafka`` /
``pulsar``) the same port later starts forwarding to it: the retried open
succeeds and the WAL is served. In-process, with stand-in backends: an open
that hangs is cut off by its bound, and a WAL whose backend fails while it is
served turns UNAVAILABLE and is reopened under the same term once it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import grpc
import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.api import cluster_status
from headrace.client.manager import ManagerClient, WALStatus
from headrace.cluster import NEW_CLUSTER_ROUTING, Assignment, AssignmentState, Keys, NodeInfo, route
from headrace.message.ids import MessageID
from headrace.metastore.factory import open_metastore
from headrace.node.server import NodeConfig, StreamingNode
from headrace.node.walmanager import WALManager
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.tso import LocalTSO
from headrace.wal.contract import BackendWriter, Record
from headrace.wal.framework import WALOptions
from headrace.wal.memory import MemoryBackend
from tests.node.harness import HANG_GUARD, Cluster, error_details

PCHANNEL = "bd-0"
NODE = "bd-node"
OP_TIMEOUT = "2"
"""--wal-operation-timeout of the node: how long one failed open takes at most."""
BROKER_OP_TIMEOUT = "10"
"""--wal-operation-timeout of a node that must open its WAL on a real broker
once it is reachable (the product default is 30): each call of a first open
(creating the topics, taking the exclusive producer, the subscriptions) must
fit in it. With :data:`OP_TIMEOUT` a broker slow to answer (a JVM standalone
on a loaded 2-core machine) has each retried open cut off the same way, so
the WAL is never served within the wait."""
SERVING_WITHIN_S = 120.0
"""How long a node with :data:`BROKER_OP_TIMEOUT` may take to serve the WAL
once the broker is reachable: a first open cut off by its bound (4x the
operation timeout) and the retry after it."""


def closed_port() -> socket.socket:
    """A loopback port held by this process and not listening: connections to
    it are refused, and no other process can take it (a port found free and
    released could be taken by anyone, e.g. as another connection's local
    port, before the test uses it)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def port_of(sock: socket.socket) -> int:
    port: int = sock.getsockname()[1]
    return port


def broker_flags(backend: str, address: str) -> list[str]:
    if backend == "kafka":
        return ["--wal", "kafka", "--kafka-bootstrap", address]
    return ["--wal", "pulsar", "--pulsar-url", f"pulsar://{address}"]


class NodeProcess:
    """``headrace node`` as a child process, its output in a log file."""

    def __init__(self, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.proc = proc
        self.log = log

    @classmethod
    async def start(
        cls, tmp_path: Path, cluster: Cluster, flags: list[str], op_timeout: str = OP_TIMEOUT
    ) -> NodeProcess:
        log = tmp_path / "node.log"
        with log.open("ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "headrace.cli",
                "-v",
                "node",
                "--node-id",
                NODE,
                "--metastore",
                cluster.url,
                "--cluster",
                cluster.keys.cluster,
                "--lease-ttl",
                "3",
                "--wal-operation-timeout",
                op_timeout,
                *flags,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        return cls(proc, log)

    def alive(self) -> bool:
        return self.proc.returncode is None

    def output(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    async def address(self, cluster: Cluster) -> str:
        key = cluster.keys.node(NODE)
        async with asyncio.timeout(HANG_GUARD):
            while (kv := await cluster.metastore.get(key)) is None:
                assert self.alive(), f"the node died while starting:\n{self.output()}"
                await asyncio.sleep(0.05)
        return NodeInfo.from_json(kv.value).address

    async def stop(self) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(HANG_GUARD):
                return await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise AssertionError(f"the node ignored SIGTERM:\n{self.output()}") from None


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    url = f"sqlite://{tmp_path}/meta.db"
    metastore = await open_metastore(url)
    # A fresh name: with a real broker it names fresh topics.
    c = Cluster(url, metastore, Keys(f"bd{uuid.uuid4().hex[:10]}"))
    await c.configure([PCHANNEL])
    try:
        yield c
    finally:
        await metastore.close()


async def assign(cluster: Cluster, term: int = 1) -> None:
    record = Assignment(
        pchannel=PCHANNEL,
        state=AssignmentState.ASSIGNING,
        term=term,
        node=NODE,
        updated_at=time.time(),
    )
    await cluster.write(record)


async def wal_status(
    manager: ManagerClient, wanted: str, node: NodeProcess | None = None, within: float = 45.0
) -> WALStatus:
    """Poll the node's Manager service until it lists the WAL in state ``wanted``
    (checking all along that the ``node`` process, if given, is alive)."""
    async with asyncio.timeout(within):
        while True:
            assert node is None or node.alive(), f"the node died:\n{node and node.output()}"
            status = (await manager.list_wals()).find(PCHANNEL)
            if status is not None and status.state == wanted:
                return status
            await asyncio.sleep(0.1)


async def produce_raw(address: str) -> grpc.aio.AioRpcError:
    """Open a Produce stream on the node itself; the error that ends it."""
    async with grpc.aio.insecure_channel(address) as channel:
        call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
        await call.write(pb.ProduceRequest(open=pb.OpenProducer(pchannel=PCHANNEL, term=1)))
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await call.read()
        return info.value


def vchannel_of(pchannel: str) -> str:
    return next(
        v
        for v in (f"v{i}" for i in range(100))
        if route(v, [pchannel], NEW_CLUSTER_ROUTING) == pchannel
    )


@pytest.mark.parametrize("backend", ["kafka", "pulsar"])
async def test_a_node_whose_broker_is_down_reports_the_wal_unavailable(
    tmp_path: Path, cluster: Cluster, backend: str
) -> None:
    port = closed_port()
    broker = f"127.0.0.1:{port_of(port)}"
    node = await NodeProcess.start(tmp_path, cluster, broker_flags(backend, broker))
    try:
        address = await node.address(cluster)
        await assign(cluster)
        manager = ManagerClient(address)
        try:
            status = await wal_status(manager, "UNAVAILABLE", node)
            assert status.term == 1
            assert broker in status.stats["error"], status.stats
            assert status.stats["error"].startswith("UNAVAILABLE")
            assert status.stats["retryable"] == "true"
            # It keeps trying, with backoff, and stays up.
            async with asyncio.timeout(45):
                while int(status.stats["attempts"]) < 2:
                    status = await wal_status(manager, "UNAVAILABLE", node)
            with pytest.raises(errors.Unavailable) as opened:
                await manager.open_wal(PCHANNEL, 1, timeout=HANG_GUARD)
            assert opened.value.retryable and broker in opened.value.message
        finally:
            await manager.close()

        # `headrace status` shows what the owner reports, with the error.
        report = await cluster_status(cluster.url, cluster.keys.cluster)
        (row,) = [r for r in report["pchannels"] if r["pchannel"] == PCHANNEL]
        assert row["state"] == "ASSIGNING" and row["wal_state"] == "UNAVAILABLE", row
        assert broker in row["wal_error"], row

        refused = await produce_raw(address)
        assert refused.code() is grpc.StatusCode.UNAVAILABLE
        details = error_details(refused)
        assert details["code"] == "UNAVAILABLE" and details["retryable"] is True
        assert broker in details["message"]

        async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
            producer = client.producer(ProducerOptions(deadline=2.0))
            with pytest.raises(errors.Unavailable) as sent:
                await producer.send(vchannel_of(PCHANNEL), b"nothing to take it")
            assert sent.value.retryable
            await producer.close()

        record = await cluster.record(PCHANNEL)
        assert record is not None and record.state is AssignmentState.ASSIGNING
        assert node.alive(), node.output()
        assert await node.stop() == 0
    finally:
        if node.alive():
            node.proc.kill()
            await node.proc.wait()
        port.close()


class StuckBackend(MemoryBackend):
    """A backend whose writers never open (a broker that accepts and never answers),
    or whose client raises an error nobody translated."""

    def __init__(self, failure: Exception | None = None) -> None:
        super().__init__()
        self.failure = failure

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        if self.failure is not None:
            raise self.failure
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


@pytest.mark.parametrize("failure", [None, ConnectionResetError("peer reset")])
async def test_an_open_is_bounded_and_its_failure_reported(failure: Exception | None) -> None:
    manager = WALManager("n1", StuckBackend(failure), LocalTSO(), WALOptions(), open_timeout_s=0.2)
    manager.directory.assignments[PCHANNEL] = Assignment(
        pchannel=PCHANNEL, state=AssignmentState.ASSIGNING, term=2, node="n1"
    )
    for attempt in (1, 2):
        with pytest.raises(errors.Unavailable) as opened:
            async with asyncio.timeout(HANG_GUARD):
                await manager.open(PCHANNEL, 2)
        assert opened.value.retryable
        assert manager.failures[PCHANNEL].attempts == attempt
    expected = "within 0.2 s (memory backend)" if failure is None else "peer reset"
    assert expected in opened.value.message
    with pytest.raises(errors.Unavailable, match="cannot open the WAL of bd-0"):
        manager.get(PCHANNEL)
    # Once the pchannel goes elsewhere, it is not reported nor refused as UNAVAILABLE.
    manager.directory.assignments[PCHANNEL] = Assignment(
        pchannel=PCHANNEL, state=AssignmentState.ASSIGNING, term=3, node="n2"
    )
    with pytest.raises(errors.NotOwner):
        manager.get(PCHANNEL)
    assert not await manager.close(PCHANNEL, drain=False)
    assert PCHANNEL not in manager.failures


class FlakyBackend(MemoryBackend):
    """A memory backend that goes down like a broker: while ``down``, opening,
    appending and reading the last record fail with UNAVAILABLE."""

    down = False

    def check(self) -> None:
        if self.down:
            raise errors.Unavailable("the flaky broker is down")

    async def open_writer(self, pchannel: str, term: int) -> BackendWriter:
        self.check()
        return FlakyWriter(self, await super().open_writer(pchannel, term))

    async def last_record(self, pchannel: str) -> Record | None:
        self.check()
        return await super().last_record(pchannel)


class FlakyWriter(BackendWriter):
    def __init__(self, backend: FlakyBackend, inner: BackendWriter) -> None:
        self.pchannel, self.term = inner.pchannel, inner.term
        self._backend = backend
        self._inner = inner

    async def append(self, records: Sequence[bytes]) -> list[MessageID]:
        self._backend.check()
        return await self._inner.append(records)

    async def close(self) -> None:
        await self._inner.close()


async def test_a_wal_that_fails_while_served_is_reopened_once_its_broker_is_back(
    cluster: Cluster,
) -> None:
    backend = FlakyBackend()
    name = cluster.keys.cluster
    config = NodeConfig(
        node_id=NODE,
        metastore_url=cluster.url,
        cluster=name,
        wal_backend="memory",
        wal_options=WALOptions(timetick_interval_ms=20),
        session_ttl=3.0,
        shutdown_grace=0.5,
    )
    node = StreamingNode(config, backend=backend)
    await node.start()
    manager = ManagerClient(node.address)
    vchannel = vchannel_of(PCHANNEL)
    try:
        await assign(cluster)
        await cluster.wait_state(PCHANNEL, AssignmentState.ASSIGNED, 1)
        async with HeadraceClient(cluster.url, name) as client:
            producer = client.producer(ProducerOptions(deadline=1.5))
            before = await producer.send(vchannel, b"before")
            backend.down = True
            with pytest.raises(errors.Unavailable) as sent:
                await producer.send(vchannel, b"during")
            assert sent.value.retryable
            status = await wal_status(manager, "UNAVAILABLE")
            assert "flaky broker is down" in status.stats["error"], status.stats
            backend.down = False
            served = await wal_status(manager, "SERVING")
            assert served.term == 1
            after = await producer.send(vchannel, b"after")
            await producer.close()
            assert (before.term, after.term) == (1, 1)
            got: list[bytes] = []
            async with client.consume(vchannel, start="earliest") as consumer:
                while len(got) < 2:
                    entry = await consumer.next(timeout=HANG_GUARD)
                    assert entry is not None
                    got.append(entry.message.payload)
            assert got == [b"before", b"after"]
        record = await cluster.record(PCHANNEL)
        assert record is not None and (record.state, record.term) == (AssignmentState.ASSIGNED, 1)
    finally:
        await manager.close()
        await node.stop()


class Forwarder:
    """A loopback TCP port that refuses connections until :meth:`open`, then
    forwards them to ``target``; the port is held from the start."""

    def __init__(self, target: str) -> None:
        self.sock = closed_port()
        self.port = port_of(self.sock)
        host, _, target_port = target.rpartition(":")
        self.target = (host, int(target_port))
        self.server: asyncio.Server | None = None
        self.pipes: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        self.server = await asyncio.start_server(self._connect, sock=self.sock)

    async def _connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for source, sink in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(source, sink))
            self.pipes.add(task)
            task.add_done_callback(self.pipes.discard)

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await source.read(65536):
                sink.write(data)
                await sink.drain()
        sink.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
        self.sock.close()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)


async def serves_once_the_broker_is_up(
    tmp_path: Path, cluster: Cluster, backend: str, real: str
) -> None:
    """Down first (the port refuses connections), then the port forwards to
    the real broker."""
    forwarder = Forwarder(real)
    flags = broker_flags(backend, f"127.0.0.1:{forwarder.port}")
    if backend == "kafka":
        flags += ["--kafka-config", "reconnect.backoff.max.ms=1000"]
    node = await NodeProcess.start(tmp_path, cluster, flags, BROKER_OP_TIMEOUT)
    try:
        address = await node.address(cluster)
        await assign(cluster)
        manager = ManagerClient(address)
        try:
            down = await wal_status(manager, "UNAVAILABLE", node)
            assert f"127.0.0.1:{forwarder.port}" in down.stats["error"]
            await forwarder.open()
            served = await wal_status(manager, "SERVING", node, SERVING_WITHIN_S)
            assert served.term == 1
        finally:
            await manager.close()
        await cluster.wait_state(PCHANNEL, AssignmentState.ASSIGNED, 1)
        async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
            producer = client.producer(ProducerOptions(deadline=30.0))
            result = await producer.send(vchannel_of(PCHANNEL), b"after the outage")
            await producer.close()
        assert result.term == 1
        assert node.alive(), node.output()
        assert await node.stop() == 0
    finally:
        if node.alive():
            node.proc.kill()
            await node.proc.wait()
        await forwarder.close()


@pytest.mark.kafka
@pytest.mark.timeout(240)
async def test_kafka_wal_is_served_once_the_broker_is_up(
    tmp_path: Path, cluster: Cluster, kafka_bootstrap: str
) -> None:
    await serves_once_the_broker_is_up(tmp_path, cluster, "kafka", kafka_bootstrap)


@pytest.mark.pulsar
@pytest.mark.timeout(240)
async def test_pulsar_wal_is_served_once_the_broker_is_up(
    tmp_path: Path, cluster: Cluster, pulsar_url: str
) -> None:
    await serves_once_the_broker_is_up(
        tmp_path, cluster, "pulsar", pulsar_url.removeprefix("pulsar://").rstrip("/")
    )

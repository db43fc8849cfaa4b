"""The cluster-wide write stop through real streaming nodes and the client.

Producers get the retryable WRITES_STOPPED while writes are stopped and wait
(with backoff) up to their deadline; appends admitted before the stop finish
and are reported as in flight until they do; nothing acknowledged is lost or
written twice; writes flow again after resume.
"""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import redirect_stdout
from pathlib import Path

import pytest

from headrace import errors
from headrace.cli.main import main as cli_main
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client.status import status
from headrace.coordinator import writestop
from headrace.message.types import Message, MessageType
from headrace.metastore.contract import KeyValue
from headrace.node.errors import STATUS_OF_CODE, to_proto
from headrace.node.server import StreamingNode
from headrace.node.writegate import WriteGate
from headrace.wal.api import AppendResult
from tests.node.harness import Cluster, make_cluster, until

P = "pchannel-000"
V = "orders-0"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    async for c in make_cluster(tmp_path):
        yield c


async def serving(cluster: Cluster, *nodes: str) -> list[StreamingNode]:
    await cluster.configure([P])
    started = [await cluster.start_node(node) for node in nodes]
    await cluster.assign(P, nodes[0], 1)
    return started


async def stop_state(cluster: Cluster) -> writestop.StopState:
    return await writestop.read_stop(cluster.metastore, cluster.keys)


async def wait_drained(cluster: Cluster, nodes: Sequence[str], want: str = "") -> str:
    """Poll until :func:`writestop.drained` says ``want`` (contained); its last word."""
    async with asyncio.timeout(20):
        while True:
            reason = writestop.drained(await stop_state(cluster), nodes)
            if (want and want in reason) or (not want and not reason):
                return reason
            await asyncio.sleep(0.02)


async def consumed(cluster: Cluster, count: int) -> list[bytes]:
    async with (
        HeadraceClient(cluster.url, cluster.keys.cluster) as client,
        client.consume(V, start="earliest", types={MessageType.INSERT}) as consumer,
    ):
        payloads: list[bytes] = []
        while len(payloads) < count:
            entry = await consumer.next(timeout=10)
            assert entry is not None, f"only {len(payloads)} of {count} messages came back"
            payloads.append(entry.message.payload)
        assert await consumer.next(timeout=0.5) is None, "more messages than were acknowledged"
    return payloads


def test_the_gate_refuses_producers_data_but_lets_flushes_and_txn_ends_pass() -> None:
    gate = WriteGate("node-a")
    assert gate.refusal_for(MessageType.INSERT) is None, "no stop: everything passes"
    assert gate.ack() is None
    record = writestop.WriteStop(reason="upgrade to v2", by="demo/up")
    gate.observe(_kv(record, revision=7))
    refused = gate.refusal_for(MessageType.INSERT)
    assert isinstance(refused, errors.WritesStopped) and refused.retryable
    assert refused.message.startswith("writes stopped: upgrade in progress (upgrade to v2")
    assert "by demo/up" in refused.message
    for kind in (MessageType.DELETE, MessageType.CREATE_COLLECTION, MessageType.BEGIN_TXN):
        assert gate.refusal_for(kind) is not None, kind
    for kind in (MessageType.FLUSH, MessageType.COMMIT_TXN, MessageType.ROLLBACK_TXN):
        assert gate.refusal_for(kind) is None, kind
    with gate.appending(3):
        ack = gate.ack()
        assert ack is not None and (ack.stop_revision, ack.in_flight) == (7, 3)
    after = gate.ack()
    assert after is not None and after.in_flight == 0
    gate.observe(_kv(b"{not json", revision=8))
    assert gate.refusal_for(MessageType.INSERT) is not None, "a malformed stop still stops"
    gate.observe(None)
    assert gate.refusal_for(MessageType.INSERT) is None and gate.ack() is None


def _kv(record: writestop.WriteStop | bytes, revision: int) -> KeyValue:
    value = record if isinstance(record, bytes) else record.to_json()
    return KeyValue("k", value, revision, revision, 1)


def test_writes_stopped_is_mapped_once_retryable_on_the_wire() -> None:
    from headrace.client.errors import from_proto  # noqa: PLC0415

    stopped = writestop.refusal(writestop.WriteStop(reason="r"))
    back = from_proto(to_proto(stopped))
    assert isinstance(back, errors.WritesStopped) and back.retryable
    assert back.code is errors.ErrorCode.WRITES_STOPPED
    assert STATUS_OF_CODE[errors.ErrorCode.WRITES_STOPPED].name == "UNAVAILABLE"


def test_drained_says_which_node_it_waits_for() -> None:
    stop = writestop.WriteStop(reason="r")
    ack = writestop.WriteStopAck
    state = writestop.StopState(
        stop,
        10,
        {
            "a": ack(node="a", stop_revision=10, in_flight=2),
            "b": ack(node="b", stop_revision=9, in_flight=0),
        },
    )
    reason = writestop.drained(state, ["a", "b", "c"])
    assert "a has 2 append(s) in flight" in reason
    assert "b has not acknowledged the stop" in reason, "an ack of an older stop is not this one"
    assert "c has not acknowledged the stop" in reason
    done = writestop.StopState(stop, 10, {"a": ack(node="a", stop_revision=10, in_flight=0)})
    assert writestop.drained(done, ["a"]) == ""
    assert writestop.drained(writestop.StopState(None, 0, {}), ["a"]) == "writes are not stopped"


async def test_producers_wait_while_writes_are_stopped_and_nothing_is_lost(
    cluster: Cluster,
) -> None:
    await serving(cluster, "node-a", "node-b")
    async with HeadraceClient(cluster.url, cluster.keys.cluster) as client:
        async with client.producer() as producer:
            before = [await producer.send(V, f"before-{i}".encode()) for i in range(20)]
        state = await writestop.stop_writes(cluster.metastore, cluster.keys, "upgrade to v2", "t")
        assert state.stop is not None and state.revision > 0
        await wait_drained(cluster, ["node-a", "node-b"])
        again = await writestop.stop_writes(cluster.metastore, cluster.keys, "another", "u")
        assert (again.revision, again.stop) == (state.revision, state.stop), "idempotent"

        async with client.producer(ProducerOptions(deadline=1.5)) as impatient:
            with pytest.raises(errors.WritesStopped) as refused:
                await impatient.send(V, b"refused")
        assert refused.value.retryable
        assert "writes stopped: upgrade in progress (upgrade to v2" in refused.value.message

        async with client.producer(ProducerOptions(deadline=60)) as patient:
            waiting = [
                asyncio.ensure_future(patient.send(V, f"during-{i}".encode())) for i in range(5)
            ]
            await asyncio.sleep(1.5)
            assert not any(w.done() for w in waiting), "producers wait, they do not fail fast"
            flush = await patient.send(V, b"", type=MessageType.FLUSH)
            assert isinstance(flush, AppendResult), "a flush request passes the stop"
            assert await writestop.resume_writes(cluster.metastore, cluster.keys)
            during = await asyncio.gather(*waiting)
        assert not await writestop.resume_writes(cluster.metastore, cluster.keys)
        assert (await stop_state(cluster)).acks == {}, "resume takes the acks with it"
        async with client.producer() as producer:
            after = [await producer.send(V, f"after-{i}".encode()) for i in range(5)]
    ids = [r.id for r in (*before, *during, *after)]
    assert len(set(ids)) == len(ids)
    payloads = await consumed(cluster, 20 + 5 + 5)
    assert payloads == [
        *(f"before-{i}".encode() for i in range(20)),
        *(f"during-{i}".encode() for i in range(5)),
        *(f"after-{i}".encode() for i in range(5)),
    ], "every acknowledged message once, in order; the refused one never"


async def test_an_append_in_flight_when_the_stop_arrives_finishes_and_is_reported(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    (node,) = await serving(cluster, "node-a")
    service = node.producer_service
    assert service is not None
    release = asyncio.Event()
    original = service._append_messages

    async def held(
        pchannel: str, messages: list[Message]
    ) -> Sequence[AppendResult | errors.HeadraceError]:
        await release.wait()
        return await original(pchannel, messages)

    monkeypatch.setattr(service, "_append_messages", held)
    async with (
        HeadraceClient(cluster.url, cluster.keys.cluster) as client,
        client.producer() as producer,
    ):
        sending = asyncio.ensure_future(producer.send(V, b"in-flight"))
        await until(lambda: node.write_gate.in_flight == 1)
        await writestop.stop_writes(cluster.metastore, cluster.keys, "upgrade", "t")
        reason = await wait_drained(cluster, ["node-a"], "node-a has 1 append(s) in flight")
        assert reason == "node-a has 1 append(s) in flight"
        report = await status(cluster.url, cluster.keys.cluster)
        writes = report["writes"]
        assert isinstance(writes, dict) and writes["stopped"] is True
        assert writes["nodes"] == {"node-a": {"acknowledged": True, "in_flight": 1}}
        release.set()
        result = await sending
        assert isinstance(result, AppendResult), "admitted before the stop: it finishes"
        await wait_drained(cluster, ["node-a"])
        await writestop.resume_writes(cluster.metastore, cluster.keys)
    assert await consumed(cluster, 1) == [b"in-flight"]


async def test_a_node_started_while_writes_are_stopped_obeys_at_once(cluster: Cluster) -> None:
    await cluster.configure([P])
    await writestop.stop_writes(cluster.metastore, cluster.keys, "offline upgrade", "t")
    await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    await wait_drained(cluster, ["node-a"])
    async with (
        HeadraceClient(cluster.url, cluster.keys.cluster) as client,
        client.producer(ProducerOptions(deadline=1.0)) as producer,
    ):
        with pytest.raises(errors.WritesStopped):
            await producer.send(V, b"x")


def run_cli(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli_main(argv)
    return code, out.getvalue()


async def in_thread(call: Callable[[], tuple[int, str]]) -> tuple[int, str]:
    return await asyncio.to_thread(call)


async def test_the_cli_stops_shows_and_resumes_writes(cluster: Cluster) -> None:
    await serving(cluster, "node-a")
    where = ["--metastore", cluster.url, "--cluster", cluster.keys.cluster]
    code, _ = await in_thread(lambda: run_cli(["writes", "stop", *where]))
    assert code == 2, "a stop needs a reason"
    assert (await stop_state(cluster)).stop is None, "and nothing was stopped"
    code, out = await in_thread(lambda: run_cli(["writes", "stop", *where, "--reason", "maint"]))
    assert code == 0 and "STOPPED by cli: maint" in out
    await wait_drained(cluster, ["node-a"])
    code, out = await in_thread(lambda: run_cli(["writes", "status", *where, "--json"]))
    report = json.loads(out)
    assert report["stopped"] and report["reason"] == "maint" and report["drained"] == ""
    assert report["nodes"]["node-a"] == {"acknowledged": True, "in_flight": 0}
    code, out = await in_thread(lambda: run_cli(["status", *where]))
    assert code == 0 and "writes: STOPPED by cli: maint (every node obeys it" in out
    code, out = await in_thread(lambda: run_cli(["writes", "resume", *where]))
    assert code == 0 and out.strip() == "writes: flowing"
    code, out = await in_thread(lambda: run_cli(["status", *where]))
    assert "writes: flowing" in out

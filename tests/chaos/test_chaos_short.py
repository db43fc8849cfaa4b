"""Chaos mode: the checks themselves, then a short run on real node processes."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import grpc
import pytest

from headrace import errors
from headrace.bench import chaos
from headrace.bench.procs import ClusterSpec, backend_args, node_command
from headrace.cli.main import build_parser
from headrace.client import HeadraceClient
from headrace.client import errors as client_errors
from headrace.message.ids import MessageID
from headrace.message.types import LogEntry, Message, MessageType
from headrace.proto import rpc
from headrace.wal.local.message_id import LocalMessageID
from tests.chaos.checks import assert_clean
from tests.node.harness import make_cluster


def _entry(lsn: int, kind: MessageType, term: int, tick: int, payload: bytes = b"") -> LogEntry:
    mid: MessageID = LocalMessageID(lsn)
    vchannel = "" if kind.is_system else "v"
    return LogEntry(mid, Message(kind, vchannel, payload, timetick=tick, term=term))


def test_parse_seq_accepts_only_the_vchannels_numbered_payloads() -> None:
    assert chaos.parse_seq(b"chaos-v1:42", "chaos-v1") == 42
    assert chaos.parse_seq(b"chaos-v2:42", "chaos-v1") is None
    assert chaos.parse_seq(b"chaos-v1:x", "chaos-v1") is None
    assert chaos.parse_seq(b"42", "chaos-v1") is None


def test_check_delivery_counts_lost_duplicated_and_reordered() -> None:
    acked = {"a": [1, 2, 3, 4], "b": [1, 2]}
    consumed = {"a": [1, 3, 2, 3, 5], "b": [1, 2]}
    found = chaos.check_delivery(acked, consumed)
    # 4 never arrives, 3 arrives twice, 2 arrives after 3, 5 was never acknowledged.
    assert found == {"lost": 1, "duplicates": 1, "reordered": 1, "consumed_unacked": 1}
    clean = chaos.check_delivery(acked, {"a": [1, 2, 3, 4], "b": [1, 2]})
    assert clean == {"lost": 0, "duplicates": 0, "reordered": 0, "consumed_unacked": 0}


def test_audit_log_finds_stale_terms_and_timetick_regressions() -> None:
    clean = [
        _entry(1, MessageType.FENCE, 1, 10),
        _entry(2, MessageType.INSERT, 1, 11, b"v:1"),
        _entry(3, MessageType.FENCE, 2, 12),
        _entry(4, MessageType.INSERT, 2, 13, b"v:2"),
    ]
    assert chaos.audit_log(clean) == {"stale_term_appends": 0, "timetick_regressions": 0}
    bad = [
        *clean,
        _entry(5, MessageType.INSERT, 1, 14, b"v:3"),  # term 1 after the fence of term 2
        _entry(6, MessageType.FENCE, 1, 15),  # a fence of a lower term
        _entry(7, MessageType.INSERT, 2, 15, b"v:4"),  # same timetick as the previous record
        _entry(8, MessageType.TIME_TICK, 2, 9),  # backwards
    ]
    assert chaos.audit_log(bad) == {"stale_term_appends": 2, "timetick_regressions": 2}
    assert chaos.seqs_in_log(bad, ["v"]) == {"v": [1, 2, 3, 4]}


def test_producer_stats_measure_the_longest_unanswered_stretch() -> None:
    stats = chaos.ProducerStats("v")
    stats.on_send(2, now=10.0)
    stats.on_outcome(1, object(), now=10.5)
    # The last outstanding message fails: unanswered from the ack at 10.5 to 14.0.
    stats.on_outcome(2, errors.Unavailable("gone"), now=14.0)
    assert stats.max_gap_s == pytest.approx(3.5)
    stats.on_send(1, now=20.0)
    stats.on_outcome(3, object(), now=21.0)
    stats.on_send(1, now=30.0)
    stats.finish(now=36.0)  # still outstanding at the end
    assert stats.acked == [1, 3]
    assert dict(stats.failed) == {"UNAVAILABLE": 1}
    assert stats.max_gap_s == pytest.approx(6.0)
    assert stats.max_gap_at == (30.0, 36.0)


def test_violations_names_the_nonzero_invariants() -> None:
    result = dict.fromkeys(chaos.INVARIANTS, 0)
    assert chaos.violations(result) == {}
    result["reordered"] = 3
    assert chaos.violations(result) == {"reordered": 3}


def test_node_command_carries_the_backend_settings(tmp_path: Path) -> None:
    spec = ClusterSpec(root=tmp_path, lease_ttl_s=1.5)
    command = node_command(spec, "node-7")
    assert command[command.index("--wal-dir") + 1] == str((tmp_path / "wal").resolve())
    assert command[command.index("--lease-ttl") + 1] == "1.5"
    assert backend_args("kafka", {"bootstrap_servers": "127.0.0.1:9092"}) == [
        "--wal",
        "kafka",
        "--kafka-bootstrap",
        "127.0.0.1:9092",
    ]
    with pytest.raises(errors.InvalidArgument):
        backend_args("kafka", {"acks": "all"})
    with pytest.raises(errors.InvalidArgument):
        ClusterSpec(root=tmp_path, backend="pulsar", backend_settings={"root": "x"}).validate()


def test_cli_parses_the_chaos_and_handoff_benchmarks() -> None:
    parser = build_parser()
    args = parser.parse_args(["bench", "chaos", "--duration", "30", "--seed", "7", "--json"])
    assert (args.duration, args.seed, args.nodes, args.pchannels) == (30.0, 7, 3, 8)
    assert args.handler.__name__ == "chaos"
    args = parser.parse_args(["bench", "handoff", "--json"])
    assert (args.moves, args.failovers, args.lease_ttl) == (20, 5, 3.0)
    assert args.handler.__name__ == "handoff"


@pytest.mark.slow
@pytest.mark.timeout(150)
async def test_short_chaos_loses_duplicates_and_reorders_nothing(tmp_path: Path) -> None:
    assert_clean(await chaos.run_chaos(tmp_path, 22.0, seed=20261122))


def test_a_transport_internal_error_is_retried() -> None:
    """Found by chaos: a node killed mid-stream can end the call with gRPC's own
    INTERNAL status (no Headrace details); the producer must retry, not fail."""
    status = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        "Internal error from Core",
        None,
    )
    error = client_errors.from_rpc_error(status, "127.0.0.1:1")
    assert isinstance(error, errors.Unavailable) and error.retryable


class _EndedAfterOpen:
    """A Produce call whose peer goes away right after the stream opened."""

    def __init__(self, call: Any) -> None:
        self._call = call
        self._writes = 0

    async def write(self, request: Any) -> None:
        self._writes += 1
        if self._writes > 1:
            raise asyncio.InvalidStateError("RPC already finished.")
        await self._call.write(request)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._call, name)


async def test_a_write_racing_the_end_of_the_call_is_retried(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by chaos: grpc raises InvalidStateError when a write comes after
    the call ended but before the receiver saw the status; the lane must
    retry the message on a new stream, not fail it."""
    real_stub = rpc.producer_stub
    broken: list[_EndedAfterOpen] = []

    class _Stub:
        def __init__(self, channel: Any) -> None:
            self._stub = real_stub(channel)

        def Produce(self) -> Any:
            call = self._stub.Produce()
            if broken:
                return call
            broken.append(_EndedAfterOpen(call))
            return broken[0]

    monkeypatch.setattr(rpc, "producer_stub", _Stub)
    async with contextlib.aclosing(make_cluster(tmp_path)) as clusters:
        cluster = await anext(clusters)
        await cluster.configure(["pchannel-000"])
        await cluster.start_node("node-a")
        await cluster.assign("pchannel-000", "node-a", 1)
        async with HeadraceClient(cluster.url, "test") as client:
            producer = client.producer()
            async with producer, asyncio.timeout(20):
                result = await producer.send("v", b"v:1")
        assert result.term == 1 and len(broken) == 1

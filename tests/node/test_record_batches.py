"""The Produce stream with record batches (message format 2): the node tells
the format it writes, passes batches to the WAL without decoding them, and
answers one RecordBatchResult per batch; refusals per batch."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from headrace import errors
from headrace.cluster import NEW_CLUSTER_ROUTING, ClusterConfig, ClusterFormat, route
from headrace.coordinator import writestop
from headrace.message import batch
from headrace.message.batch import BatchInfo
from headrace.message.formats import FormatSupport
from headrace.message.types import Message, MessageType
from headrace.node import convert
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from tests.node.harness import HANG_GUARD, Cluster, until

P = "pchannel-000"
BATCHES = FormatSupport.of(reads={1, 2}, writes={1, 2})


async def node_channel(cluster: Cluster, cluster_format: int) -> grpc.aio.Channel:
    await cluster.configure([P])
    await cluster.metastore.put(
        cluster.keys.format, ClusterFormat(version=cluster_format).to_json()
    )
    node = await cluster.start_node("node-a", formats=BATCHES)
    await cluster.assign(P, "node-a", 1)
    return grpc.aio.insecure_channel(node.address)


@pytest.fixture
async def format_2(cluster: Cluster) -> AsyncIterator[grpc.aio.Channel]:
    async with await node_channel(cluster, 2) as channel:
        yield channel


def record_batch(vchannel: str, *payloads: bytes, sequence: int = 0) -> bytes:
    msgs = [Message(MessageType.INSERT, vchannel, p) for p in payloads]
    return batch.encode(
        msgs, BatchInfo(vchannel, producer_id=9 if sequence else 0, sequence=sequence)
    )


async def produce(
    channel: grpc.aio.Channel, requests: Sequence[pb.ProduceBatch]
) -> tuple[pb.ProducerOpened, list[pb.BatchResult]]:
    call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
    await call.write(pb.ProduceRequest(open=pb.OpenProducer(pchannel=P)))
    opened = await call.read()
    assert isinstance(opened, pb.ProduceResponse)
    for request in requests:
        await call.write(pb.ProduceRequest(batch=request))
    results = []
    for _ in requests:
        response = await call.read()
        assert isinstance(response, pb.ProduceResponse)
        results.append(response.batch)
    await call.done_writing()
    return opened.opened, results


async def two_pchannels(cluster: Cluster, names: int) -> tuple[list[str], str]:
    """Configure node-a with two pchannels; of the first ``names`` vchannel
    names ``v<i>``, those that route to :data:`P` and one that does not."""
    pchannels = [P, "pchannel-001"]
    await cluster.configure(pchannels)
    node = cluster.nodes["node-a"]
    assert node.manager is not None
    directory = node.manager.directory
    await until(lambda: directory.config is not None and len(directory.config.pchannels) == 2)
    here = [f"v{i}" for i in range(names) if route(f"v{i}", pchannels, NEW_CLUSTER_ROUTING) == P]
    return here, next(f"v{i}" for i in range(names) if f"v{i}" not in here)


async def test_the_stream_says_the_format_and_takes_record_batches(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    opened, (result,) = await produce(
        format_2,
        [pb.ProduceBatch(batch_id=1, record_batches=[record_batch("v", b"a"), b"junk"])],
    )
    assert opened.message_format == 2 and opened.max_batch_bytes > opened.max_message_bytes
    assert result.batch_id == 1 and not result.results
    good, bad = result.batch_results
    assert not good.HasField("error") and good.count == 1 and good.term == 1
    assert bad.error.code == "INVALID_ARGUMENT" and "malformed record batch" in bad.error.message
    stored = [batch.read_header(r) for r in cluster.store.channels[P].records]
    assert [h.count for h in stored if not h.system] == [1]
    assert str(good.id).startswith("memory:")


async def test_a_format_1_owner_says_so_and_refuses_record_batches(cluster: Cluster) -> None:
    async with await node_channel(cluster, 1) as channel:
        opened, (result,) = await produce(
            channel, [pb.ProduceBatch(batch_id=1, record_batches=[record_batch("v", b"a")])]
        )
    assert opened.message_format == 1
    (refused,) = result.batch_results
    assert refused.error.code == "INVALID_ARGUMENT"
    assert "writes message format 1, not record batches (message format 2)" in (
        refused.error.message
    )


async def test_a_request_with_messages_and_record_batches_is_refused_whole(
    format_2: grpc.aio.Channel,
) -> None:
    mixed = pb.ProduceBatch(
        batch_id=1,
        messages=[pb.ProduceMessage(type=MessageType.INSERT, vchannel="v", payload=b"m")],
        record_batches=[record_batch("v", b"a")],
    )
    _opened, (result,) = await produce(format_2, [mixed])
    assert [r.error.code for r in result.batch_results] == ["INVALID_ARGUMENT"]
    assert [r.error.code for r in result.results] == ["INVALID_ARGUMENT"]
    assert "not both" in result.results[0].error.message


async def test_a_record_batch_of_another_pchannel_is_refused(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    here, other = await two_pchannels(cluster, 100)
    mine = here[0]
    _opened, (result,) = await produce(
        format_2,
        [
            pb.ProduceBatch(
                batch_id=1, record_batches=[record_batch(mine, b"ok"), record_batch(other, b"no")]
            )
        ],
    )
    ok, misrouted = result.batch_results
    assert not ok.HasField("error")
    assert misrouted.error.code == "INVALID_ARGUMENT" and "pchannel-001" in misrouted.error.message


async def test_a_write_stop_refuses_record_batches_unless_all_their_messages_pass(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    await writestop.stop_writes(cluster.metastore, cluster.keys, "upgrade")
    gate = cluster.nodes["node-a"].write_gate
    await until(lambda: gate.observed.stop is not None)
    flush = batch.encode([Message(MessageType.FLUSH, "v")], BatchInfo("v"))
    _opened, (result,) = await produce(
        format_2, [pb.ProduceBatch(batch_id=1, record_batches=[record_batch("v", b"x"), flush])]
    )
    data, passing = result.batch_results
    assert data.error.code == "WRITES_STOPPED" and data.error.retryable
    assert not passing.HasField("error")


async def test_a_retried_record_batch_is_answered_with_its_first_result(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    sent = record_batch("v", b"once", sequence=1)
    _opened, (first, again) = await produce(
        format_2,
        [
            pb.ProduceBatch(batch_id=1, record_batches=[sent]),
            pb.ProduceBatch(batch_id=2, record_batches=[sent]),
        ],
    )
    assert first.batch_results[0] == again.batch_results[0]
    stored = [batch.read_header(r) for r in cluster.store.channels[P].records]
    assert [h.sequence for h in stored if not h.system] == [1]


async def test_a_vchannel_accepted_under_one_config_is_refused_once_it_routes_elsewhere(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    """The node remembers the vchannels it routed per cluster config: a new
    config routes them again (one request before, one after the change)."""
    node = cluster.nodes["node-a"]
    assert node.manager is not None
    directory = node.manager.directory
    wider = [P, "pchannel-001"]
    moved = next(f"v{i}" for i in range(100) if route(f"v{i}", wider, NEW_CLUSTER_ROUTING) != P)
    _opened, (before,) = await produce(
        format_2, [pb.ProduceBatch(batch_id=1, record_batches=[record_batch(moved, b"a")] * 2)]
    )
    assert [r.HasField("error") for r in before.batch_results] == [False, False]
    await cluster.configure(wider)
    await until(lambda: directory.config is not None and len(directory.config.pchannels) == 2)
    _opened, (after,) = await produce(
        format_2, [pb.ProduceBatch(batch_id=2, record_batches=[record_batch(moved, b"b")] * 2)]
    )
    for result in after.batch_results:
        assert result.error.code == "INVALID_ARGUMENT" and "pchannel-001" in result.error.message


def test_a_malformed_batch_of_a_good_vchannel_goes_on_and_a_bad_name_is_refused_each_time() -> None:
    """The admission passes a batch whose vchannel field holds a name it found
    good without reading the header (the WAL refuses it if malformed, saying
    why); a name it refused is refused again, never remembered as good."""
    pchannels = [P, "pchannel-001"]
    config = ClusterConfig(pchannels=pchannels, routing=NEW_CLUSTER_ROUTING)
    admission = convert.Admission(P, config)
    mine = next(f"v{i}" for i in range(100) if route(f"v{i}", pchannels, NEW_CLUSTER_ROUTING) == P)
    other = next(f"v{i}" for i in range(100) if route(f"v{i}", pchannels, NEW_CLUSTER_ROUTING) != P)
    assert admission.record_batch(record_batch(mine, b"a")) is None
    damaged = bytearray(record_batch(mine, b"a"))
    damaged[2] = 9  # the format version
    assert admission.record_batch(bytes(damaged)) is None
    for _ in range(2):
        refusal = admission.record_batch(record_batch(other, b"a"))
        assert isinstance(refusal, errors.InvalidArgument) and "pchannel-001" in refusal.message
    for _ in range(2):
        refusal = admission.record_batch(record_batch("bad name", b"a"))
        assert isinstance(refusal, errors.InvalidArgument)


async def test_a_spread_request_fails_only_its_bad_batches_and_stores_the_rest_in_order(
    cluster: Cluster, format_2: grpc.aio.Channel
) -> None:
    """Requests of one-message batches over many vchannels (a call spread
    over them), once before and once after the node knows every vchannel:
    a misrouted, a malformed, a stamped and a TIME_TICK batch in the middle
    get their own errors, in their places; the others are stored, in order,
    and a retry of the whole request is answered with the first results."""
    mine, other = await two_pchannels(cluster, 200)
    stamped = bytearray(record_batch(mine[0], b"stamped", sequence=900))
    batch.stamp(stamped, 5, 1)
    system = batch.encode(
        [Message(MessageType.TIME_TICK, mine[1])], BatchInfo(mine[1], 9, sequence=901)
    )

    def request(batch_id: int, first: int) -> pb.ProduceBatch:
        good = [record_batch(v, v.encode(), sequence=first + i) for i, v in enumerate(mine[:40])]
        bad = [record_batch(other, b"no", sequence=first + 99), b"junk", bytes(stamped), system]
        return pb.ProduceBatch(batch_id=batch_id, record_batches=[*good[:10], *bad, *good[10:]])

    sent = [request(1, 1000), request(2, 2000)]
    _opened, results = await produce(format_2, [*sent, sent[1]])
    for result in results:
        codes = [r.error.code if r.HasField("error") else "" for r in result.batch_results]
        assert codes == [""] * 10 + ["INVALID_ARGUMENT"] * 4 + [""] * 30
        errors_at = [r.error.message for r in result.batch_results[10:14]]
        assert "pchannel-001" in errors_at[0] and "malformed record batch" in errors_at[1]
        assert "timetick and term 0" in errors_at[2] and "by the WAL itself" in errors_at[3]
    assert results[2].batch_results == results[1].batch_results, "the retry: first results"
    stored = [batch.read_header(r) for r in cluster.store.channels[P].records]
    data = [h for h in stored if not h.system]
    assert [(h.vchannel, h.sequence) for h in data] == [
        (v, first + i) for first in (1000, 2000) for i, v in enumerate(mine[:40])
    ]

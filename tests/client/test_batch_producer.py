"""A producer against nodes writing message format 2: record batches on the
wire and in the log, deduplicated per batch over retries and an owner change.

What was delivered is read from the log itself (the memory backend's records,
decoded as batches): every acknowledged message is stored exactly once, in
order per vchannel. Batches of several messages need message ids with an
index (``MessageID.with_index``); those cases are skipped until ids have it.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Sequence

import pytest

from headrace import errors
from headrace.client import HeadraceClient, ProducerOptions
from headrace.client import api as client_api
from headrace.client.producer import batch_producer_id
from headrace.cluster import AssignmentState
from headrace.message import batch
from headrace.message.formats import FormatSupport
from headrace.message.types import Message, MessageType
from headrace.node.errors import to_proto
from headrace.proto import streaming_pb2 as pb
from headrace.wal.api import AppendResult
from tests.node.harness import HANG_GUARD, Cluster, until

P = "pchannel-000"
VCHANNELS = ["a", "b", "c"]
BATCHES = FormatSupport.of(reads={1, 2}, writes={1, 2})
"""A release writing record batches (injected: RELEASE_FORMATS does not yet)."""
PER_REQUEST = [1, 16]
"""Messages a producer puts in one request (1: every record batch holds one)."""


async def format_2_pair(cluster: Cluster) -> None:
    """``P`` served by node-a at term 1 in a cluster switched to format 2, with
    node-b running idle; both write format 2."""
    await cluster.configure([P])
    await cluster.start_node("node-a", formats=BATCHES)
    await cluster.start_node("node-b", formats=BATCHES)
    switched = await client_api.set_message_format(cluster.url, 2, cluster=cluster.keys.cluster)
    assert switched["message_format"] == 2, switched
    await cluster.assign(P, "node-a", 1)


def logged(cluster: Cluster) -> list[tuple[bytes, batch.BatchHeader, list[Message]]]:
    """Every record of ``P`` that producers wrote: its bytes, header and messages."""
    out = []
    for data in cluster.store.channels[P].records:
        assert batch.is_batch(data), "a format 2 log holds record batches only"
        header = batch.verify(data)
        if not header.system:
            out.append((data, header, batch.messages(data, header)))
    return out


def delivered(cluster: Cluster, vchannel: str) -> list[int]:
    return [
        int(m.payload)
        for _data, header, msgs in logged(cluster)
        if header.vchannel == vchannel
        for m in msgs
    ]


@pytest.mark.parametrize("per_request", PER_REQUEST)
async def test_a_producer_sends_record_batches_to_a_format_2_owner(
    cluster: Cluster, per_request: int
) -> None:
    await format_2_pair(cluster)
    options = ProducerOptions(max_batch_messages=per_request, producer_id="orders-writer")
    async with (
        HeadraceClient(cluster.url, "test") as client,
        client.producer(options) as producer,
    ):
        outcomes = await producer.send_many(
            [Message(MessageType.INSERT, VCHANNELS[i % 3], str(i).encode()) for i in range(60)]
        )
        assert producer.batch_producer_id == batch_producer_id("orders-writer")
    results = [o for o in outcomes if isinstance(o, AppendResult)]
    assert len(results) == 60, outcomes
    for vchannel in VCHANNELS:
        assert delivered(cluster, vchannel) == list(range(VCHANNELS.index(vchannel), 60, 3))
    records = logged(cluster)
    assert all(h.producer_id == batch_producer_id("orders-writer") for _d, h, _m in records), (
        "every batch carries the producer's batch id"
    )
    sequences = [h.sequence for _d, h, _m in records]
    assert len(set(sequences)) == len(sequences), "one sequence per batch"
    assert all(not m.properties for _d, _h, msgs in records for m in msgs), (
        "no per-message dedup properties in format 2"
    )
    by_record = collections.defaultdict(list)
    for r in results:
        by_record[r.id.record_id()].append(r)
    sizes = sorted(h.count for _d, h, _m in records)
    assert sorted(len(rs) for rs in by_record.values()) == sizes, "one record per batch"
    for rs in by_record.values():
        rs.sort(key=lambda r: r.id)
        assert [r.timetick - rs[0].timetick for r in rs] == list(range(len(rs))), (
            "a batch's messages have consecutive timeticks"
        )
    if per_request > 1:
        assert max(sizes) > 1, "messages of one vchannel ride in one batch"


async def test_messages_that_go_alone_get_their_own_batch(cluster: Cluster) -> None:
    await format_2_pair(cluster)
    async with (
        HeadraceClient(cluster.url, "test") as client,
        client.producer(ProducerOptions(max_batch_messages=1)) as producer,
    ):
        begun = await producer.send("a", b"", type=MessageType.BEGIN_TXN)
        body = await producer.send("a", b"1", txn_id=begun.txn_id)
        committed = await producer.send("a", b"", type=MessageType.COMMIT_TXN, txn_id=begun.txn_id)
        assert begun.timetick < body.timetick < committed.timetick
        with pytest.raises(errors.TxnAborted):
            await producer.send("a", b"2", txn_id=begun.txn_id)
    kinds = [(h.txn_id, [m.type for m in msgs]) for _d, h, msgs in logged(cluster)]
    txn = begun.txn_id
    assert kinds == [
        (txn, [MessageType.BEGIN_TXN]),
        (txn, [MessageType.INSERT]),
        (txn, [MessageType.COMMIT_TXN]),
    ]


async def produce_until(
    client: HeadraceClient,
    stop: asyncio.Event,
    acked: dict[str, list[int]],
    per_request: int,
) -> None:
    """Send numbered messages round-robin over VCHANNELS until ``stop``."""
    options = ProducerOptions(
        max_batch_messages=per_request, max_inflight_batches=4, deadline=HANG_GUARD
    )
    async with client.producer(options) as producer:
        seq = 0
        while not stop.is_set():
            sends = []
            for _ in range(8):
                vchannel = VCHANNELS[seq % 3]
                sends.append((vchannel, seq, producer.send(vchannel, str(seq).encode())))
                seq += 1
            outcomes = await asyncio.gather(*(s for _, _, s in sends))
            for (vchannel, number, _), result in zip(sends, outcomes, strict=True):
                assert isinstance(result, AppendResult)
                acked[vchannel].append(number)


@pytest.mark.parametrize("per_request", PER_REQUEST)
async def test_a_move_under_load_stores_every_acknowledged_message_once(
    cluster: Cluster, per_request: int
) -> None:
    """Batches in flight when the owner changes are resent as the same bytes
    to the new owner, whose dedup window, rebuilt from the batch headers in
    the log, answers those the old owner wrote."""
    await format_2_pair(cluster)
    acked: dict[str, list[int]] = collections.defaultdict(list)
    stop = asyncio.Event()
    async with HeadraceClient(cluster.url, "test") as client:
        producing = asyncio.create_task(produce_until(client, stop, acked, per_request))
        await until(lambda: len(acked["a"]) >= 50)
        moved = await cluster.move(P, "node-b")
        assert moved.state is AssignmentState.ASSIGNED and moved.node == "node-b"
        before = len(acked["a"])
        await until(lambda: len(acked["a"]) >= before + 50)
        stop.set()
        async with asyncio.timeout(HANG_GUARD):
            await producing
    for vchannel in VCHANNELS:
        assert delivered(cluster, vchannel) == acked[vchannel], (
            f"{vchannel}: not exactly once in order"
        )
    assert {h.term for _d, h, _m in logged(cluster)} == {1, 2}


@pytest.mark.parametrize("per_request", PER_REQUEST)
async def test_a_batch_written_but_answered_as_failed_is_stored_once(
    cluster: Cluster, per_request: int
) -> None:
    """The owner wrote the first request's batches but answered them with a
    retryable error (as after a timeout): the producer resends the same bytes
    and the WAL's per-batch dedup answers with the first results."""
    await format_2_pair(cluster)
    service = cluster.nodes["node-a"].producer_service
    assert service is not None
    real = service.append
    lost: list[int] = []

    async def append(pchannel: str, batches: Sequence[pb.ProduceBatch]) -> list[pb.ProduceResponse]:
        responses = await real(pchannel, batches)
        if not lost:
            for response in responses:
                for result in response.batch.batch_results:
                    assert not result.HasField("error"), result
                    lost.append(result.count)
                    result.Clear()
                    result.error.CopyFrom(to_proto(errors.Unavailable("answer lost")))
        return responses

    service.append = append  # type: ignore[method-assign]
    async with (
        HeadraceClient(cluster.url, "test") as client,
        client.producer(ProducerOptions(max_batch_messages=per_request)) as producer,
    ):
        outcomes = await producer.send_many(
            [Message(MessageType.INSERT, VCHANNELS[i % 3], str(i).encode()) for i in range(30)]
        )
    assert all(isinstance(o, AppendResult) for o in outcomes), outcomes
    assert sum(lost) >= 1, "the first answer was lost"
    for vchannel in VCHANNELS:
        assert delivered(cluster, vchannel) == list(range(VCHANNELS.index(vchannel), 30, 3))


async def test_a_burst_of_up_to_1024_small_messages_is_one_record_batch(cluster: Cluster) -> None:
    """A producer's default request holds up to 1024 messages (within 1 MiB):
    a paced producer's burst of 500-700 messages of 1 KiB is one request, one
    record batch and one append, not a full request and a small one appended
    after it."""
    await format_2_pair(cluster)
    burst = [Message(MessageType.INSERT, "a", str(i).encode().ljust(1024)) for i in range(700)]
    async with HeadraceClient(cluster.url, "test") as client, client.producer() as producer:
        outcomes = await producer.send_many(burst)
    results = [o for o in outcomes if isinstance(o, AppendResult)]
    assert len(results) == 700, outcomes
    assert [h.count for _d, h, _m in logged(cluster)] == [700]
    assert len({r.id for r in results}) == 700 and len({r.id.record_id() for r in results}) == 1
    assert [int(m.payload) for _d, _h, msgs in logged(cluster) for m in msgs] == list(range(700))

"""A Produce stream appends in a task of its own while its writer sends the
responses of the appends before: in order, a bounded number ahead, stopped
with the stream, and an unexpected failure ends the stream as INTERNAL."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from headrace import errors
from headrace.guarded import cancel_and_settle
from headrace.node.services import Answer, Limits, ProducerService
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from tests.node.harness import HANG_GUARD, Cluster, error_details, until

P = "pchannel-000"


class _Appends:
    """A stand-in for the WAL behind ``ProducerService.append``: one response per batch."""

    def __init__(self) -> None:
        self.batch_ids: list[int] = []

    async def append(
        self, pchannel: str, batches: Sequence[pb.ProduceBatch]
    ) -> list[pb.ProduceResponse]:
        await asyncio.sleep(0)
        self.batch_ids += [b.batch_id for b in batches]
        return [pb.ProduceResponse(batch=pb.BatchResult(batch_id=b.batch_id)) for b in batches]


async def test_appends_go_on_a_bounded_number_ahead_of_the_sends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limits = Limits(produce_queue_batches=64, produce_answers_ahead=2)
    service = ProducerService.__new__(ProducerService)
    service.limits = limits
    appends = _Appends()
    monkeypatch.setattr(service, "append", appends.append)
    queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None] = asyncio.Queue(64)
    answers: asyncio.Queue[Answer] = asyncio.Queue(limits.produce_answers_ahead)
    task = asyncio.create_task(service._append_queued(P, queue, answers))
    try:
        for i in range(1, 11):
            queue.put_nowait(pb.ProduceBatch(batch_id=i))
            await asyncio.sleep(0.01)  # one append per batch
        # Nobody sends: two answers wait, the third append waits to hand its own.
        assert answers.full()
        assert appends.batch_ids == [1, 2, 3]
        queue.put_nowait(None)
        sent: list[int] = []
        async with asyncio.timeout(HANG_GUARD):
            while (answer := await answers.get()) is not None:
                assert isinstance(answer, list)
                sent += [r.batch.batch_id for r in answer]
            await task
        assert sent == list(range(1, 11)), "every response, in order"
    finally:
        await cancel_and_settle([task], what="the test's appender")


async def test_the_stream_error_comes_after_the_responses_before_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = ProducerService.__new__(ProducerService)
    service.limits = Limits()
    monkeypatch.setattr(service, "append", _Appends().append)
    queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None] = asyncio.Queue(8)
    answers: asyncio.Queue[Answer] = asyncio.Queue(8)
    queue.put_nowait(pb.ProduceBatch(batch_id=1))
    failure = errors.InvalidArgument("a Produce stream is opened only once")
    queue.put_nowait(failure)
    async with asyncio.timeout(HANG_GUARD):
        await service._append_queued(P, queue, answers)
    first, second = answers.get_nowait(), answers.get_nowait()
    assert isinstance(first, list) and [r.batch.batch_id for r in first] == [1]
    assert second is failure and answers.empty()


@pytest.fixture
async def channel(cluster: Cluster) -> AsyncIterator[grpc.aio.Channel]:
    node = await cluster.start_node("node-a")
    await cluster.assign(P, "node-a", 1)
    async with grpc.aio.insecure_channel(node.address) as ch:
        yield ch


async def opened_stream(channel: grpc.aio.Channel) -> grpc.aio.StreamStreamCall:
    call = rpc.producer_stub(channel).Produce(timeout=HANG_GUARD)
    await call.write(pb.ProduceRequest(open=pb.OpenProducer(pchannel=P)))
    assert isinstance(await call.read(), pb.ProduceResponse)
    await call.write(pb.ProduceRequest(batch=pb.ProduceBatch(batch_id=1, record_batches=[b"x"])))
    return call


def appender_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name() == f"produce-{P}"]


async def test_an_unexpected_append_failure_ends_the_stream_as_internal(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(self: ProducerService, pchannel: str, batches: object) -> list[object]:
        raise RuntimeError("a bug in the append path")

    monkeypatch.setattr(ProducerService, "append", broken)
    call = await opened_stream(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await call.read()
    assert caught.value.code() is grpc.StatusCode.INTERNAL
    details = error_details(caught.value)
    assert details["code"] == errors.ErrorCode.INTERNAL.value
    assert "RuntimeError: a bug in the append path" in details["message"]
    await until(lambda: not appender_tasks())


async def test_a_cancelled_stream_cancels_its_append(
    channel: grpc.aio.Channel, monkeypatch: pytest.MonkeyPatch
) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def stuck(self: ProducerService, pchannel: str, batches: object) -> list[object]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("unreachable")

    monkeypatch.setattr(ProducerService, "append", stuck)
    call = await opened_stream(channel)
    async with asyncio.timeout(HANG_GUARD):
        await started.wait()
        call.cancel()
        await cancelled.wait()
    await until(lambda: not appender_tasks())

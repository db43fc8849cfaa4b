"""gRPC servicers of a streaming node: Producer, Consumer, Manager.

The hot paths work on whole batches: the Producer service coalesces the
batches queued on a stream into one append call, and the Consumer service
packs up to a bounded number of messages and bytes into one response. Neither
waits for a response's send before its next step: a Produce stream appends in
a task while its writer sends the responses of earlier appends, a Consume
stream reads ahead while its previous response is sent
(:mod:`headrace.node.readahead`). Conversion between protos and messages lives
in :mod:`headrace.node.convert`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

import grpc

from headrace import errors
from headrace.cluster import Keys
from headrace.guarded import cancel_and_settle, guarded_task
from headrace.message.types import Message
from headrace.metastore.contract import Metastore
from headrace.node import convert
from headrace.node.assignments import read_assignment, refuse_close, refuse_open
from headrace.node.errors import abort, as_headrace, to_proto
from headrace.node.metrics import NodeMetrics
from headrace.node.readahead import Bounds, ConsumeStats, ReadAhead, Source
from headrace.node.walmanager import OpenFailure, WALManager
from headrace.node.writegate import WriteGate
from headrace.proto import rpc
from headrace.proto import streaming_pb2 as pb
from headrace.wal.api import AppendResult, BatchAppendResult, WALState
from headrace.wal.hosted import HostedWAL

T = TypeVar("T")

log = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Bounds of the node's per-stream buffering."""

    produce_queue_batches: int = 16
    """Batches read ahead from one Produce stream while an append runs."""
    produce_answers_ahead: int = 4
    """Appends of one Produce stream whose responses may wait for the stream's
    sends while the next append runs."""
    coalesce_messages: int = 4096
    """Most messages of queued batches appended in one call."""
    consume_batch_messages: int = 1024
    """Most messages in one Consume response (a record batch counts as its
    messages). With messages of 1 KiB the byte bound below binds first: the
    two batches a producer's 600-message burst makes go in one response,
    not the second after the first's send."""
    consume_batch_bytes: int = 1 << 20
    consume_poll_seconds: float = 0.5
    """How often an idle Consume stream checks that the WAL is still served."""


# ------------------------------------------------------------------ Producer

Answer = list[pb.ProduceResponse] | errors.HeadraceError | None
"""What a Produce stream's appender hands its writer: one append's responses,
the error that ends the stream, or None at its end."""


class ProducerService(rpc.ProducerServicer):
    def __init__(
        self,
        manager: WALManager,
        limits: Limits,
        *,
        metrics: NodeMetrics | None = None,
        gate: WriteGate | None = None,
    ) -> None:
        self.manager = manager
        self.limits = limits
        self.metrics = metrics
        self.gate = gate or WriteGate(manager.node_id)
        """The cluster-wide write stop: refuses producers' messages while it holds."""
        self._admissions: dict[str, convert.Admission] = {}

    def admission(self, pchannel: str) -> convert.Admission:
        """The admission of ``pchannel`` under the cluster config the node knows
        now: kept while that config holds, so each vchannel is checked and
        routed once per config, not once per request."""
        config = self.manager.directory.config
        admission = self._admissions.get(pchannel)
        if admission is None or admission.config is not config:
            admission = self._admissions[pchannel] = convert.Admission(pchannel, config)
        return admission

    async def Produce(
        self,
        request_iterator: AsyncIterator[pb.ProduceRequest],
        context: Context[pb.ProduceRequest, pb.ProduceResponse],
    ) -> AsyncIterator[pb.ProduceResponse]:
        first = await anext(aiter(request_iterator), None)
        if first is None:
            return
        try:
            opened = self._open(first)
        except errors.HeadraceError as exc:
            await abort(context, exc)
        yield pb.ProduceResponse(opened=opened)
        queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None] = asyncio.Queue(
            self.limits.produce_queue_batches
        )
        answers: asyncio.Queue[Answer] = asyncio.Queue(self.limits.produce_answers_ahead)
        reader = asyncio.create_task(_read_batches(request_iterator, queue))
        appender = guarded_task(
            self._append_queued(opened.pchannel, queue, answers),
            f"produce-{opened.pchannel}",
            lambda failure: answers.put(
                errors.HeadraceError(f"internal error: {failure.describe()}")
            ),
            finishable=True,
            logger=log,
        )
        try:
            while True:
                answer = await answers.get()
                if answer is None:
                    return
                if isinstance(answer, errors.HeadraceError):
                    await abort(context, answer)
                for response in answer:
                    yield response
        finally:
            await cancel_and_settle([reader, appender], what="ending a Produce stream", logger=log)

    async def _append_queued(
        self,
        pchannel: str,
        queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None],
        answers: asyncio.Queue[Answer],
    ) -> None:
        """Append the batches of one Produce stream as they come, handing each
        append's responses to the stream's writer: the next append runs while
        they are sent. Ends with the stream's error, or None at its end."""
        while True:
            batches, failure, done = await self._take(queue)
            if batches:
                await answers.put(await self.append(pchannel, batches))
            if failure is not None or done:
                await answers.put(failure)
                return

    def _open(self, first: pb.ProduceRequest) -> pb.ProducerOpened:
        if first.WhichOneof("request") != "open":
            raise errors.InvalidArgument("the first request of a Produce stream must be 'open'")
        pchannel = first.open.pchannel
        wal = self.manager.get(pchannel)
        term = wal.term
        if first.open.term > term:
            # The client knows a newer term than ours: we are stale.
            raise self.manager.not_owner(pchannel)
        return pb.ProducerOpened(
            pchannel=pchannel,
            term=term,
            node_id=self.manager.node_id,
            max_message_bytes=self.manager.options.max_message_bytes,
            message_format=wal.message_format,
            max_batch_bytes=wal.max_batch_bytes,
        )

    async def _take(
        self, queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None]
    ) -> tuple[list[pb.ProduceBatch], errors.HeadraceError | None, bool]:
        """Wait for one batch, then take whatever else is queued (bounded)."""
        item = await queue.get()
        batches: list[pb.ProduceBatch] = []
        count = 0
        while True:
            if item is None:
                return batches, None, True
            if isinstance(item, errors.HeadraceError):
                return batches, item, True
            batches.append(item)
            count += len(item.messages) + len(item.record_batches)
            if count >= self.limits.coalesce_messages or queue.empty():
                return batches, None, False
            item = queue.get_nowait()

    async def append(
        self, pchannel: str, batches: Sequence[pb.ProduceBatch]
    ) -> list[pb.ProduceResponse]:
        """Append what ``batches`` carry in order; one response per batch. Runs
        of requests carrying messages and of requests carrying record batches
        (message format 2) are appended in order, each run with one call."""
        responses: list[pb.ProduceResponse] = []
        start = 0
        while start < len(batches):
            records = bool(batches[start].record_batches)
            end = start + 1
            while end < len(batches) and bool(batches[end].record_batches) == records:
                end += 1
            run = batches[start:end]
            if records:
                responses += await self._append_record_batches(pchannel, run)
            else:
                responses += await self._append_message_run(pchannel, run)
            start = end
        return responses

    async def _append_record_batches(
        self, pchannel: str, requests: Sequence[pb.ProduceBatch]
    ) -> list[pb.ProduceResponse]:
        """Append the record batches of ``requests`` with one ``append_batches``
        (never decoded here: the header names the vchannel, the WAL checks the
        rest); one RecordBatchResult per record batch."""
        admission = self.admission(pchannel)
        gate = self.gate
        accepted: list[bytes] = []
        rejected: dict[int, errors.HeadraceError] = {}
        position = 0
        for request in requests:
            datas = request.record_batches
            refused = _batch_refusals(request, admission, gate)
            if refused:
                for at, data in enumerate(datas):
                    refusal = refused.get(at)
                    if refusal is None:
                        accepted.append(data)
                    else:
                        rejected[position + at] = refusal
            else:
                accepted += datas  # the common request: every batch goes on
            position += len(datas)
        started = time.perf_counter()
        with gate.appending(len(accepted)):
            outcomes = await self._append_batches(pchannel, accepted)
        outcomes = _with_refusals(outcomes, rejected, position)
        if self.metrics is not None:
            acked, failed = _tally(outcomes)
            self.metrics.appended(
                pchannel,
                # A refused batch counts as one failed message (it was not decoded).
                messages=acked + sum(failed.values()),
                size=sum(request.ByteSize() for request in requests),
                failed=failed,
                seconds=time.perf_counter() - started,
            )
        responses = []
        offset = 0
        for request in requests:
            size = len(request.record_batches)
            response = pb.ProduceResponse()
            result = response.batch
            result.batch_id = request.batch_id
            convert.fill_batch_results(
                result.batch_results, outcomes[offset : offset + size], to_proto
            )
            if request.messages:
                convert.fill_results(
                    result.results, [rejected[offset]] * len(request.messages), to_proto
                )
            offset += size
            responses.append(response)
        return responses

    async def _append_batches(
        self, pchannel: str, batches: list[bytes]
    ) -> Sequence[BatchAppendResult | errors.HeadraceError]:
        if not batches:
            return []
        return await self._answered(pchannel, len(batches), lambda wal: wal.append_batches(batches))

    async def _answered(
        self,
        pchannel: str,
        count: int,
        append: Callable[[HostedWAL], Awaitable[list[T | errors.HeadraceError]]],
    ) -> list[T | errors.HeadraceError]:
        """``append`` on the pchannel's WAL: one outcome per item, whatever it
        raises (a handler must answer every item), NotOwner naming the owner."""
        try:
            outcomes = await append(self.manager.get(pchannel))
        except errors.HeadraceError as exc:
            return [self._hinted(pchannel, exc)] * count
        except Exception as exc:
            return [as_headrace(exc)] * count
        hinted: errors.HeadraceError | None = None
        for i, outcome in enumerate(outcomes):
            if isinstance(outcome, errors.NotOwner):
                hinted = hinted or self._hinted(pchannel, outcome)
                outcomes[i] = hinted
        return outcomes

    async def _append_message_run(
        self, pchannel: str, batches: Sequence[pb.ProduceBatch]
    ) -> list[pb.ProduceResponse]:
        """Append the messages of ``batches`` in order; one response per batch."""
        admit = self.admission(pchannel).message
        messages: list[Message] = []
        rejected: dict[int, errors.HeadraceError] = {}
        position = 0
        gate = self.gate
        for batch in batches:
            for proto in batch.messages:
                try:
                    message = admit(proto)
                except errors.HeadraceError as exc:
                    rejected[position] = exc
                else:
                    stopped = gate.refusal_for(message.type)
                    if stopped is None:
                        messages.append(message)
                    else:
                        rejected[position] = stopped
                position += 1
        started = time.perf_counter()
        with gate.appending(len(messages)):
            outcomes = await self._append_messages(pchannel, messages)
        outcomes = _with_refusals(outcomes, rejected, position)
        if self.metrics is not None:
            self.metrics.appended(
                pchannel,
                messages=position,
                size=sum(batch.ByteSize() for batch in batches),
                failed=failed_codes(outcomes),
                seconds=time.perf_counter() - started,
            )
        responses = []
        offset = 0
        for batch in batches:
            size = len(batch.messages)
            response = pb.ProduceResponse()
            result = response.batch
            result.batch_id = batch.batch_id
            convert.fill_results(result.results, outcomes[offset : offset + size], to_proto)
            offset += size
            responses.append(response)
        return responses

    async def _append_messages(
        self, pchannel: str, messages: list[Message]
    ) -> Sequence[AppendResult | errors.HeadraceError]:
        if not messages:
            return []
        return await self._answered(pchannel, len(messages), lambda wal: wal.append_many(messages))

    def _hinted(self, pchannel: str, exc: errors.HeadraceError) -> errors.HeadraceError:
        """A NotOwner from the WAL becomes one naming the owner we know."""
        if isinstance(exc, errors.NotOwner) and not exc.owner:
            return self.manager.not_owner(pchannel)
        return exc


def _batch_refusals(
    request: pb.ProduceBatch, admission: convert.Admission, gate: WriteGate
) -> dict[int, errors.HeadraceError]:
    """Why the node itself refuses record batches of ``request``, by position
    (empty: all go on to the WAL): all of a request that also carries
    messages; else a batch whose vchannel is not admitted here, or that the
    write stop holds back."""
    datas = request.record_batches
    if request.messages:
        mixed = errors.InvalidArgument(
            "a ProduceBatch carries messages or record batches, not both; nothing of it was written"
        )
        return dict.fromkeys(range(len(datas)), mixed)
    refused: dict[int, errors.HeadraceError] = dict(admission.record_batches(datas))
    for at, refusal in gate.refusals_for_batches(datas).items():
        refused.setdefault(at, refusal)
    return refused


def _tally(
    outcomes: Sequence[BatchAppendResult | errors.HeadraceError],
) -> tuple[int, dict[str, int]]:
    """Messages acknowledged, and failed outcomes by error code (pure)."""
    acked = 0
    failed: dict[str, int] = {}
    for outcome in outcomes:
        if outcome.__class__ is BatchAppendResult:
            acked += outcome.count
        elif isinstance(outcome, errors.HeadraceError):
            code = outcome.code.value
            failed[code] = failed.get(code, 0) + 1
    return acked, failed


async def _read_batches(
    requests: AsyncIterator[pb.ProduceRequest],
    queue: asyncio.Queue[pb.ProduceBatch | errors.HeadraceError | None],
) -> None:
    """Move batches from the stream to ``queue``; None at the end."""
    try:
        async for request in requests:
            if request.WhichOneof("request") != "batch":
                await queue.put(errors.InvalidArgument("a Produce stream is opened only once"))
                return
            await queue.put(request.batch)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        await queue.put(errors.Unavailable(f"reading the Produce stream failed: {exc}"))
        return
    await queue.put(None)


# ------------------------------------------------------------------ Consumer


def _with_refusals(
    outcomes: Sequence[T | errors.HeadraceError],
    refused: dict[int, errors.HeadraceError],
    count: int,
) -> Sequence[T | errors.HeadraceError]:
    """The ``count`` outcomes of a request in order: ``refused[i]`` where the
    node refused item ``i`` itself, else the next of the WAL's ``outcomes``."""
    if not refused:
        return outcomes
    done = iter(outcomes)
    return [refused.get(i) or next(done) for i in range(count)]


def failed_codes(
    outcomes: Sequence[AppendResult | BatchAppendResult | errors.HeadraceError],
) -> dict[str, int]:
    """How many outcomes failed, by error code (pure)."""
    failed: dict[str, int] = {}
    for outcome in outcomes:
        if isinstance(outcome, errors.HeadraceError):
            code = outcome.code.value
            failed[code] = failed.get(code, 0) + 1
    return failed


class ConsumerService(rpc.ConsumerServicer):
    def __init__(
        self, manager: WALManager, limits: Limits, metrics: NodeMetrics | None = None
    ) -> None:
        self.manager = manager
        self.limits = limits
        self.metrics = metrics
        self.streams: dict[int, ConsumeStats] = {}
        self._ids = itertools.count(1)

    async def Consume(
        self,
        request: pb.ConsumeRequest,
        context: Context[pb.ConsumeRequest, pb.ConsumeResponse],
    ) -> AsyncIterator[pb.ConsumeResponse]:
        try:
            wal = self.manager.get(request.pchannel)
            scanner = wal.read(convert.read_options(request))
        except errors.HeadraceError as exc:
            await abort(context, exc)
        bounds = Bounds(
            min(
                request.max_batch_messages or self.limits.consume_batch_messages,
                self.limits.consume_batch_messages,
            ),
            min(
                request.max_batch_bytes or self.limits.consume_batch_bytes,
                self.limits.consume_batch_bytes,
            ),
            request.accept_batches,
        )
        stream_id = next(self._ids)
        stats = self.streams[stream_id] = ConsumeStats(request.pchannel)
        failure: errors.HeadraceError | None = None
        # The header names where "latest" resolved to: taken before anything is read.
        header = convert.consume_header(self.manager.node_id, wal.term, request, scanner)
        source = Source(scanner, self.limits.consume_poll_seconds, lambda: self._moved(wal))
        ahead = ReadAhead(source, bounds, stats)
        reader = guarded_task(
            ahead.run(),
            f"consume-{request.pchannel}-{stream_id}",
            ahead.failed,
            finishable=True,
            logger=log,
        )
        try:
            yield header
            while True:
                response, packed = await ahead.next_response()
                yield response
                stats.sent += packed.messages
                if self.metrics is not None:
                    self.metrics.consumed(
                        request.pchannel,
                        messages=packed.messages,
                        size=response.ByteSize(),
                        newest=packed.newest,
                        tail=wal.last_timetick,
                    )
        except errors.HeadraceError as exc:
            failure = exc
        finally:
            del self.streams[stream_id]
            await cancel_and_settle([reader], what="ending a Consume stream", logger=log)
            await scanner.close()
        if failure is not None:
            if isinstance(failure, errors.NotOwner | errors.Closed):
                failure = self.manager.not_owner(request.pchannel)
            await abort(context, failure)

    def _moved(self, wal: HostedWAL) -> errors.HeadraceError | None:
        """NotOwner once this node no longer serves ``wal`` (checked when a
        Consume stream's read waited in vain)."""
        if self.manager.held.get(wal.pchannel) is not wal:
            return errors.NotOwner(f"{wal.pchannel} moved away from this node")
        return None


# ------------------------------------------------------------------- Manager


class ManagerService(rpc.ManagerServicer):
    """Opens and closes WALs on request, only as the pchannel's assignment
    record says (read from the metastore at each call): see
    :func:`~headrace.node.assignments.refuse_open` and ``refuse_close``."""

    def __init__(self, manager: WALManager, metastore: Metastore, keys: Keys) -> None:
        self.manager = manager
        self.metastore = metastore
        self.keys = keys

    async def OpenWAL(
        self,
        request: pb.OpenWALRequest,
        context: Context[pb.OpenWALRequest, pb.OpenWALResponse],
    ) -> pb.OpenWALResponse:
        try:
            record = await read_assignment(self.metastore, self.keys, request.pchannel)
            refusal = refuse_open(request.pchannel, request.term, record, self.manager.node_id)
            if refusal is not None:
                raise refusal
            wal = await self.manager.open(request.pchannel, request.term)
        except Exception as exc:
            await abort(context, as_headrace(exc))
        return pb.OpenWALResponse(wal=convert.wal_info(wal))

    async def CloseWAL(
        self,
        request: pb.CloseWALRequest,
        context: Context[pb.CloseWALRequest, pb.CloseWALResponse],
    ) -> pb.CloseWALResponse:
        try:
            record = await read_assignment(self.metastore, self.keys, request.pchannel)
            refusal = refuse_close(
                request.pchannel,
                request.term,
                record,
                self.manager.node_id,
                self.manager.held_term(request.pchannel),
            )
            if refusal is not None:
                raise refusal
            # Only a WAL at the requested term or below: one opened meanwhile
            # under a newer record stays.
            await self.manager.close(request.pchannel, drain=True, below_term=request.term + 1)
        except Exception as exc:
            await abort(context, as_headrace(exc))
        return pb.CloseWALResponse()

    async def ListWALs(
        self,
        request: pb.ListWALsRequest,
        context: Context[pb.ListWALsRequest, pb.ListWALsResponse],
    ) -> pb.ListWALsResponse:
        held = self.manager.held
        infos = {name: convert.wal_info(wal) for name, wal in held.items()}
        for name, failure in self.manager.failures.items():
            if name not in held:
                infos[name] = failed_wal_info(failure)
        return pb.ListWALsResponse(
            node_id=self.manager.node_id, wals=[infos[name] for name in sorted(infos)]
        )


def failed_wal_info(failure: OpenFailure) -> pb.WALInfo:
    """A WAL this node should serve but could not open: UNAVAILABLE, with the error."""
    return pb.WALInfo(
        pchannel=failure.pchannel,
        term=failure.term,
        state=WALState.UNAVAILABLE.value,
        stats=failure.stats(),
    )
